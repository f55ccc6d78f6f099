"""Sequence batching: stateful models served one step per sequence per batch, with their state kept.

One worker task per model makes every ``predict_sequences`` and ``sequence_ended`` call, so a model
never sees two of them at once and the state store needs no locks (requests outside any sequence
go to ``predict`` through the ``stateless`` scheduler, as for any model). Requests wait in their
sequence's queue; a sequence with a waiting request and nothing running is *ready*. The worker
takes the head request of ready sequences, oldest first, up to ``max_batch_size``; it waits at
most ``max_batch_time`` for more, and not at all once every open sequence is in the batch (no
one else could join). Within a sequence requests run in arrival order, one at a time.

Endings decided outside the worker (idle and lifetime timers, cancellations) are queued as
notices that the worker delivers before its next batch, so the model hears of an ending before it
sees a fresh sequence with the same id. The lifecycle rules live in ``runtime.sequences.lifecycle``.

Cancellation: when a caller gives up on a request of a sequence (a client disconnects, a gRPC call
is cancelled), the sequence is cancelled, as Triton does: its other queued requests fail with
``Cancelled``, the model is told (reason ``cancel``) once nothing of it runs, and later requests to
the id are refused with 400 saying it was cancelled. A stateful sequence that has lost a step cannot
go on as if nothing happened.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import InvalidInput, ModelFailed, ShuttingDown
from ..model import MLModel
from ..sequences.identity import SequenceControl, mark_response, parse_control
from ..sequences.lifecycle import Pending, Sequence, Sequences, TimerRules
from ..sequences.model import EndReason, SequenceModel, SequenceStep
from ..sequences.store import LRUStateStore, StateStore
from ..settings import ModelSettings
from ..types import InferenceRequest, InferenceResponse
from .base import RequestFailed, Scheduler
from .sequence_streams import serve_stream

logger = logging.getLogger(__name__)


class SequenceScheduler(Scheduler, TimerRules):
    """The sequence batcher of one model."""

    def __init__(
        self,
        model: MLModel,
        settings: ModelSettings,
        store: StateStore | None = None,
        stateless: Scheduler | None = None,
    ) -> None:
        super().__init__(model, settings)
        if not isinstance(model, SequenceModel):
            raise TypeError(
                f"{type(model).__qualname__} is served with sequence_batching, so it must subclass "
                "runtime.SequenceModel and implement predict_sequences"
            )
        self.seq_model: SequenceModel = model
        self.sequences = Sequences(
            settings.name,
            settings.max_sequences,
            settings.max_sequence_queue_size,
            settings.sequence_ended_memory,
        )
        self.store = store or LRUStateStore(settings.sequence_state_capacity or settings.max_sequences)
        self.max_batch = max(1, settings.max_batch_size)
        self.max_wait = settings.max_batch_time
        self.idle_s = settings.max_sequence_idle_ms / 1000
        self.life_s = settings.sequence_timeout_ms / 1000
        self.stateless = stateless
        """Serves requests outside any sequence (None: the model answers them 400)."""
        self._ready: list[tuple[int, Sequence]] = []
        self._notices: deque[tuple[str, EndReason]] = deque()
        self._arrivals = itertools.count()
        self._wake = asyncio.Event()
        self._quiet = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._stopping = False
        self._running = 0
        self.batches = 0
        self.steps = 0
        self.largest_batch = 0

    # ------------------------------------------------------------------ lifecycle of the scheduler

    async def start(self) -> None:
        if self.stateless is not None:
            await self.stateless.start()
        self._worker = asyncio.create_task(self._work(), name=f"sequence-batcher:{self.settings.name}")

    async def stop(self) -> None:
        """Refuse new requests, run the accepted ones, then end every open sequence (reason ``unload``)."""
        self._stopping = True
        while self._worker is not None and (self.sequences.queued or self._running or self._notices):
            self._quiet.clear()
            self._wake.set()
            await self._quiet.wait()
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        await self._drain_notices()
        for seq in list(self.sequences.active.values()):
            seq.stop_timers()
            if seq.live:
                seq.live = False
                await self._tell(seq.key, "unload", await self.store.pop(seq.key))
            self.sequences.settle(seq, "unload", everything=True)
        await self.store.clear()
        if self.stateless is not None:
            await self.stateless.stop()

    # ------------------------------------------------------------------ requests

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        control = parse_control(request.parameters)
        if control is None:
            return await self.serve_stateless(request)
        return await self.submit(request, control).future

    async def serve_stateless(self, request: InferenceRequest) -> InferenceResponse:
        if self.stateless is None:
            raise InvalidInput(
                f"Model {self.settings.name!r} serves only sequences: send sequence_start=true to start one "
                "(with or without a sequence_id), or the sequence_id of an open one"
            )
        return await self.stateless.infer(request)

    def submit(self, request: InferenceRequest, control: SequenceControl) -> Pending:
        """Admit a request into its sequence's queue (or raise at once) and return its pending entry."""
        if self._stopping:
            raise ShuttingDown(f"Model {self.settings.name!r} is unloading")
        seq, replaces = self.sequences.admit(control)
        loop = asyncio.get_running_loop()
        pending = Pending(request, control, seq, next(self._arrivals), loop.create_future(), replaces)
        pending.future.add_done_callback(self._on_done(pending))
        seq.queue.append(pending)
        self.sequences.queued += 1
        seq.stop_idle()
        if control.start and self.life_s:
            if seq.life_timer is not None:
                seq.life_timer.cancel()
            seq.life_timer = loop.call_later(self.life_s, self._on_lifetime, seq)
        if seq.running is None and not seq.in_ready:
            self._push(seq)
        return pending

    def _on_done(self, pending: Pending) -> Callable[[asyncio.Future[InferenceResponse]], None]:
        def done(future: asyncio.Future[InferenceResponse]) -> None:
            if future.cancelled():
                self._cancelled(pending)

        return done

    def stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse | RequestFailed]:
        return serve_stream(self, requests)

    # ------------------------------------------------------------------ the ready heap

    def _push(self, seq: Sequence) -> None:
        seq.in_ready = True
        heapq.heappush(self._ready, (seq.queue[0].arrival, seq))
        self._wake.set()

    def _take(self, limit: int) -> list[Pending]:
        """Up to ``limit`` head requests of ready sequences, oldest first; each sequence becomes running."""
        taken: list[Pending] = []
        sequences = self.sequences
        while self._ready and len(taken) < limit:
            arrival, seq = heapq.heappop(self._ready)
            seq.in_ready = False
            if seq.running is not None or not seq.queue or not sequences.current(seq):
                continue
            head = seq.queue[0]
            if head.future.done():  # cancelled, its callback not yet run
                self._cancelled(head)
                continue
            if head.arrival != arrival:
                self._push(seq)
                continue
            seq.queue.popleft()
            sequences.queued -= 1
            head.running = True
            seq.running = head
            taken.append(head)
        return taken

    # ------------------------------------------------------------------ the worker

    async def _work(self) -> None:
        while True:
            batch: list[Pending] = []
            try:
                await self._drain_notices()
                batch = self._take(self.max_batch)
                if not batch:
                    self._wake.clear()
                    if self._ready or self._notices:
                        continue
                    self._quiet.set()
                    await self._wake.wait()
                    continue
                self._quiet.clear()
                await self._fill(batch)
                await self._run_batch(batch)
            except Exception as exc:  # a bug or a failing state store: fail the batch, keep serving
                logger.exception("Sequence batcher of model %r failed", self.settings.name)
                self._abandon(batch, exc)

    async def _fill(self, batch: list[Pending]) -> None:
        """Wait up to ``max_batch_time`` for more ready sequences, unless no other sequence is open."""
        if self.max_wait <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        while len(batch) < self.max_batch and len(self.sequences.active) > len(batch):
            more = self._take(self.max_batch - len(batch))
            if more:
                batch += more
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining)
            except asyncio.TimeoutError:
                return

    async def _run_batch(self, batch: list[Pending]) -> None:
        await self._drain_notices()
        for pending in batch:
            seq = pending.sequence
            if pending.control.start and seq.live:
                seq.live = False
                await self._tell(seq.key, pending.replaces or "restart", await self.store.pop(seq.key))
        keys = [p.control.key for p in batch if not p.control.start]
        loaded = iter(await self.store.load(keys)) if keys else iter(())
        steps = [
            SequenceStep(
                p.request,
                p.control.key,
                p.control.start,
                p.control.end,
                None if p.control.start else next(loaded),
            )
            for p in batch
        ]
        for pending in batch:
            pending.sequence.live = True
        self._running = len(batch)
        self.batches += 1
        self.steps += len(batch)
        self.stats.executed(len(batch))
        self.largest_batch = max(self.largest_batch, len(batch))
        try:
            results = list(await self.seq_model.predict_sequences(steps))
            if len(results) != len(steps):
                error = ModelFailed(
                    f"Model {self.settings.name!r} returned {len(results)} results for {len(steps)} sequence steps"
                )
                results = [error] * len(steps)
        except Exception as exc:
            results = [exc] * len(steps)
        finally:
            self._running = 0

        # keep the new states, then answer the callers (a state that could not be kept fails its
        # batch rather than leave a sequence to go on from a stale state), then tell the model of
        # the sequences that ended: END is served first, then the model is told
        ok = [isinstance(result, InferenceResponse) for result in results]
        ends = [
            step.ends if good else pending.control.end
            for pending, step, good in zip(batch, steps, ok, strict=True)
        ]
        keep = [
            (step.sequence_id, step.state)
            for step, good, ended in zip(steps, ok, ends, strict=True)
            if good and not ended
        ]
        evicted = await self.store.save(keep) if keep else []
        for pending, result, ended in zip(batch, results, ends, strict=True):
            if pending.future.done():
                continue
            if isinstance(result, InferenceResponse):
                mark_response(result, pending.control, ended)
                pending.future.set_result(result)
            else:
                pending.future.set_exception(_as_error(result, self.settings.name))

        for pending, step, ended, result in zip(batch, steps, ends, results, strict=True):
            seq = pending.sequence
            if pending.future.cancelled():  # the caller left while it ran; its callback may not have run yet
                self._cancelled(pending)
            seq.running = None
            pending.running = False
            if ended:
                popped = await self.store.pop(seq.key)
                await self._end(seq, "end", step.state if isinstance(result, InferenceResponse) else popped)
            elif seq.pending_end == "cancel" or (seq.pending_end == "timeout" and not seq.queue):
                await self._end(seq, seq.pending_end, await self.store.pop(seq.key))
            elif seq.queue:
                if not seq.in_ready:
                    self._push(seq)
            elif self.idle_s and seq.live:
                seq.idle_timer = asyncio.get_running_loop().call_later(self.idle_s, self._on_idle, seq)
        for key, state in evicted:
            seq_or_none = self.sequences.active.get(key)
            if seq_or_none is not None and seq_or_none.live:
                await self._end(seq_or_none, "eviction", state)
        self._quiet.set()

    async def _end(self, seq: Sequence, reason: EndReason, state: Any) -> None:
        """End a sequence that is not running: tell the model, then fail or keep what is queued."""
        seq.stop_idle()
        if seq.live:
            seq.live = False
            await self._tell(seq.key, reason, state)
        if seq.running is None:
            self.sequences.settle(seq, reason)
            if seq.queue and not seq.in_ready:
                self._push(seq)

    def _abandon(self, batch: list[Pending], exc: Exception) -> None:
        """After an unexpected failure: fail what was not answered and put the sequences back in play."""
        for pending in batch:
            if not pending.running:
                continue  # already settled before the failure
            seq = pending.sequence
            if pending.future.cancelled():
                self._cancelled(pending)
            seq.running = None
            pending.running = False
            if not pending.future.done():
                pending.future.set_exception(_as_error(exc, self.settings.name))
            if not self.sequences.current(seq):
                continue
            if seq.pending_end == "cancel" or (seq.pending_end == "timeout" and not seq.queue):
                self._end_soon(seq, seq.pending_end)
            elif seq.queue:
                if not seq.in_ready:
                    self._push(seq)
            elif self.idle_s and seq.live and seq.idle_timer is None:
                seq.idle_timer = asyncio.get_running_loop().call_later(self.idle_s, self._on_idle, seq)

    async def _tell(self, key: str, reason: EndReason, state: Any) -> None:
        self.sequences.ended_by[reason] += 1
        try:
            await self.seq_model.sequence_ended(key, reason, state)
        except Exception:
            logger.exception("Model %r failed in sequence_ended(%r, %r)", self.settings.name, key, reason)

    async def _drain_notices(self) -> None:
        while self._notices:
            key, reason = self._notices.popleft()
            await self._tell(key, reason, await self.store.pop(key))

    # ------------------------------------------------------------------ endings decided outside the worker

    def _end_soon(self, seq: Sequence, reason: EndReason, *, everything: bool = False) -> None:
        """End a sequence that is not running, from a timer or a cancellation (the worker tells the model)."""
        seq.stop_idle()
        if seq.live:
            seq.live = False
            self._notices.append((seq.key, reason))
            self._wake.set()
        self.sequences.settle(seq, reason, everything=everything)
        if seq.queue and not seq.in_ready:
            self._push(seq)

    def _cancelled(self, pending: Pending) -> None:
        """A caller gave up on ``pending``: cancel its sequence (once)."""
        seq = pending.sequence
        if not self.sequences.current(seq):
            return
        if pending in seq.queue:
            seq.queue.remove(pending)
            self.sequences.queued -= 1
        elif not pending.running:
            return  # already answered or already cancelled
        if seq.closed == "cancel" and seq.pending_end == "cancel":
            return
        seq.closed = "cancel"
        if seq.running is None:
            self._end_soon(seq, "cancel", everything=True)
        else:
            seq.pending_end = "cancel"
            self.sequences.settle(seq, "cancel", everything=True)

    def _busy(self, seq: Sequence) -> bool:
        return seq.running is not None

    # ------------------------------------------------------------------ metadata

    def describe(self) -> dict[str, Any]:
        s = self.settings
        seqs = self.sequences
        return {
            "scheduler": "sequence",
            "max_batch_size": self.max_batch,
            "max_batch_time": self.max_wait,
            "max_sequences": s.max_sequences,
            "max_sequence_queue_size": s.max_sequence_queue_size,
            "max_sequence_idle_ms": s.max_sequence_idle_ms,
            "sequence_timeout_ms": s.sequence_timeout_ms,
            "sequence_state_capacity": self.store.capacity,
            "sequence_ended_memory": s.sequence_ended_memory,
            "stateless_requests": self.stateless.describe() if self.stateless is not None else "refused",
            "stats": {
                "open_sequences": len(seqs.active),
                "queued_requests": seqs.queued,
                "running_requests": self._running,
                "states_held": len(self.store),
                "batches": self.batches,
                "steps": self.steps,
                "largest_batch": self.largest_batch,
                "ended": dict(seqs.ended_by),
                "rejected": dict(seqs.rejected),
            },
        }


def _as_error(result: Any, model: str) -> Exception:
    if isinstance(result, Exception):
        return result
    if isinstance(result, BaseException):
        return RuntimeError(f"{type(result).__name__}: {result}")
    return ModelFailed(
        f"Model {model!r} returned a {type(result).__name__} for a sequence step, not an InferenceResponse"
    )
