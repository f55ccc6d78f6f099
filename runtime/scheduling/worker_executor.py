"""The executor that runs a model in worker processes (``runtime.workers``), behind the same seam
as the in-process one (``executor.py``).

Schedulers hand it what they would hand any executor: a request or a merged batch
(``call_predict``, to the least-busy worker), a stream (``open_stream``, whose responses come back
as the worker makes them), and for sequence batching a batch of steps (``predict_sequences``,
each step to the worker that holds its sequence) and sequence endings (``sequence_ended``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime.errors import SequenceError, WorkerLost
from runtime.scheduling.executor import Executor, LostSequences
from runtime.sequences.sequence_model import SequenceStep
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from runtime.workers import HeldState, WorkerPool, WorkerProcess


class WorkerExecutor(Executor):
    """Runs one model in ``workers`` worker processes, each with its own copy of the model."""

    def __init__(
        self,
        settings: ModelSettings,
        workers: int,
        on_lost: Callable[[list[str], str], None] | None = None,
        grace: float = 30.0,
    ) -> None:
        self.settings = settings
        self.pool = WorkerPool(settings, workers, on_lost=on_lost, grace=grace)

    async def start(self) -> None:
        await self.pool.start()

    async def stop(self) -> None:
        """Drain the workers: each finishes its work, unloads its model and exits."""
        await self.pool.stop()

    def close(self) -> None:
        self.pool.kill()

    @property
    def ready(self) -> bool:
        return self.pool.ready

    async def call_predict(self, request: InferenceRequest) -> InferenceResponse:
        pool = self.pool
        worker = pool.least_busy() or await pool.pick()
        response: InferenceResponse = await worker.call("call", request)
        return response

    def open_stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        return self.pool.stream(requests)

    async def predict_sequences(self, steps: list[SequenceStep]) -> list[InferenceResponse | BaseException]:
        """Run each step in the worker that holds its sequence; the workers' parts run at once.

        A step whose worker dies fails alone (``WorkerLost``); so does a step of a sequence whose
        worker died earlier (``SequenceError``, reason ``worker_lost``). Each step's ``state``
        becomes a :class:`HeldState` naming its worker.
        """
        results: list[InferenceResponse | BaseException | None] = [None] * len(steps)
        parts: dict[WorkerProcess, list[int]] = {}
        for index, step in enumerate(steps):
            try:
                worker = self.pool.owner(step.sequence_id, step.start)
            except (SequenceError, WorkerLost) as exc:
                results[index] = exc
                continue
            except Exception as exc:
                results[index] = exc
                continue
            parts.setdefault(worker, []).append(index)

        async def run(worker: WorkerProcess, indexes: list[int]) -> None:
            items = [(steps[i].sequence_id, steps[i].start, steps[i].end, steps[i].request) for i in indexes]
            try:
                answers = await worker.call("seq", items)
            except Exception as exc:
                for i in indexes:
                    results[i] = exc
                return
            for i, (answer, ends) in zip(indexes, answers, strict=True):
                results[i] = answer
                if not isinstance(answer, BaseException):
                    steps[i].state = HeldState(worker.id)
                    if ends:
                        steps[i].end_sequence()

        await asyncio.gather(*(run(worker, indexes) for worker, indexes in parts.items()))
        return [r if r is not None else RuntimeError("no result") for r in results]

    def on_lost(self, callback: LostSequences) -> None:
        self.pool.on_lost = callback

    async def sequence_ended(self, key: str, reason: str, state: Any = None) -> None:
        """Tell the worker holding ``key`` that the sequence ended (it drops the state and tells
        the model); nothing to do when that worker is gone. ``state`` (a :class:`HeldState`, what
        the server kept) is not needed: the worker has the real one."""
        worker = self.pool.release(key)
        if worker is not None and worker.alive:
            await worker.call("seq_end", (key, reason))

    async def scale(self, workers: int, wait: bool = True) -> None:
        await self.pool.scale(workers, wait)

    def describe(self) -> list[dict[str, Any]]:
        return self.pool.describe()
