"""Worker processes, driven directly through ``WorkerExecutor`` / ``WorkerPool`` with real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.errors import InvalidInput, SequenceError, WorkerLost
from runtime.scheduling.worker_executor import WorkerExecutor
from runtime.sequences.sequence_model import SequenceStep
from runtime.settings import ModelParameters, ModelSettings
from runtime.types import Datatype, InferenceRequest, InferenceResponse, Parameters, RequestInput
from runtime.workers import HeldState, WorkerStartTimeout
from runtime.workers.wire import encode
from tests.sequencing import until

pytestmark = [pytest.mark.anyio, pytest.mark.server]  # real worker processes


def settings(cls: str, name: str = "m", **extra: Any) -> ModelSettings:
    return ModelSettings(
        name=name,
        implementation=f"tests.worker_models.{cls}",
        parameters=ModelParameters(extra=extra) if extra else None,
    )


def request(x: Any = 1, **params: Any) -> InferenceRequest:
    data = np.asarray(x)
    datatype = Datatype.FP32 if data.dtype == np.float32 else Datatype.INT64
    return InferenceRequest(
        inputs=[
            RequestInput(name="x", shape=list(data.shape) or [1], datatype=datatype, data=data.reshape(-1))
        ],
        parameters=Parameters(**params) if params else None,
    )


def output(response: InferenceResponse, name: str) -> Any:
    return next(o.data for o in response.outputs if o.name == name)


def pid_of(response: InferenceResponse) -> int:
    return int(np.asarray(output(response, "pid"))[0])


async def started(cls: str, workers: int, **kwargs: Any) -> WorkerExecutor:
    executor = WorkerExecutor(settings(cls, **kwargs.pop("extra", {})), workers, **kwargs)
    await executor.start()
    return executor


@pytest.fixture
async def echo2() -> AsyncIterator[WorkerExecutor]:
    executor = await started("Echo", 2)
    yield executor
    await executor.stop()


async def test_two_workers_have_their_own_pids_and_share_the_work(echo2: WorkerExecutor) -> None:
    pids = {w["pid"] for w in echo2.describe()}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(w["status"] == "READY" and w["memoryUsage"] > 0 for w in echo2.describe())
    # concurrent slow requests spread over both workers (least busy first)
    answers = await asyncio.gather(*(echo2.call_predict(request(i, sleep=0.2)) for i in range(8)))
    seen = [pid_of(a) for a in answers]
    assert set(seen) == pids
    assert sorted(seen.count(p) for p in pids) == [4, 4]


async def test_tensors_cross_intact_and_out_of_band(echo2: WorkerExecutor) -> None:
    big = np.random.default_rng(0).random(1024 * 1024, dtype=np.float32)  # 4 MiB
    answer = await echo2.call_predict(request(big))
    back = output(answer, "x")
    assert back.dtype == np.float32 and np.array_equal(back, big)
    # the tensor's bytes are a buffer of their own, not inside the pickle
    pieces = encode(("call", 1, request(big)))
    assert len(pieces) == 2 and memoryview(pieces[1]).nbytes == big.nbytes and len(pieces[0]) < 4096


async def test_model_errors_come_back_as_they_were_raised(echo2: WorkerExecutor) -> None:
    with pytest.raises(ValueError, match="boom"):
        await echo2.call_predict(request(**{"raise": "boom"}))
    with pytest.raises(InvalidInput, match="bad input"):
        await echo2.call_predict(request(invalid="bad input"))
    assert all(w["busy"] == 0 for w in echo2.describe())


async def test_a_killed_worker_fails_only_its_own_requests_and_is_restarted() -> None:
    """The race: requests in flight on both workers when one dies; only the dead one's fail."""
    executor = await started("Echo", 2)
    try:
        before = {w["pid"] for w in executor.describe()}
        slow = [asyncio.ensure_future(executor.call_predict(request(i, sleep=1.0))) for i in range(4)]
        await asyncio.sleep(0)  # let them go out: two on each worker
        victim = executor.pool.workers[0]
        assert victim.busy == 2
        os.kill(victim.pid or 0, signal.SIGKILL)
        results = await asyncio.gather(*slow, return_exceptions=True)
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(lost) == 2 and all(isinstance(r, WorkerLost) for r in lost)
        assert "died (killed by SIGKILL)" in str(lost[0]) and str(victim.pid) in str(lost[0])
        assert {pid_of(r) for r in results if isinstance(r, InferenceResponse)} == before - {victim.pid}
        await executor.pool.until_ready(2)
        after = executor.describe()
        assert len(after) == 2 and all(w["status"] == "READY" for w in after)
        assert victim.pid not in {w["pid"] for w in after} and executor.pool.restarts == 1
        assert (await executor.call_predict(request(5))) is not None
    finally:
        await executor.stop()


async def test_a_worker_that_kills_itself_fails_its_request_only(echo2: WorkerExecutor) -> None:
    other = asyncio.ensure_future(echo2.call_predict(request(1, sleep=0.5)))
    await asyncio.sleep(0)
    with pytest.raises(WorkerLost, match="SIGSEGV"):
        await echo2.call_predict(request(2, die=int(signal.SIGSEGV)))
    assert pid_of(await other) > 0
    await echo2.pool.until_ready(2)


