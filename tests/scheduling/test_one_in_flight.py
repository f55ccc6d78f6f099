"""The sequence batcher's strategy (``runtime.scheduling.one_in_flight``), through the real sequence
engine and its memory store: at most one request of a sequence in flight, ready sequences taken
oldest head first up to the batch's limit, a head whose caller gave up skipped, and the state left
in the store while a step runs (``detach`` holds nothing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runtime.errors import SequenceError
from runtime.scheduling.one_in_flight import OneInFlight
from runtime.sequences.engine import STORED, SequenceEngine
from runtime.sequences.identity import SequenceControl
from runtime.sequences.lifecycle import Pending
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest

pytestmark = pytest.mark.anyio


class Ended:
    """The engine's hook: each sequence it ends, why, and its last state."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def __call__(self, key: str, reason: str, state: Any) -> None:
        self.calls.append((key, reason, state))


def _strategy() -> tuple[OneInFlight, SequenceEngine, asyncio.Event, Ended]:
    wake, ended = asyncio.Event(), Ended()
    strategy = OneInFlight(wake)
    settings = ModelSettings(name="m", max_sequences=8, max_sequence_queue_size=4, max_sequence_idle_ms=0)
    engine = SequenceEngine(settings, ended, strategy)
    strategy.engine = engine
    return strategy, engine, wake, ended


def _admit(engine: SequenceEngine, key: str, start: bool = False) -> Pending:
    return engine.admit(
        InferenceRequest(inputs=[]), SequenceControl(key=key, echo=key, start=start, end=False)
    )


async def _step_done(engine: SequenceEngine, pending: Pending, state: Any) -> None:
    """What the batcher does once a step has run: the new state in the store, the sequence free."""
    await engine.store.save([(pending.control.key, state)])
    pending.sequence.live = True
    pending.sequence.running = None
    pending.running = False
    await engine.finished(pending.sequence, ended=False, state=STORED)


async def test_one_request_of_a_sequence_at_a_time_oldest_first() -> None:
    strategy, engine, wake, ended = _strategy()
    a1 = _admit(engine, "a", start=True)
    b1 = _admit(engine, "b", start=True)
    a2 = _admit(engine, "a")
    assert wake.is_set()
    assert strategy.take(10) == [a1, b1]  # one per sequence, oldest head first
    assert a1.running and strategy.busy(a1.sequence) and strategy.busy(b1.sequence)
    assert strategy.take(10) == []  # a2 waits for a1
    await _step_done(engine, a1, 1)
    await _step_done(engine, b1, 2)
    assert strategy.take(10) == [a2]
    assert not strategy.busy(b1.sequence)
    assert strategy.detach(b1.sequence) == (False, None)  # its state stays in the store
    assert await engine.store.load(["b"]) == [2]
    await _step_done(engine, a2, 3)
    await engine.stop()
    assert sorted(ended.calls) == [("a", "unload", 3), ("b", "unload", 2)]


async def test_take_stops_at_the_batch_limit_and_keeps_the_rest_ready() -> None:
    strategy, engine, _, _ = _strategy()
    heads = [_admit(engine, f"s{i}", start=True) for i in range(5)]
    assert len(strategy) == 5
    assert strategy.take(2) == heads[:2]
    assert strategy.take(2) == heads[2:4]
    assert strategy.take(2) == heads[4:]
    assert strategy.take(2) == [] and len(strategy) == 0
    for head in heads:
        await _step_done(engine, head, 0)
    await engine.stop()


async def test_a_head_whose_caller_gave_up_is_skipped() -> None:
    strategy, engine, _, _ = _strategy()
    gone = _admit(engine, "gone", start=True)
    kept = _admit(engine, "kept", start=True)
    gone.future.cancel()
    assert strategy.take(10) == [kept]
    with pytest.raises(SequenceError, match="reason: cancel"):  # it was cancelled with its caller
        _admit(engine, "gone")
    await _step_done(engine, kept, 0)
    await engine.stop()
