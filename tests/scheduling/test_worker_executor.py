"""The executor that calls a model in worker processes (``runtime.scheduling.worker_executor``),
with real processes: calls answered by the workers (never this process), streams, sequence steps
run in the worker that holds their sequence (each step's state says which), a failing step fails
alone, an ended sequence is forgotten, and the pool scaled and described."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import numpy as np
import pytest

from runtime.scheduling.worker_executor import WorkerExecutor
from runtime.sequences.sequence_model import SequenceStep
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, Parameters, RequestInput
from runtime.workers import HeldState

pytestmark = [pytest.mark.anyio, pytest.mark.server]  # real worker processes


def _value(response: InferenceResponse, name: str) -> int:
    return int(np.asarray(next(o.data for o in response.outputs if o.name == name)).reshape(-1)[0])


def _x(value: int, **params: object) -> InferenceRequest:
    return InferenceRequest(
        inputs=[RequestInput(name="x", shape=[1], datatype="INT64", data=np.array([value]))],
        parameters=Parameters(**params) if params else None,
    )


@pytest.fixture
async def sums() -> AsyncIterator[WorkerExecutor]:
    settings = ModelSettings(
        name="sum", implementation="tests.worker_models.RunningSum", sequence_batching=True
    )
    executor = WorkerExecutor(settings, 2)
    await executor.start()
    yield executor
    await executor.stop()


async def test_calls_and_streams_run_in_the_workers() -> None:
    executor = WorkerExecutor(ModelSettings(name="count", implementation="tests.worker_models.Counter"), 1)
    await executor.start()
    try:
        assert executor.ready
        (described,) = executor.describe()
        assert described["status"] == "READY" and described["pid"] != os.getpid()

        async def one() -> AsyncIterator[InferenceRequest]:
            yield InferenceRequest(inputs=[], parameters=Parameters(count=2))

        chunks = [chunk async for chunk in executor.open_stream(one())]
        assert [_value(c, "i") for c in chunks] == [0, 1]
        assert {_value(c, "pid") for c in chunks} == {described["pid"]}
    finally:
        await executor.stop()
    assert not executor.ready


async def test_sequence_steps_run_where_their_sequence_lives(sums: WorkerExecutor) -> None:
    starts = [SequenceStep(_x(k), f"s{k}", True, False, None) for k in range(1, 5)]
    first = await sums.predict_sequences(starts)
    assert all(isinstance(r, InferenceResponse) for r in first)
    workers = {step.sequence_id: step.state for step in starts}
    assert all(isinstance(state, HeldState) for state in workers.values())
    assert len({state.worker for state in workers.values()}) == 2  # spread over both workers
    pids = {r.outputs[1].data[0] for r in first if isinstance(r, InferenceResponse)}
    assert len(pids) == 2 and os.getpid() not in pids
    again = [SequenceStep(_x(10), f"s{k}", False, k == 4, workers[f"s{k}"]) for k in range(1, 5)]
    second = await sums.predict_sequences(again)
    assert [_value(r, "sum") for r in second if isinstance(r, InferenceResponse)] == [11, 12, 13, 14]
    assert [step.state for step in again] == [workers[f"s{k}"] for k in range(1, 5)]
    assert again[3].ends and not again[0].ends


async def test_a_failing_step_fails_alone(sums: WorkerExecutor) -> None:
    steps = [
        SequenceStep(_x(1), "ok", True, False, None),
        SequenceStep(_x(1, **{"raise": "step broke"}), "bad", True, False, None),
    ]
    ok, bad = await sums.predict_sequences(steps)
    assert isinstance(ok, InferenceResponse) and _value(ok, "sum") == 1
    assert isinstance(bad, ValueError) and str(bad) == "step broke"


async def test_an_ended_sequence_is_forgotten_and_may_start_again(sums: WorkerExecutor) -> None:
    (started,) = await sums.predict_sequences([SequenceStep(_x(5), "e", True, False, None)])
    assert isinstance(started, InferenceResponse)
    await sums.sequence_ended("e", "end")
    assert "e" not in sums.pool.owners
    step = SequenceStep(_x(2), "e", True, False, None)
    (restarted,) = await sums.predict_sequences([step])
    assert isinstance(restarted, InferenceResponse) and _value(restarted, "sum") == 2


async def test_scaling_changes_the_workers(sums: WorkerExecutor) -> None:
    await sums.scale(3)
    assert [w["status"] for w in sums.describe()].count("READY") == 3
    await sums.scale(1)
    assert [w["status"] for w in sums.describe()].count("READY") == 1
