"""The worker processes of one model: supervision, dispatch, sequence affinity and scaling.

- **Dispatch**: a call or stream goes to the ready worker that holds the least work (ties: the
  one that took work longest ago). With no worker ready, callers wait while one is starting, and
  get ``ModelNotReady`` when none is.
- **Affinity**: a sequence belongs to one worker for its whole life (its state lives there); a new
  sequence goes to the ready worker with the fewest open sequences.
- **Faults**: a worker that dies is restarted (after a back-off when it keeps dying young). Only
  the work it held fails (``WorkerLost``, 503); its sequences are *lost*: the ``on_lost`` callback
  hears their keys (so that their scheduler ends them with reason ``worker_lost``), and a later
  step of one is refused, never started afresh.
- **Scaling**: ``scale(n)`` starts workers or retires the idlest ones. A retiring worker takes no
  new calls or sequences, finishes what it holds and keeps serving its open sequences until they
  end, then stops.
- **Stop**: every worker finishes its work, unloads its model and exits (killed after ``grace``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any

from lru import LRU

from runtime.errors import ModelNotReady, SequenceError
from runtime.sequences.sequence_model import END_REASONS
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from runtime.workers.process import WorkerProcess, WorkerStartTimeout

logger = logging.getLogger(__name__)

YOUNG = 10.0
"""A worker that dies within this many seconds of starting makes the next restart wait longer."""
MAX_BACKOFF = 10.0
LOST_MEMORY = 10_000
"""Keys of lost sequences remembered, so that their next request is refused saying why."""


class WorkerPool:
    """N worker processes serving one model."""

    def __init__(
        self,
        settings: ModelSettings,
        workers: int,
        on_lost: Callable[[list[str], str], None] | None = None,
        grace: float = 30.0,
    ) -> None:
        if workers < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.settings = settings
        self.target = workers
        self.on_lost = on_lost
        self.grace = grace
        self.workers: list[WorkerProcess] = []
        """Every worker serving or starting (not those retiring)."""
        self.retiring: list[WorkerProcess] = []
        self.fallen: dict[int, WorkerProcess] = {}
        """Workers that died, by id, until their replacement starts (shown by ``describe``)."""
        self.owners: dict[str, WorkerProcess] = {}
        """Open sequence key → the worker holding its state."""
        self.lost: LRU[str, str] = LRU(LOST_MEMORY)
        """Lost sequence key → why (how its worker died)."""
        self.ended: LRU[str, WorkerProcess] = LRU(LOST_MEMORY)
        """Sequences that recently ended inside their worker → that worker (which remembers why:
        their next request goes there to hear it)."""
        self.ended_by: dict[str, int] = dict.fromkeys(END_REASONS, 0)
        """Sequences ended inside the workers' own batchers, by reason (theirs, or ``worker_lost``)."""
        self.restarts = 0
        self._ids = itertools.count(1)
        self._turn = itertools.count()
        self._last: dict[int, int] = {}
        self._backoff = 0.0
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False

    @property
    def name(self) -> str:
        return self.settings.name

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the workers; raise (after stopping any that started) if one cannot load the model."""
        workers = [self._new() for _ in range(self.target)]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self._stopping = True
            await asyncio.gather(*(w.stop(self.grace) for w in workers), return_exceptions=True)
            reasons = "; ".join(w.reason for w in workers if w.reason) or str(failures[0])
            timed_out = any(isinstance(f, WorkerStartTimeout) for f in failures)
            raise (WorkerStartTimeout if timed_out else RuntimeError)(
                f"its worker processes could not load it: {reasons}"
            )
        self._changed.set()

    def _new(self, worker_id: int | None = None) -> WorkerProcess:
        worker = WorkerProcess(self.settings, worker_id or next(self._ids), self._on_exit, self._on_ended)
        self.workers.append(worker)
        return worker

    async def stop(self) -> None:
        """Drain every worker: finish its work, unload its model, exit."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        everyone = self.workers + self.retiring + list(self.fallen.values())  # fallen: maybe not reaped yet
        await asyncio.gather(*(w.stop(self.grace) for w in everyone), return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._changed.set()

    def kill(self) -> None:
        """End every worker process at once (the server is going away without a drain)."""
        self._stopping = True
        for worker in self.workers + self.retiring + list(self.fallen.values()):
            worker.kill()

    @property
    def ready(self) -> bool:
        return any(w.status == "READY" for w in self.workers)

    async def until_ready(self, count: int | None = None) -> None:
        """Wait until ``count`` workers (all it should run, by default) are ready."""
        while sum(w.status == "READY" for w in self.workers) < (count or self.target):
            self._changed.clear()
            await self._changed.wait()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ faults

    def _on_exit(self, worker: WorkerProcess) -> None:
        keys = sorted(worker.sequences)
        worker.sequences.clear()
        if keys:
            why = worker.reason or f"worker {worker.id} stopped"
            self.ended_by["worker_lost"] = self.ended_by.get("worker_lost", 0) + len(keys)
            for key in keys:
                if self.owners.get(key) is worker:
                    del self.owners[key]
                self.lost[key] = why
            if self.on_lost is not None:
                self.on_lost(keys, why)
        if worker in self.retiring:
            self.retiring.remove(worker)
            return
        if worker.expected_exit or self._stopping or worker not in self.workers:
            return
        if worker.ready_at is None:
            return  # it died while starting: its starter decides what to do
        self.workers.remove(worker)
        self.fallen[worker.id] = worker
        young = worker.ready_at is None or time.time() - worker.started_at < YOUNG
        self._backoff = min(MAX_BACKOFF, max(0.5, self._backoff * 2)) if young else 0.0
        self._spawn_task(self._restart(worker.id, self._backoff if young else 0.0))
        self._changed.set()

    def _on_ended(self, worker: WorkerProcess, key: str, reason: str) -> None:
        """A sequence ended inside ``worker`` (its own batcher ended it): forget that it holds it."""
        self.ended_by[reason] = self.ended_by.get(reason, 0) + 1
        if self.owners.get(key) is worker:
            self.release(key)
            self.ended[key] = worker

    async def _restart(self, worker_id: int, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        while not self._stopping:
            worker = self._new(worker_id)
            self.fallen.pop(worker_id, None)
            self.restarts += 1
            try:
                await worker.start()
            except Exception as exc:
                logger.error("Model %r: worker %d could not restart: %s", self.name, worker_id, exc)
                if worker in self.workers:
                    self.workers.remove(worker)
                self.fallen[worker_id] = worker
                await worker.stop(self.grace)
                self._backoff = min(MAX_BACKOFF, max(0.5, self._backoff * 2))
                self._changed.set()
                await asyncio.sleep(self._backoff)
                continue
            logger.info("Model %r: worker %d restarted (pid %s)", self.name, worker_id, worker.pid)
            self._changed.set()
            return

    # ------------------------------------------------------------------ dispatch

    def least_busy(self) -> WorkerProcess | None:
        """The ready worker with the least work (ties: the one that took work longest ago), if any."""
        best: WorkerProcess | None = None
        for worker in self.workers:
            if worker.status != "READY" or not worker.alive:  # dead, not yet noticed
                continue
            if best is None or (worker.busy, self._last.get(worker.id, -1)) < (
                best.busy,
                self._last.get(best.id, -1),
            ):
                best = worker
        if best is not None:
            self._last[best.id] = next(self._turn)
        return best

    async def pick(self) -> WorkerProcess:
        """The ready worker with the least work; waits while none is ready but one is starting."""
        while True:
            best = self.least_busy()
            if best is not None:
                return best
            if self._stopping or not (self.workers or self._tasks):
                raise ModelNotReady(f"Model {self.name!r} has no worker running")
            self._changed.clear()
            await self._changed.wait()

    def route(self, key: str, start: bool) -> tuple[WorkerProcess, bool]:
        """The worker for a request of sequence ``key`` whose batcher runs in the workers, and
        whether the request may open the sequence there (only a START does: its answer adopts it).

        An open sequence's worker; for a START of a new one, the worker with the fewest; a later
        request of a sequence that ended in its worker goes to that worker, which says why it
        ended (without adopting it again); one of a lost sequence is refused (``owner``)."""
        worker = self.owners.get(key)
        if worker is not None:
            return worker, start
        if not start:
            recent = self.ended.get(key)
            if recent is not None and recent.alive and key not in self.lost:
                return recent, False
            if key not in self.lost:
                return self.newcomer(), False  # it will say that the sequence is not open
        return self.owner(key, start), start

    def owner(self, key: str, start: bool) -> WorkerProcess:
        """The worker that holds sequence ``key`` (a new one for a new sequence).

        A step of a sequence whose worker died is refused (``SequenceError``) unless it starts
        the sequence afresh.
        """
        worker = self.owners.get(key)
        if worker is not None:
            return worker
        if not start and key in self.lost:
            raise SequenceError(
                f"Sequence {key!r} has ended (reason: worker_lost): the worker process holding its "
                f"state died ({self.lost[key]}). Start a new sequence."
            )
        worker = self.newcomer()
        self.adopt(key, worker)
        return worker

    def newcomer(self) -> WorkerProcess:
        """The ready worker that should take a new sequence: the one with the fewest."""
        ready = [w for w in self.workers if w.status == "READY" and w.alive]
        if not ready:
            raise ModelNotReady(f"Model {self.name!r} has no worker ready for a new sequence")
        return min(ready, key=lambda w: (len(w.sequences), w.busy))

    def adopt(self, key: str, worker: WorkerProcess) -> None:
        """Record that ``worker`` holds sequence ``key`` (if no worker is recorded for it yet)."""
        if key in self.owners or not worker.alive:
            return
        self.lost.pop(key, None)
        self.ended.pop(key, None)
        self.owners[key] = worker
        worker.sequences.add(key)

    def release(self, key: str) -> WorkerProcess | None:
        """Forget sequence ``key`` (it ended); return the worker that held it."""
        worker = self.owners.pop(key, None)
        if worker is not None:
            worker.sequences.discard(key)
            if worker in self.retiring and not worker.sequences:
                self._changed.set()
        return worker

    async def stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        worker = await self.pick()
        async for response in worker.stream(requests):
            yield response

    # ------------------------------------------------------------------ scaling

    async def scale(self, workers: int, wait: bool = True) -> None:
        """Run ``workers`` workers: start more, or retire the idlest (they finish their work and
        their open sequences first). With ``wait``, return once new workers are ready and retired
        ones have stopped."""
        if workers < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.target = workers
        jobs: list[Any] = []
        serving = [w for w in self.workers]
        if workers > len(serving):
            for _ in range(workers - len(serving)):
                jobs.append(self._grow(self._new()))
        elif workers < len(serving):
            order = sorted(serving, key=lambda w: (w.status == "READY", len(w.sequences), w.busy, -w.id))
            for worker in order[: len(serving) - workers]:
                self.workers.remove(worker)
                self.retiring.append(worker)
                worker.status = "DRAINING"
                jobs.append(self._retire(worker))
        self._changed.set()
        if not jobs:
            return
        if wait:
            results = await asyncio.gather(*jobs, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                self.target = len(self.workers)  # the workers that could not start are gone
                raise errors[0]
        else:
            for job in jobs:
                self._spawn_task(job)

    async def _grow(self, worker: WorkerProcess) -> None:
        try:
            await worker.start()
        except Exception:
            if worker in self.workers:
                self.workers.remove(worker)
            await worker.stop(self.grace)
            raise
        finally:
            self._changed.set()

    async def _retire(self, worker: WorkerProcess) -> None:
        while worker.sequences and worker.alive:
            self._changed.clear()
            await self._changed.wait()
        await worker.stop(self.grace)
        if worker in self.retiring:
            self.retiring.remove(worker)

    # ------------------------------------------------------------------ describing

    def describe(self) -> list[dict[str, Any]]:
        """Each worker: id, pid, status, memory (bytes), start time, work held, open sequences."""
        return [
            {
                "id": str(w.id),
                "pid": w.pid,
                "status": w.status,
                "memoryUsage": w.memory(),
                "startTime": datetime.fromtimestamp(w.started_at, timezone.utc).isoformat(),
                "busy": w.busy,
                "sequences": len(w.sequences),
                **({"reason": w.reason} if w.reason else {}),
            }
            for w in sorted(self.workers + self.retiring + list(self.fallen.values()), key=lambda w: w.id)
        ]
