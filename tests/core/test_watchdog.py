"""The watchdog that names the model blocking the event loop (``runtime.core.watchdog``), in process;
``tests/scheduling/test_direct.py`` sees its warning from a real server."""

from __future__ import annotations

import logging
import sys
import time
from types import FrameType

import pytest

from runtime.core.watchdog import LoopWatchdog, culprit
from runtime.model import MLModel
from runtime.settings import ModelSettings

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
