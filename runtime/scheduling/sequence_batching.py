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
sees a fresh sequence with the same id. The lifecycle (admission, queues, timers, endings, the
state store) is ``runtime.sequences.engine.SequenceEngine`` (with a store that replicas share,
``runtime.sequences.replicated.ReplicatedEngine``); this module adds the batches, with the strategy
of ``.one_in_flight`` (one request of a sequence in flight).

Cancellation: when a caller gives up on a request of a sequence (a client disconnects, a gRPC call
is cancelled), the sequence is cancelled, as Triton does: its other queued requests fail with
``Cancelled``, the model is told (reason ``cancel``) once nothing of it runs, and later requests to
the id are refused with 400 saying it was cancelled. A stateful sequence that has lost a step cannot
go on as if nothing happened.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime.errors import InvalidInput, ModelFailed, ShuttingDown
from runtime.model import MLModel
from runtime.scheduling import gc_threshold
from runtime.scheduling.executor import Executor
from runtime.scheduling.one_in_flight import OneInFlight
from runtime.scheduling.scheduler import Scheduler, StreamError
from runtime.scheduling.sequence_streams import serve_stream
from runtime.sequences.engine import STORED
from runtime.sequences.identity import SequenceControl, mark_response, parse_control
from runtime.sequences.lifecycle import Pending, Sequences
from runtime.sequences.replicated import make_engine
from runtime.sequences.sequence_model import SequenceModel, SequenceStep
from runtime.sequences.store import StateStore
from runtime.settings import ModelSettings
from runtime.telemetry.tracing import batch_span
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

_QUEUED_AT = operator.attrgetter("queued_at")


