"""The worker process's side (``runtime.server.worker``): a ``Worker`` serving one model over one
socket, run in this event loop and driven from the other end of a socket pair by a real
``Connection`` as the server drives it: it loads the model it is sent and answers ``ready`` with
its pid (or ``failed`` and ends with 1), answers calls with the model's response or its error,
runs sequence steps on the state of the previous step, and drains, unloads and ends with 0 on
``stop`` (or when the server's end closes)."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from runtime.server.worker import Worker
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, RequestInput
from runtime.workers.connection import Connection

pytestmark = pytest.mark.anyio


class Server:
    """The server's end: a real ``Connection``, each message it gets in a queue."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        self.lost = asyncio.Event()
        self.conn = Connection(self.messages.put_nowait, self.lost.set)

    async def next(self) -> tuple[str, int, Any]:
        return await asyncio.wait_for(self.messages.get(), 30)

    def init(self, settings: ModelSettings) -> None:
        self.conn.send(("init", 0, (list(sys.path), pickle.dumps(settings, protocol=5), 1)))


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Server, asyncio.Task[int]]]:
    ours, theirs = socket.socketpair()
    server = Server()
    loop = asyncio.get_running_loop()
    await loop.connect_accepted_socket(lambda: server.conn, ours)
    run = asyncio.create_task(Worker(theirs).run())
    yield server, run
    if not run.done():
        server.conn.close()
    assert await asyncio.wait_for(run, 30) in (0, 1)


def _request(*values: int) -> InferenceRequest:
    data = np.array(values, dtype=np.int64)
    return InferenceRequest(inputs=[RequestInput(name="x", shape=[len(values)], datatype="INT64", data=data)])


async def test_it_loads_answers_calls_and_stops(pair: tuple[Server, asyncio.Task[int]]) -> None:
    server, run = pair
    server.init(ModelSettings(name="echo", implementation="tests.worker_models.Echo"))
    assert await server.next() == ("ready", 0, os.getpid())  # this process runs it here
    server.conn.send(("call", 7, _request(4, 5)))
    kind, ident, response = await server.next()
    assert (kind, ident) == ("ok", 7)
    assert response.model_name == "echo"
    assert np.array_equal(np.asarray(response.outputs[0].data), [4, 5])
    server.conn.send(("stop", 0, None))
    assert await server.next() == ("stopped", 0, None)
    assert await asyncio.wait_for(run, 30) == 0


async def test_a_model_error_comes_back_for_its_call_alone(pair: tuple[Server, asyncio.Task[int]]) -> None:
    server, _ = pair
    server.init(ModelSettings(name="echo", implementation="tests.worker_models.Echo"))
    assert (await server.next())[0] == "ready"
    server.conn.send(("call", 1, InferenceRequest(inputs=[], parameters={"raise": "bad input"})))
    kind, ident, error = await server.next()
    assert (kind, ident) == ("err", 1) and isinstance(error, ValueError) and str(error) == "bad input"
    server.conn.send(("call", 2, _request(1)))
    assert (await server.next())[:2] == ("ok", 2)


async def test_a_model_that_fails_to_load_says_why_and_ends_with_1(
    pair: tuple[Server, asyncio.Task[int]],
) -> None:
    server, run = pair
    server.init(ModelSettings(name="broken", implementation="tests.worker_models.BrokenLoad"))
    kind, ident, reason = await server.next()
    assert (kind, ident) == ("failed", 0) and reason == "RuntimeError: no weights here"
    assert await asyncio.wait_for(run, 30) == 1


async def test_sequence_steps_run_on_the_state_their_previous_step_left(
    pair: tuple[Server, asyncio.Task[int]],
) -> None:
    server, _ = pair
    server.init(
        ModelSettings(name="sum", implementation="tests.worker_models.RunningSum", sequence_batching=True)
    )
    assert (await server.next())[0] == "ready"
    server.conn.send(("seq", 1, [("a", True, False, _request(2)), ("b", True, False, _request(10))]))
    kind, ident, first = await server.next()
    assert (kind, ident) == ("ok", 1) and len(first) == 2
    server.conn.send(("seq", 2, [("a", False, False, _request(3)), ("b", False, True, _request(1))]))
    kind, ident, answers = await server.next()
    assert (kind, ident) == ("ok", 2)
    assert [(_sum(response), ends) for response, ends in answers] == [(5, False), (11, True)]
    server.conn.send(("seq_end", 3, ("b", "end")))
    assert await server.next() == ("ok", 3, None)
    server.conn.send(("seq", 4, [("b", False, False, _request(1))]))  # its state was dropped
    kind, ident, [(response, _)] = await server.next()
    assert (kind, ident) == ("ok", 4) and _sum(response) == 1


def _sum(response: Any) -> int:
    return int(np.asarray(next(o.data for o in response.outputs if o.name == "sum")).reshape(-1)[0])


async def test_it_ends_when_the_server_end_closes(pair: tuple[Server, asyncio.Task[int]]) -> None:
    server, run = pair
    server.init(ModelSettings(name="echo", implementation="tests.worker_models.Echo"))
    assert (await server.next())[0] == "ready"
    server.conn.close()
    assert await asyncio.wait_for(run, 30) == 0
