"""``tests/fast_loop.py``: the ``server`` marker that the fast loop leaves out."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import fast_loop
from tests.conftest import InProcess


@pytest.mark.parametrize(
    "source",
    [
        "server = start_server(folder)",
        "with serving(folder) as server:",
        "done = subprocess.run([sys.executable, '-m', 'runtime'])",
        "server = grpc.aio.server()",
        "proc = await asyncio.create_subprocess_exec('redis-server')",
        "executor = WorkerExecutor(settings, 2)",
        "worker = WorkerProcess(settings, 1, on_exit)",
    ],
)
def test_code_that_starts_a_process_or_a_server_is_seen(source: str) -> None:
    assert fast_loop._starts_something(source)


@pytest.mark.parametrize(
    "source",
    ["client = httpx.AsyncClient(transport=httpx.ASGITransport(app))", "await plane.infer('echo', request)"],
)
def test_in_process_code_is_not(source: str) -> None:
    assert not fast_loop._starts_something(source)


async def test_a_test_on_the_in_process_app_is_in_the_fast_loop(
    request: pytest.FixtureRequest, inprocess: InProcess
) -> None:
    assert not fast_loop.needs_more_than_this_process(request.node)
    assert request.node.get_closest_marker("server") is None


def test_a_test_whose_fixture_starts_a_server_is_left_out(request: pytest.FixtureRequest) -> None:
    """The marker follows fixtures: ``example_server`` (a session fixture) starts a real server."""
    definitions = request.session._fixturemanager.getfixturedefs("example_server", request.node)
    assert definitions
    assert fast_loop._starts_something(fast_loop._source(definitions[-1].func))


def _starts_a_process() -> None:
    subprocess.run([sys.executable, "--version"], check=True)


def _calls_a_helper_that_starts_one() -> None:
    _starts_a_process()


def _stays_in_this_process() -> int:
    return len(str(_in_process_value()))


def _in_process_value() -> int:
    return 1


def test_the_suites_helpers_are_followed() -> None:
    """A test that starts its server through a helper of the suite is left out as well."""
    assert fast_loop._starts(_calls_a_helper_that_starts_one)
    assert not fast_loop._starts(_stays_in_this_process)
