"""The scheduler of a model whose batcher runs inside each of its workers (continuous batching).

A continuous batcher steps its running streams together many times a second; stepping it across a
process boundary would cost a round trip per step. So each worker runs the model's own batcher
(``make_scheduler`` in the worker), and the server forwards whole requests and streams to the
workers: a request or stream outside any sequence to the least busy worker, a request of a
sequence to the worker that served the sequence's START (new sequences: the worker with the
fewest), for the sequence's whole life. A stream is served by one worker, chosen by its first
request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from runtime.model import MLModel
from runtime.scheduling.scheduler import Scheduler, StreamError
from runtime.scheduling.worker_executor import WorkerExecutor
from runtime.sequences.identity import ID, parse_control
from runtime.settings import ModelSettings
from runtime.telemetry.counts import merge
from runtime.telemetry.stats import ExecutionStats
from runtime.types import InferenceRequest, InferenceResponse
from runtime.workers import WorkerProcess

GENERATED = ""
"""As the sequence a request opens: a START without an id (its answer names the id the worker made)."""


class ForwardingScheduler(Scheduler):
    """Forwards requests and streams to the workers, whose own batchers serve them."""

    def __init__(self, model: MLModel, settings: ModelSettings, workers: WorkerExecutor) -> None:
        super().__init__(model, settings, workers)
        self.workers = workers
        self._executed: dict[int, dict[str, Any]] = {}
        """Each worker process's (by pid) executions, as it last told them: those of a worker that
        died stay counted (all but what it did after it last told)."""

    async def refresh(self) -> None:
        """The executions of the workers' own batchers, summed into ``stats`` (for the metrics)."""
        ready = [w for w in self.workers.pool.workers if w.alive and w.status == "READY"]
        told = await asyncio.gather(*(w.call("stats", None) for w in ready), return_exceptions=True)
        for worker, snapshot in zip(ready, told, strict=True):
            if isinstance(snapshot, dict) and worker.pid is not None:
                self._executed[worker.pid] = snapshot
        self.stats = ExecutionStats.of(merge(self._executed.values()))

    async def stop(self) -> None:
        """The workers' batchers finish their work when the workers drain (``WorkerExecutor.stop``)."""

    async def _route(self, request: InferenceRequest) -> tuple[WorkerProcess, str | None, str | None, bool]:
        """The worker for ``request``; the sequence its answer may adopt (a START's key, or
        ``GENERATED`` for a START whose id the worker makes; None for any other request); the
        sequence it ends (None if it ends none); whether routing it recorded a new sequence (a
        START the worker refuses must not leave it recorded)."""
        pool = self.workers.pool
        control = parse_control(request.parameters) if self.settings.sequence_batching else None
        if control is None:
            return await pool.pick(), None, None, False
        if control.generated:
            return pool.newcomer(), GENERATED, None, False
        known = control.key in pool.owners
        worker, opens = pool.route(control.key, control.start)
        recorded = not known and pool.owners.get(control.key) is worker
        return worker, control.key if opens else None, control.key if control.end else None, recorded

    def _settle(self, worker: WorkerProcess, response: Any, opens: str | None, ends: str | None) -> None:
        """After an answer: remember the sequence a START opened (or the id the worker made for it);
        forget one that ended. Only a START's answer adopts a sequence: the answer to any other
        request may come after the worker said that its sequence ended (an idle timeout)."""
        pool = self.workers.pool
        params = response.parameters if isinstance(response, InferenceResponse) else None
        extra = params.model_extra if params is not None else None
        if extra and extra.get("sequence_end"):
            pool.release(str(extra.get(ID)))
        elif extra and ID in extra and opens is not None:
            pool.adopt(str(extra[ID]), worker)
        if ends is not None:
            pool.release(ends)

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        worker, opens, ends, recorded = await self._route(request)
        try:
            response: InferenceResponse = await worker.call("call", request)
        except BaseException:
            if recorded and opens is not None and self.workers.pool.owners.get(opens) is worker:
                self.workers.pool.release(opens)  # the worker refused the START: nothing to hold
            raise
        self._settle(worker, response, opens, ends)
        return response

    async def stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse | StreamError]:
        first = await anext(aiter(requests), None)
        if first is None:
            return
        worker, _, _, _ = await self._route(first)
        opening: list[str] = []
        """The STARTs sent on the stream whose answers have not come back, in order (their keys,
        ``GENERATED`` for a server-made id)."""

        def note(request: InferenceRequest) -> InferenceRequest:
            control = parse_control(request.parameters) if self.settings.sequence_batching else None
            if control is not None and (control.start or control.generated):
                opening.append(GENERATED if control.generated else control.key)
            return request

        async def again() -> AsyncIterator[InferenceRequest]:
            yield note(first)
            async for request in requests:
                yield note(request)

        async for response in worker.stream(again()):
            opens: str | None = None
            params = response.parameters if isinstance(response, InferenceResponse) else None
            named = (params.model_extra or {}).get(ID) if params is not None else None
            key = None if named is None else str(named)
            if key is not None and opening and (key in opening or GENERATED in opening):
                opens = key
                opening.remove(key if key in opening else GENERATED)
            self._settle(worker, response, opens, None)
            yield response

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "scheduler": "continuous",
            "in": "each worker",
            "max_batch_size": self.settings.max_batch_size,
        }
        if self.settings.sequence_batching:  # what the server knows of the workers' sequences
            pool = self.workers.pool
            described["sequence_stats"] = {
                "open_sequences": len(pool.owners),
                "states_held": len(pool.owners),
                "ended": dict(pool.ended_by),
            }
        return described