class SequenceScheduler(Scheduler):
    """The sequence batcher of one model."""

    def __init__(
        self,
        model: MLModel,
        settings: ModelSettings,
        store: StateStore | None = None,
        stateless: Scheduler | None = None,
        executor: Executor | None = None,
    ) -> None:
        super().__init__(model, settings, executor)
        if not isinstance(model, SequenceModel):
            raise TypeError(
                f"{type(model).__qualname__} is served with sequence_batching, so it must subclass "
                "runtime.SequenceModel and implement predict_sequences"
            )
        self.seq_model: SequenceModel = model
        self._wake = asyncio.Event()
        self.strategy = OneInFlight(self._wake)
        # in worker processes, each sequence's steps run in the worker that holds its state
        self._predict_sequences = self.executor.predict_sequences
        self.engine = make_engine(settings, self.executor.sequence_ended, self.strategy, store)
        self.executor.on_lost(self._lost)
        self.strategy.engine = self.engine
        self.max_batch = max(1, settings.max_batch_size)
        self.max_wait = settings.max_batch_time
        self.stateless = stateless
        """Serves requests outside any sequence (None: the model answers them 400)."""
        self._quiet = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._stopping = False
        self._running = 0
        self.batches = 0
        self.steps = 0
        self.largest_batch = 0
        self._holds_collector = False

    @property
    def sequences(self) -> Sequences:
        """The engine's table of open sequences."""
        return self.engine.table

    @property
    def store(self) -> StateStore:
        return self.engine.store

    @store.setter
    def store(self, store: StateStore) -> None:
        self.engine.store = store

    # ------------------------------------------------------------------ lifecycle of the scheduler

    async def start(self) -> None:
        if self.stateless is not None:
            await self.stateless.start()
        self._worker = asyncio.create_task(self._work(), name=f"sequence-batcher:{self.settings.name}")
        if not self._holds_collector:
            self._holds_collector = True
            gc_threshold.hold()

    async def stop(self) -> None:
        """Refuse new requests, run the accepted ones, then end every open sequence (reason ``unload``)."""
        self._stopping = True
        while self._worker is not None and (self.sequences.queued or self._running or self.engine.notices):
            self._quiet.clear()
            self._wake.set()
            await self._quiet.wait()
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        try:
            await self.engine.stop()
            if self.stateless is not None:
                await self.stateless.stop()
        finally:
            if self._holds_collector:
                self._holds_collector = False
                gc_threshold.release()

    def _lost(self, keys: list[str], why: str) -> None:
        """The worker that held these sequences died: they end (reason ``worker_lost``)."""
        for key in keys:
            self.engine.lose(key)
        logger.warning("Model %r lost %d sequence(s): %s", self.settings.name, len(keys), why)

    async def hand_over(self) -> None:
        await self.engine.hand_over()

    # ------------------------------------------------------------------ requests

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        control = parse_control(request.parameters)
        if control is None:
            return await self.serve_stateless(request)
        if self._stopping:
            raise ShuttingDown(f"Model {self.settings.name!r} is unloading")
        pending = self.engine.admit(request, control)
        try:
            return await pending.future
        except asyncio.CancelledError:
            self._forget_cancelled(pending)  # here in the caller: no done callback per request
            raise

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
        pending = self.engine.admit(request, control)
        pending.future.add_done_callback(self._on_done(pending))
        return pending

    def has_room(self, key: str) -> bool:
        """Whether the sequence ``key`` (if open) may queue one more request."""
        seq = self.engine.get(key)
        return seq is None or len(seq.queue) < self.sequences.max_queue

    def _on_done(self, pending: Pending) -> Callable[[asyncio.Future[InferenceResponse]], None]:
        return lambda _: self._forget_cancelled(pending)

    def _forget_cancelled(self, pending: Pending) -> None:
        """Take a request whose caller left (its future cancelled) out of its sequence."""
        if pending.future.cancelled():
            self.engine.cancel(pending)

    def stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse | StreamError]:
        return serve_stream(self, requests)

    # ------------------------------------------------------------------ the worker

    async def _work(self) -> None:
        while True:
            batch: list[Pending] = []
            try:
                await self.engine.deliver_notices()
                batch = self.strategy.take(self.max_batch)
                if not batch:
                    self._wake.clear()
                    if len(self.strategy) or self.engine.notices:
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
            more = self.strategy.take(self.max_batch - len(batch))
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
        engine = self.engine
        await engine.deliver_notices()
        # retried and out-of-order steps are answered here; with a shared store, each sequence is claimed
        runs = await engine.prepare(batch)
        if not runs:
            self._quiet.set()
            return
        batch = []
        steps = []
        for pending, state in runs:
            control = pending.control
            batch.append(pending)
            steps.append(SequenceStep(pending.request, control.key, control.start, control.end, state))
            pending.sequence.live = True
        self._running = len(batch)
        self.batches += 1
        self.steps += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        start = time.monotonic()
        try:
            with batch_span(self.settings.name, self.batches, batch, _QUEUED_AT):
                results = list(await self._predict_sequences(steps))
            if len(results) != len(steps):
                error = ModelFailed(
                    f"Model {self.settings.name!r} returned {len(results)} results for {len(steps)} sequence steps"
                )
                results = [error] * len(steps)
        except Exception as exc:
            results = [exc] * len(steps)
        finally:
            self._running = 0
            compute = time.monotonic() - start

        # keep the new states, then answer the callers (a state that could not be kept fails its
        # batch rather than leave a sequence to go on from a stale state), then tell the model of
        # the sequences that ended: END is served first, then the model is told
        replica = engine.replica
        ends = []
        for pending, step, result in zip(batch, steps, results, strict=True):
            if isinstance(result, InferenceResponse):
                ended = step.ends
                mark_response(result, pending.control, ended, replica)
            else:
                ended = pending.control.end
            ends.append(ended)
        evicted = await engine.commit(batch, steps, results, ends)
        ok = [isinstance(result, InferenceResponse) for result in results]
        served = [pending for pending, good in zip(batch, ok, strict=True) if good]
        if served:  # the steps that failed count as failures alone
            self.stats.executed(len(served), sum(start - p.queued_at for p in served), compute)
        for pending, result in zip(batch, results, strict=True):
            if pending.future.done():
                continue
            if isinstance(result, InferenceResponse):
                pending.future.set_result(result)
            else:
                pending.future.set_exception(_as_error(result, self.settings.name))

        for pending, step, ended, good in zip(batch, steps, ends, ok, strict=True):
            seq = pending.sequence
            if pending.future.cancelled():  # the caller left while it ran; its callback may not have run yet
                engine.cancel(pending)
            seq.running = None
            pending.running = False
            if not ended and seq.pending_end is None:
                engine.goes_on(seq)  # what finished does then, without a coroutine per step
            else:
                # a kept (or failed, so unchanged) state is the store's; an ending step's is its own
                await engine.finished(seq, ended=ended, state=step.state if good and ended else STORED)
        await engine.end_evicted(evicted)
        self._quiet.set()

    def _abandon(self, batch: list[Pending], exc: Exception) -> None:
        """After an unexpected failure: fail what was not answered and put the sequences back in play."""
        for pending in batch:
            if not pending.running:
                continue  # already settled before the failure
            seq = pending.sequence
            if pending.future.cancelled():
                self.engine.cancel(pending)
            seq.running = None
            pending.running = False
            if not pending.future.done():
                pending.future.set_exception(_as_error(exc, self.settings.name))
            self.engine.released(seq)

    # ------------------------------------------------------------------ metadata

    def open_sequences(self) -> int:
        return len(self.engine.table.active)

    def describe(self) -> dict[str, Any]:
        return {
            "scheduler": "sequence",
            "max_batch_size": self.max_batch,
            "max_batch_time": self.max_wait,
            **self.engine.describe(),
            "stateless_requests": self.stateless.describe() if self.stateless is not None else "refused",
            "stats": {
                **self.engine.stats(),
                "running_requests": self._running,
                "batches": self.batches,
                "steps": self.steps,
                "largest_batch": self.largest_batch,
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
