"""The watchdog that names the model blocking the event loop (``runtime.core.watchdog``), in process;
``tests/scheduling/test_direct.py`` sees its warning from a real server."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from types import FrameType

import httpx
import pytest

from runtime.core.watchdog import LoopWatchdog, culprit
from runtime.model import MLModel
from runtime.settings import ModelSettings, Settings
from runtime.types import InferenceRequest, InferenceResponse
from tests.servers import serving

pytestmark = pytest.mark.anyio


def _helper() -> FrameType:
    return sys._getframe()


class Hog(MLModel):
    def compute(self) -> FrameType:
        return _helper()


class Base(MLModel):
    def shared(self) -> FrameType:
        return sys._getframe()


class Child(Base):
    pass


def _model(cls: type[MLModel], name: str) -> MLModel:
    return cls(ModelSettings(name=name, implementation=cls))


def test_culprit_names_the_model_whose_code_is_on_the_stack_and_the_innermost_frame() -> None:
    hog = _model(Hog, "hog")
    frame = hog.compute()  # type: ignore[attr-defined]
    found = culprit(frame, [hog, _model(Base, "other")])
    assert found is not None
    name, where = found
    assert name == "'hog'" and where.endswith(f"in {_helper.__name__}") and __file__ in where


def test_code_a_base_class_defines_counts_for_every_model_of_it() -> None:
    child, base = _model(Child, "child"), _model(Base, "base")
    found = culprit(child.shared(), [child, base])  # type: ignore[attr-defined]
    assert found is not None and found[0] == "'base' or 'child'"


def test_no_model_code_on_the_stack_names_nobody() -> None:
    assert culprit(sys._getframe(), [_model(Hog, "hog")]) is None
    assert culprit(None, [_model(Hog, "hog")]) is None


async def test_a_stall_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = LoopWatchdog(0.05, lambda: [])
    watchdog.start()
    try:
        with caplog.at_level(logging.WARNING, logger="runtime.core.watchdog"):
            time.sleep(0.6)  # noqa: ASYNC251 - the stall under test: the loop cannot tick
    finally:
        watchdog.stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == "runtime.core.watchdog"]
    assert len(warnings) == 1 and warnings[0].startswith("The event loop has been blocked for")


async def test_a_short_stall_in_the_servers_own_code_is_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Twice the threshold, with no model's code on the stack (UNNAMED_FACTOR is 5)."""
    watchdog = LoopWatchdog(0.1, lambda: [_model(Hog, "hog")])
    watchdog.start()
    try:
        with caplog.at_level(logging.WARNING, logger="runtime.core.watchdog"):
            time.sleep(0.2)  # noqa: ASYNC251 - the stall under test
    finally:
        watchdog.stop()
    assert not [r for r in caplog.records if r.name == "runtime.core.watchdog"]


class Stalls(MLModel):
    """An ``async def predict`` that holds the loop for 0.2 s: every other request waits meanwhile."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        time.sleep(0.2)  # noqa: ASYNC251 - the stall under test
        return InferenceResponse(model_name=self.name, outputs=[])


def test_the_default_threshold_is_asyncios_slow_callback_duration() -> None:
    loop = asyncio.new_event_loop()
    try:
        assert Settings().loop_block_warning == 0.1 == loop.slow_callback_duration
    finally:
        loop.close()


async def test_a_model_that_blocks_the_loop_for_a_fifth_of_a_second_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="runtime.core.watchdog")
    async with serving(ModelSettings(name="stalls", implementation=Stalls)) as server:
        url = f"http://127.0.0.1:{server.http_port}/v2/models/stalls/infer"
        async with httpx.AsyncClient() as client:
            answer = await client.post(url, json={"inputs": []})
    assert answer.status_code == 200, answer.text
    warnings = [r.getMessage() for r in caplog.records if r.name == "runtime.core.watchdog"]
    named = [w for w in warnings if "by model" in w]  # not the test's own client, in the same loop
    assert len(named) == 1, warnings
    assert "by model 'stalls'" in named[0] and "in predict" in named[0]
