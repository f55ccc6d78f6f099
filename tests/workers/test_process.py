"""One worker process as the server sees it (``runtime.workers.process``), with real processes:
started, its model loaded, calls and streams answered from its own pid, stopped with exit code 0;
a load failure fails the start with its reason; a death fails the calls it holds at once with
``WorkerLost`` naming how it died."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from runtime.errors import WorkerLost
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, Parameters
from runtime.workers.process import WorkerProcess, how_it_ended

pytestmark = [pytest.mark.anyio, pytest.mark.server]  # real worker processes


def _pid(response: InferenceResponse) -> int:
    return int(np.asarray(next(o.data for o in response.outputs if o.name == "pid")).reshape(-1)[0])


def _worker(cls: str, exited: list[WorkerProcess]) -> WorkerProcess:
    settings = ModelSettings(name=cls.lower(), implementation=f"tests.worker_models.{cls}")
    return WorkerProcess(settings, 1, exited.append)


def test_how_a_process_ended_in_words() -> None:
    assert how_it_ended(None) == "lost its connection"
    assert how_it_ended(0) == "exited with code 0"
    assert how_it_ended(3) == "exited with code 3"
    assert how_it_ended(-signal.SIGKILL) == "killed by SIGKILL"
    assert how_it_ended(-200) == "killed by signal 200"


async def test_a_worker_serves_calls_and_streams_then_stops() -> None:
    exited: list[WorkerProcess] = []
    worker = _worker("Counter", exited)
    await worker.start()
    try:
        assert worker.status == "READY" and worker.alive and worker.pid not in (None, os.getpid())
        assert repr(worker) == f"<worker 1 of 'counter' pid={worker.pid} READY>"
        memory = worker.memory()
        assert memory is None or memory > 0

        async def requests() -> AsyncIterator[InferenceRequest]:
            yield InferenceRequest(inputs=[], parameters=Parameters(count=3))

        chunks = [chunk async for chunk in worker.stream(requests())]
        assert [int(np.asarray(c.outputs[0].data)[0]) for c in chunks] == [0, 1, 2]
        assert {_pid(c) for c in chunks} == {worker.pid}
        assert worker.busy == 0
    finally:
        await worker.stop(grace=30)
    assert str(worker.status) == "STOPPED" and worker.returncode == 0 and exited == [worker]


async def test_a_load_failure_fails_the_start_with_its_reason() -> None:
    exited: list[WorkerProcess] = []
    worker = _worker("BrokenLoad", exited)
    with pytest.raises(RuntimeError, match="no weights here"):
        await worker.start()
    assert "no weights here" in worker.reason
    await worker.stop(grace=30)
    assert not worker.alive


async def test_a_death_fails_the_calls_it_holds_with_worker_lost() -> None:
    exited: list[WorkerProcess] = []
    worker = _worker("Echo", exited)
    await worker.start()
    held: asyncio.Task[Any] = asyncio.create_task(
        worker.call("call", InferenceRequest(inputs=[], parameters=Parameters(sleep=60)))
    )
    answer = await worker.call("call", InferenceRequest(inputs=[]))
    assert _pid(answer) == worker.pid and worker.busy == 1  # the sleeping call is still held
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(WorkerLost, match="killed by SIGKILL") as lost:
        await asyncio.wait_for(held, 30)
    assert f"pid {worker.pid}" in lost.value.message
    assert worker.status == "DEAD" and "killed by SIGKILL" in worker.reason and exited == [worker]
    assert worker.busy == 0 and not worker.alive