async def test_a_model_that_fails_to_load_fails_the_start() -> None:
    executor = WorkerExecutor(settings("BrokenLoad"), 2)
    with pytest.raises(RuntimeError, match="no weights here"):
        await executor.start()
    assert all(w["status"] != "READY" for w in executor.describe())


async def test_cancellation_reaches_the_worker(echo2: WorkerExecutor) -> None:
    task = asyncio.ensure_future(echo2.call_predict(request(1, sleep=60)))
    await asyncio.sleep(0)
    assert sum(w.busy for w in echo2.pool.workers) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the worker cancels the model's coroutine and says so: it holds nothing any more
    await asyncio.wait_for(asyncio.gather(*(w.idle.wait() for w in echo2.pool.workers)), 10)


async def test_a_blocking_model_does_not_stall_the_other_worker() -> None:
    executor = await started("Burner", 2)
    try:
        blocked = asyncio.ensure_future(executor.call_predict(request(1, sleep=3)))
        await asyncio.sleep(0)
        quick = await asyncio.wait_for(executor.call_predict(request(2)), 2.5)
        assert pid_of(quick) != 0 and not blocked.done()
        await blocked
    finally:
        await executor.stop()


async def test_streams_come_back_as_made_and_closing_one_stops_it() -> None:
    executor = await started("Counter", 1)
    try:

        async def one(**params: Any) -> AsyncIterator[InferenceRequest]:
            yield request(1, **params)

        chunks = [r async for r in executor.open_stream(one(count=5))]
        assert [int(output(c, "i")[0]) for c in chunks] == [0, 1, 2, 3, 4]
        # an endless-ish stream, closed after two chunks: the worker is told and frees it
        async with aclosing(executor.open_stream(one(count=10_000, pause=0.01))) as stream:  # type: ignore[type-var]
            taken = 0
            async for _ in stream:
                taken += 1
                if taken == 2:
                    break
        await asyncio.wait_for(executor.pool.workers[0].idle.wait(), 10)
        # many requests on one stream: the flow-control window lets them all through
        many = [r async for r in executor.open_stream(_requests(100, count=1))]
        assert len(many) == 100
    finally:
        await executor.stop()


async def _requests(n: int, **params: Any) -> AsyncIterator[InferenceRequest]:
    for i in range(n):
        yield request(i, **params)


async def test_a_stream_whose_worker_dies_ends_with_worker_lost() -> None:
    executor = await started("Counter", 1)
    try:
        got: list[InferenceResponse] = []
        with pytest.raises(WorkerLost, match="died"):
            async for chunk in executor.open_stream(_requests(1, count=5, die=9)):
                got.append(chunk)
        assert len(got) == 1
        await executor.pool.until_ready(1)
    finally:
        await executor.stop()


def steps_for(keys: list[str], x: int, start: bool = False) -> list[SequenceStep]:
    return [SequenceStep(request(x), key, start, False, None) for key in keys]


async def test_sequences_stick_to_their_worker_and_keep_their_sums(tmp_path: Path) -> None:
    endings = tmp_path / "endings"
    executor = await started("RunningSum", 2, extra={"endings": str(endings)})
    try:
        keys = [f"s{i}" for i in range(16)]
        pids: dict[str, set[int]] = {k: set() for k in keys}
        for round_ in range(4):
            steps = steps_for(keys, round_ + 1, start=round_ == 0)
            results = await executor.predict_sequences(steps)
            for step, result in zip(steps, results, strict=True):
                assert isinstance(result, InferenceResponse), result
                assert isinstance(step.state, HeldState)
                pids[step.sequence_id].add(pid_of(result))
                assert int(output(result, "sum")[0]) == sum(range(1, round_ + 2))
        assert all(len(p) == 1 for p in pids.values())
        per_worker = [w["sequences"] for w in executor.describe()]
        assert per_worker == [8, 8]
        await executor.sequence_ended("s0", "end")
        assert endings.read_text() == "s0 end 10\n"
        assert sorted(w["sequences"] for w in executor.describe()) == [7, 8]
    finally:
        await executor.stop()


