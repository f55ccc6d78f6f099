"""Exactly-once steps (``runtime.sequences.step_numbers``, part of the engine): a retry of the last
applied step gets its stored answer and applies nothing, a step out of order is refused with the
number expected, and the last step of an ended sequence is still answered on a retry."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.errors import SequenceStepConflict
from runtime.sequences.engine import SequenceEngine
from runtime.sequences.lifecycle import Pending
from runtime.sequences.sequence_model import SequenceStep
from runtime.types import InferenceRequest, InferenceResponse
from tests.sequences.engine_helpers import Running, Told, control, make, request

pytestmark = pytest.mark.anyio


def answer(text: str) -> InferenceResponse:
    return InferenceResponse(model_name="m", id=text, outputs=[])


async def take(engine: SequenceEngine, pending: Pending) -> list[tuple[Pending, Any]]:
    """Take ``pending`` to run, as the sequence batcher does, and prepare it."""
    assert engine.withdraw(pending)
    pending.sequence.running = pending
    pending.running = True
    return await engine.prepare([pending])


async def apply(engine: SequenceEngine, pending: Pending, state: Any, result: InferenceResponse) -> None:
    """The model ran ``pending``: keep its outcome, then free its sequence."""
    seq, end = pending.sequence, pending.control.end
    seq.live = True
    step = SequenceStep(InferenceRequest(inputs=[]), seq.key, pending.control.start, end, state)
    assert await engine.commit([pending], [step], [result], [end]) == []
    seq.running = None
    pending.running = False
    await engine.finished(seq, ended=end, state=state)


async def test_a_retry_of_the_last_step_gets_its_answer_and_a_step_out_of_order_is_refused() -> None:
    engine = make(Running(), Told())
    first = engine.admit(request(), control("a", start=True, step=1))
    assert await take(engine, first) == [(first, None)]
    await apply(engine, first, "after 1", answer("one"))
    assert first.sequence.step == 1 and first.sequence.answer is not None

    retry = engine.admit(request(), control("a", step=1))
    assert await take(engine, retry) == []  # answered without running
    replayed = retry.future.result()
    assert replayed.id == "one" and replayed is not first.sequence.answer  # a copy
    assert engine.stats()["replayed_steps"] == 1 and await engine.store.load(["a"]) == ["after 1"]

    ahead = engine.admit(request(), control("a", step=3))
    assert await take(engine, ahead) == []
    with pytest.raises(SequenceStepConflict, match="expects sequence_step=2, got 3") as refused:
        ahead.future.result()
    assert refused.value.expected == 2

    second = engine.admit(request(), control("a", step=2))
    assert await take(engine, second) == [(second, "after 1")]  # the next step runs, with the state
    await apply(engine, second, "after 2", answer("two"))

    old = engine.admit(request(), control("a", step=1))
    assert await take(engine, old) == []
    with pytest.raises(SequenceStepConflict, match="older than the last applied one"):
        old.future.result()
    assert engine.get("a") is not None and engine.stats()["replayed_steps"] == 1


async def test_the_last_step_of_an_ended_sequence_is_answered_again_on_a_retry() -> None:
    told = Told()
    engine = make(Running(), told)
    only = engine.admit(request(), control("a", start=True, end=True, step=1))
    assert await take(engine, only) == [(only, None)]
    await apply(engine, only, "final", answer("last"))
    assert told.calls == [("a", "end", "final")] and engine.get("a") is None

    retry = engine.admit(request(), control("a", step=1))  # answered at once, nothing queued
    assert retry.future.result().id == "last"
    assert engine.stats()["replayed_steps"] == 1 and engine.stats()["queued_requests"] == 0
