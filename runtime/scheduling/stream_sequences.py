"""Sequences in a continuous batch: many streams of one sequence may run at once.

The continuous batcher of a model with ``sequence_batching`` uses the sequence machinery of
``runtime.sequences`` as it is (identity, the table of open sequences and its admission rules, the
state store, the model's ``sequence_ended`` hook); what differs from the sequence batcher is when a
request runs. There, a sequence has at most one request in flight; here, a request joins the
running set as soon as there is a slot, even while earlier requests of its sequence still stream,
so that a "cancel" or "update" request reaches the model during a stream (TorchServe's sequence
continuous batching). The rules:

- **Order.** Requests of one sequence join in arrival order; within a step, a sequence's streams
  come in that order. A START on an id whose streams still run waits until they have left; then
  the old sequence ends (the model is told, reason ``restart``) and the fresh one begins.
- **State.** When the first stream of a sequence joins, its state leaves the store (None on a
  START); all its running streams share it in memory (``stream.sequence.state``); when the last one
  leaves, the state goes back to the store (which may evict another sequence's: that one ends,
  reason ``eviction``, and its next request is refused).
- **Ending.** A sequence ends once a stream whose request had ``sequence_end`` (or whose model
  called ``end_sequence()``) has finished and none of the sequence's streams runs; its last chunk
  carries ``sequence_end: true``. Idle and lifetime timeouts apply as with the sequence batcher,
  the idle one counting only while nothing of the sequence runs or waits.
- **Cancellation.** When a caller gives up on a request of a sequence (a client disconnects, a gRPC
  call is cancelled) or a request of it times out in the queue, the sequence is cancelled, as with
  the sequence batcher: its waiting requests fail with ``Cancelled``, so do its other running
  streams (in band), the model is told (reason ``cancel``) and later requests to the id get 400.

Every call here comes from the batcher's stepper task, except ``admit`` and ``cancel`` (the
caller's task; they never await) and the timers (which leave notices for the stepper).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from ..continuous import ContinuousModel, SequenceState, StreamSequence
from ..errors import Cancelled
from ..sequences.identity import SequenceControl
from ..sequences.lifecycle import Pending, Sequence, Sequences, TimerRules
from ..sequences.model import EndReason
from ..sequences.store import LRUStateStore, StateStore
from ..settings import ModelSettings
from ..types import InferenceResponse
from .callers import Entry

logger = logging.getLogger(__name__)


class _Running(SequenceState):
    """A sequence with streams in the running set: its state, in memory while they run."""

    __slots__ = ("ending", "entries")

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.entries: dict[Entry, None] = {}
        self.ending = False
        """A stream that ends the sequence has finished: it ends once none of its streams runs."""


class StreamSequences(TimerRules):
    """The sequences of one continuously batched model; see the module docstring."""

    def __init__(
        self,
        model: ContinuousModel,
        settings: ModelSettings,
        wake: Callable[[], None],
        store: StateStore | None = None,
    ) -> None:
        self.model = model
        self.name = settings.name
        self.sequences = Sequences(
            settings.name,
            settings.max_sequences,
            settings.max_sequence_queue_size,
            settings.sequence_ended_memory,
        )
        self.store = store or LRUStateStore(settings.sequence_state_capacity or settings.max_sequences)
        self.idle_s = settings.max_sequence_idle_ms / 1000
        self.life_s = settings.sequence_timeout_ms / 1000
        self._wake = wake
        self._running: dict[Sequence, _Running] = {}
        self._notices: deque[tuple[str, EndReason]] = deque()
        self._arrivals = itertools.count()

    # ------------------------------------------------------------------ arrival (the caller's task)

    def admit(self, entry: Entry, control: SequenceControl) -> None:
        """Admit a request into its sequence (or raise at once: 400 or 503 by the sequence rules)."""
        seq, replaces = self.sequences.admit(control)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferenceResponse] = loop.create_future()
        pending = Pending(entry.request, control, seq, next(self._arrivals), future, replaces)
        entry.pending = pending
        seq.queue.append(pending)
        self.sequences.queued += 1
        seq.stop_idle()
        if control.start and self.life_s:
            if seq.life_timer is not None:
                seq.life_timer.cancel()
            seq.life_timer = loop.call_later(self.life_s, self._on_lifetime, seq)

    def withdraw(self, entry: Entry) -> None:
        """Take a request that never joined out of its sequence's queue (admission failed later)."""
        pending = entry.pending
        if pending is not None and pending in pending.sequence.queue:
            pending.sequence.queue.remove(pending)
            self.sequences.queued -= 1

    def may_join(self, entry: Entry) -> bool:
        """Whether a waiting request of a sequence may join now (a START waits for the old streams)."""
        pending = entry.pending
        assert pending is not None
        return not (pending.control.start and pending.sequence in self._running)

    # ------------------------------------------------------------------ in the stepper

    async def join(self, entry: Entry) -> None:
        """The request joins the running set: give its stream the sequence and its state."""
        pending = entry.pending
        assert pending is not None
        seq, control = pending.sequence, pending.control
        self.withdraw(entry)
        running = self._running.get(seq)
        if running is None:
            if control.start:
                if seq.live:  # a START on an open id: the old sequence ends now
                    seq.live = False
                    await self._tell(seq.key, pending.replaces or "restart", await self.store.pop(seq.key))
                state = None
            else:
                state = await self.store.pop(seq.key)  # in memory while its streams run
            running = self._running[seq] = _Running(state)
            seq.live = True
        running.entries[entry] = None
        seq.running = pending
        pending.running = True
        entry.stream.sequence = StreamSequence(control.key, control.start, control.end, running)

    async def left(self, entry: Entry, finished: bool) -> None:
        """A stream of a sequence left the running set (``finished``: it produced its last chunk)."""
        pending, view = entry.pending, entry.stream.sequence
        if pending is None or view is None:
            return  # it never joined
        seq = pending.sequence
        running = self._running.get(seq)
        if running is None or entry not in running.entries:
            return
        del running.entries[entry]
        pending.running = False
        if finished and view.ends:
            running.ending = True
        if running.entries:
            seq.running = next(iter(running.entries)).pending
            return
        del self._running[seq]
        seq.running = None
        if running.ending:
            await self._end(seq, "end", running.state)
        elif seq.pending_end == "cancel" or (seq.pending_end == "timeout" and not seq.queue):
            await self._end(seq, seq.pending_end, running.state)
        else:
            for key, state in await self.store.save([(seq.key, running.state)]):
                evicted = self.sequences.active.get(key)
                if evicted is not None and evicted.live and evicted not in self._running:
                    await self._end(evicted, "eviction", state)
            if not seq.queue and self.idle_s and self.sequences.current(seq):
                seq.idle_timer = asyncio.get_running_loop().call_later(self.idle_s, self._on_idle, seq)
        if seq.queue:
            self._wake()  # a START may have been waiting for these streams to leave

    async def deliver_notices(self) -> None:
        """Tell the model of the endings decided outside the stepper (timers, cancellations)."""
        while self._notices:
            key, reason = self._notices.popleft()
            await self._tell(key, reason, await self.store.pop(key))

    async def stop(self) -> None:
        """End every open sequence (reason ``unload``), once nothing runs."""
        await self.deliver_notices()
        for seq in list(self.sequences.active.values()):
            seq.stop_timers()
            if seq.live:
                seq.live = False
                running = self._running.pop(seq, None)
                state = running.state if running is not None else await self.store.pop(seq.key)
                await self._tell(seq.key, "unload", state)
            seq.running = None
            self.sequences.settle(seq, "unload", everything=True)
        await self.store.clear()

    # ------------------------------------------------------------------ cancellation (any task)

    def cancel(self, entry: Entry) -> list[Entry]:
        """A caller gave up on a request of a sequence: cancel the sequence. Returns its other
        running streams, which the batcher ends with ``Cancelled``."""
        pending = entry.pending
        if pending is None:
            return []
        self.withdraw(entry)
        seq = pending.sequence
        if not self.sequences.current(seq) or (seq.closed == "cancel" and seq.pending_end == "cancel"):
            return []
        seq.closed = "cancel"
        running = self._running.get(seq)
        if running is None:
            self._end_soon(seq, "cancel")
            return []
        seq.pending_end = "cancel"
        self.sequences.settle(seq, "cancel", everything=True)
        return [other for other in running.entries if other is not entry]

    def cancelled_error(self, entry: Entry) -> Cancelled:
        echo = entry.pending.control.echo if entry.pending is not None else entry.stream.id
        return Cancelled(
            f"Cancelled: another request of sequence {echo!r} was cancelled, which cancels the sequence"
        )

    # ------------------------------------------------------------------ endings

    async def _end(self, seq: Sequence, reason: EndReason, state: Any) -> None:
        """End a sequence none of whose streams runs: tell the model, then settle what waits."""
        seq.stop_idle()
        await self.store.pop(seq.key)
        if seq.live:
            seq.live = False
            await self._tell(seq.key, reason, state)
        self.sequences.settle(seq, reason)

    def _end_soon(self, seq: Sequence, reason: EndReason) -> None:
        """End a sequence none of whose streams runs, from a timer or a cancellation."""
        seq.stop_idle()
        if seq.live:
            seq.live = False
            self._notices.append((seq.key, reason))
            self._wake()
        self.sequences.settle(seq, reason, everything=reason == "cancel")

    def _busy(self, seq: Sequence) -> bool:
        return seq in self._running

    async def _tell(self, key: str, reason: EndReason, state: Any) -> None:
        self.sequences.ended_by[reason] += 1
        try:
            await self.model.sequence_ended(key, reason, state)
        except Exception:
            logger.exception("Model %r failed in sequence_ended(%r, %r)", self.name, key, reason)

    # ------------------------------------------------------------------ metadata

    def describe(self, settings: ModelSettings) -> dict[str, Any]:
        seqs = self.sequences
        return {
            "sequence_batching": True,
            "max_sequences": settings.max_sequences,
            "max_sequence_queue_size": settings.max_sequence_queue_size,
            "max_sequence_idle_ms": settings.max_sequence_idle_ms,
            "sequence_timeout_ms": settings.sequence_timeout_ms,
            "sequence_state_capacity": self.store.capacity,
            "sequence_ended_memory": settings.sequence_ended_memory,
            "sequence_stats": {
                "open_sequences": len(seqs.active),
                "queued_requests": seqs.queued,
                "running_sequences": len(self._running),
                "states_held": len(self.store),
                "ended": dict(seqs.ended_by),
                "rejected": dict(seqs.rejected),
            },
        }