async def test_a_dead_workers_sequences_are_lost_and_say_so() -> None:
    told: list[tuple[list[str], str]] = []
    heard = asyncio.Event()

    def on_lost(keys: list[str], why: str) -> None:
        told.append((keys, why))
        heard.set()

    executor = await started("RunningSum", 2, on_lost=on_lost)
    try:
        keys = [f"s{i}" for i in range(4)]
        await executor.predict_sequences(steps_for(keys, 1, start=True))
        victim = executor.pool.workers[0]
        theirs = sorted(victim.sequences)
        ours = sorted(set(keys) - set(theirs))
        assert len(theirs) == 2
        os.kill(victim.pid or 0, signal.SIGKILL)
        await asyncio.wait_for(heard.wait(), 30)
        # until its replacement starts (after a back-off: it died young), describe shows why
        dead = [w for w in executor.describe() if w["status"] == "DEAD"]
        assert len(dead) == 1 and dead[0]["reason"].endswith("killed by SIGKILL")
        await executor.pool.until_ready(2)
        assert told == [(theirs, f"worker {victim.id} (pid {victim.pid}) killed by SIGKILL")]
        results = await executor.predict_sequences(steps_for(keys, 1))
        for key, result in zip(keys, results, strict=True):
            if key in theirs:
                assert isinstance(result, SequenceError) and "worker_lost" in str(result)
            else:
                assert isinstance(result, InferenceResponse) and int(output(result, "sum")[0]) == 2
        # a fresh start of a lost id is a new sequence
        fresh = await executor.predict_sequences(steps_for(theirs[:1], 7, start=True))
        assert int(output(fresh[0], "sum")[0]) == 7  # type: ignore[arg-type]
        assert ours
    finally:
        await executor.stop()


async def test_scaling_up_and_down_under_load_loses_nothing() -> None:
    executor = await started("Echo", 1)
    try:
        stop = asyncio.Event()
        done: list[int] = []

        async def load() -> None:
            i = 0
            while not stop.is_set():
                answer = await executor.call_predict(request(i, sleep=0.02))
                done.append(pid_of(answer))
                i += 1

        clients = [asyncio.ensure_future(load()) for _ in range(6)]
        await executor.scale(3)
        assert len({w["pid"] for w in executor.describe()}) == 3
        seen = len(done)
        await asyncio.sleep(0.5)
        assert len(set(done[seen:])) == 3  # the new workers took work
        await executor.scale(1)
        assert [w["status"] for w in executor.describe()] == ["READY"]
        stop.set()
        await asyncio.gather(*clients)  # none failed
    finally:
        await executor.stop()


async def test_a_retiring_worker_keeps_its_sequences_until_they_end() -> None:
    executor = await started("RunningSum", 2)
    try:
        keys = ["a", "b"]
        await executor.predict_sequences(steps_for(keys, 1, start=True))
        scaled = asyncio.ensure_future(executor.scale(1))
        await asyncio.sleep(0.2)
        assert not scaled.done()  # one of them is waiting for its sequence
        draining = [w for w in executor.describe() if w["status"] == "DRAINING"]
        assert len(draining) == 1
        results = await executor.predict_sequences(steps_for(keys, 2))
        assert [int(output(r, "sum")[0]) for r in results] == [3, 3]  # type: ignore[arg-type]
        # no new sequence goes to it
        await executor.predict_sequences(steps_for(["c"], 1, start=True))
        assert executor.pool.owners["c"].status == "READY"
        for key in keys:
            await executor.sequence_ended(key, "end")
        await asyncio.wait_for(scaled, 30)
        assert len(executor.describe()) == 1
    finally:
        await executor.stop()


async def test_stop_drains_in_flight_work_and_unloads(tmp_path: Path) -> None:
    unloaded = tmp_path / "unloaded"
    executor = await started("SlowUnload", 2, extra={"unloaded": str(unloaded)})
    pids = {w["pid"] for w in executor.describe()}
    slow = asyncio.ensure_future(executor.call_predict(request(1, sleep=0.5)))
    await asyncio.sleep(0)
    await executor.stop()
    assert pid_of(await slow) in pids
    assert {int(line) for line in unloaded.read_text().split()} == pids
    assert all(w["status"] == "STOPPED" for w in executor.describe())


async def test_a_worker_that_does_not_load_in_time_is_killed_and_the_start_fails() -> None:
    executor = WorkerExecutor(
        ModelSettings(
            name="stuck", implementation="tests.worker_models.BlockingLoad", worker_start_timeout=1
        ),
        1,
    )
    began = time.monotonic()
    with pytest.raises(WorkerStartTimeout) as raised:
        await executor.start()
    assert time.monotonic() - began < 30
    message = str(raised.value)
    assert "'stuck'" in message and "worker 1" in message and "worker_start_timeout (1s)" in message
    (worker,) = executor.pool.workers
    assert worker.returncode == -signal.SIGKILL and not worker.alive  # killed, and reaped


async def test_a_restart_that_does_not_load_in_time_fails_and_says_why(tmp_path: Path) -> None:
    settings_ = ModelSettings(
        name="stuck",
        implementation="tests.worker_models.BlockingLoad",
        parameters=ModelParameters(extra={"marker": str(tmp_path / "loaded")}),
    )
    executor = WorkerExecutor(settings_, 1)
    await executor.start()  # the first load goes through (with the default timeout)
    try:
        executor.pool.settings.worker_start_timeout = 1.5  # what its workers are started with
        (first,) = executor.pool.workers
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)
        # the restarted worker blocks in load: it is killed after worker_start_timeout, and says so
        await until(lambda: "worker_start_timeout" in executor.pool.fallen.get(first.id, first).reason, 30)
        reason = executor.pool.fallen[first.id].reason
        assert "'stuck'" in reason and f"worker {first.id}" in reason and "(1.5s)" in reason
        assert not executor.ready
    finally:
        await executor.stop()
