"""The sequence lifecycle engine: one of it per model that serves sequences, whatever batches them.

It holds the table of open sequences (``lifecycle.Sequences``: admission, the queue per sequence
and its bound, the memory of recent endings), the state store (only through ``StateStore``), the
idle and lifetime timers, and every ending: it tells the model (``sequence_ended``, always with the
reason) and settles what waits. What differs between schedulers is *when* a request runs; that is a
``SequenceStrategy`` plugged into the engine:

- sequence batching (``runtime.scheduling.batch_strategy``): at most one request of a sequence in
  flight, one per batch; the state stays in the store while a step runs;
- continuous batching (``runtime.scheduling.running_set_strategy``): each request is a stream
  that joins a running set, several of one sequence at once, sharing the state in memory.

Threading: every method runs on the event loop. ``admit``, ``withdraw``, ``cancel`` and the timers
never await (they run in callers' tasks and callbacks); an ending they decide is left as a notice
that the scheduler's worker delivers (``deliver_notices``) before it runs anything else, so the
model hears of an ending before it sees a fresh sequence with the same id. Everything that awaits
(the store, the model's hook) runs in that one worker, so neither needs locks.

The engine owns the sequences' counters (``stats``: open, queued, states held, ended by reason,
refused by reason) and answers which sequences it holds (``get``), which is what a router in
front of several worker processes, each with its own engine, needs for sequence affinity.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from ..settings import ModelSettings
from ..types import InferenceRequest
from .identity import SequenceControl
from .lifecycle import Pending, Sequence, Sequences
from .sequence_model import EndReason
from .store import LRUStateStore, StateStore

logger = logging.getLogger(__name__)

EndedHook = Callable[[str, EndReason, Any], Awaitable[None]]
"""The model's ``sequence_ended(sequence_id, reason, state)``."""


STORED: Final[Any] = object()
"""As a state argument: "the one in the store" (taken out of it)."""


class SequenceStrategy(Protocol):
    """When a scheduler runs a sequence's requests: what the engine asks of it."""

    def busy(self, seq: Sequence) -> bool:
        """Whether a request of ``seq`` runs now (its state may be held outside the store)."""

    def ready(self, seq: Sequence) -> None:
        """``seq`` runs nothing and has a waiting request: let the worker consider it."""

    def wake(self) -> None:
        """A notice waits: wake the worker so that it delivers it."""

    def detach(self, seq: Sequence) -> tuple[bool, Any]:
        """At unload: forget what runs of ``seq``; (True, state) when its state is held outside the store."""


class SequenceEngine:
    """The lifecycle of a model's sequences; see the module docstring."""

    def __init__(
        self,
        settings: ModelSettings,
        ended: EndedHook,
        strategy: SequenceStrategy,
        store: StateStore | None = None,
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.table = Sequences(
            settings.name,
            settings.max_sequences,
            settings.max_sequence_queue_size,
            settings.sequence_ended_memory,
        )
        """Open sequences, recently ended ids, the admission rules and their counters."""
        if store is None:
            store = LRUStateStore(settings.sequence_state_capacity or settings.max_sequences)
        self.store = store
        self.idle_s = settings.max_sequence_idle_ms / 1000
        self.life_s = settings.sequence_timeout_ms / 1000
        self.strategy = strategy
        self._ended = ended
        self._notices: deque[tuple[str, EndReason]] = deque()
        self._arrivals = itertools.count()

    # ------------------------------------------------------------------ lookups

    def get(self, key: str) -> Sequence | None:
        """The open sequence with this key (the one place to ask which sequences this engine holds)."""
        return self.table.active.get(key)

    def current(self, seq: Sequence) -> bool:
        return self.table.current(seq)

    @property
    def notices(self) -> int:
        """Endings decided but not yet told to the model."""
        return len(self._notices)

    # ------------------------------------------------------------------ arrival (never awaits)

    def admit(self, request: InferenceRequest, control: SequenceControl) -> Pending:
        """Queue a request in its sequence (or raise at once: 400 or 503 by the sequence rules)."""
        seq, replaces = self.table.admit(control)
        loop = asyncio.get_running_loop()
        pending = Pending(request, control, seq, next(self._arrivals), loop.create_future(), replaces)
        seq.queue.append(pending)
        self.table.queued += 1
        seq.stop_idle()
        if control.start and self.life_s:
            if seq.life_timer is not None:
                seq.life_timer.cancel()
            seq.life_timer = loop.call_later(self.life_s, self._on_lifetime, seq)
        if not self.strategy.busy(seq):
            self.strategy.ready(seq)
        return pending

    def withdraw(self, pending: Pending) -> bool:
        """Take a request out of its sequence's queue (it runs now, or never); False if it was not there."""
        queue = pending.sequence.queue
        if pending not in queue:
            return False
        queue.remove(pending)
        self.table.queued -= 1
        return True

    def cancel(self, pending: Pending) -> bool:
        """A caller gave up on ``pending``: cancel its sequence (once). Its waiting requests fail with
        ``Cancelled``; the model is told (reason ``cancel``) once nothing of it runs. Returns True when
        requests of the sequence still run (the strategy ends them)."""
        seq = pending.sequence
        if not self.current(seq):
            return False
        if not self.withdraw(pending) and not pending.running:
            return False  # already answered or already cancelled
        if seq.closed == "cancel" and seq.pending_end == "cancel":
            return False
        seq.closed = "cancel"
        if not self.strategy.busy(seq):
            self.end_soon(seq, "cancel", everything=True)
            return False
        seq.pending_end = "cancel"
        self.table.settle(seq, "cancel", everything=True)
        return True

    def lose(self, key: str) -> None:
        """The worker process that held ``key``'s state died: the sequence ends (reason
        ``worker_lost``). Its queued requests fail, and its next request is refused saying why,
        never started afresh; a step that was running fails by itself (``WorkerLost``)."""
        seq = self.get(key)
        if seq is None:
            return
        seq.closed = "worker_lost"
        if not self.strategy.busy(seq):
            self.end_soon(seq, "worker_lost")
            return
        seq.pending_end = "worker_lost"
        self.table.settle(seq, "worker_lost")

    # ------------------------------------------------------------------ running (the worker)

    async def opening(self, pending: Pending) -> None:
        """``pending`` is about to run: on a START to an id the model still holds, the old sequence
        ends first (reason ``restart``, or the reason it was already ending for)."""
        seq = pending.sequence
        if pending.control.start and seq.live:
            seq.live = False
            await self.tell(seq.key, pending.replaces or "restart", await self.store.pop(seq.key))

    async def finished(self, seq: Sequence, *, ended: bool, state: Any = STORED, keep: bool = False) -> None:
        """Nothing of ``seq`` runs any more: end it (it ``ended``, or an ending waits for this), or keep
        ``state`` in the store when ``keep`` and let its next request run (or its idle time start)."""
        if ended:
            await self.end(seq, "end", state)
        elif seq.pending_end in ("cancel", "worker_lost") or (seq.pending_end == "timeout" and not seq.queue):
            await self.end(seq, seq.pending_end, state)
        else:
            if keep:
                await self.end_evicted(await self.store.save([(seq.key, state)]))
            if seq.queue:
                self.strategy.ready(seq)
            elif self.idle_s and seq.live and self.current(seq):
                self._start_idle(seq)

    def released(self, seq: Sequence) -> None:
        """Like ``finished`` without awaiting (after an unexpected failure): endings become notices."""
        if not self.current(seq):
            return
        if seq.pending_end in ("cancel", "worker_lost") or (seq.pending_end == "timeout" and not seq.queue):
            self.end_soon(seq, seq.pending_end)
        elif seq.queue:
            self.strategy.ready(seq)
        elif self.idle_s and seq.live and seq.idle_timer is None:
            self._start_idle(seq)

    async def end_evicted(self, evicted: list[tuple[str, Any]]) -> None:
        """The store dropped these states to make room: their sequences end (reason ``eviction``)."""
        for key, state in evicted:
            seq = self.get(key)
            if seq is not None and seq.live and not self.strategy.busy(seq):
                await self.end(seq, "eviction", state)

    async def end(self, seq: Sequence, reason: EndReason, state: Any = STORED) -> None:
        """End ``seq`` now (from the worker): its state leaves the store, the model is told, and
        once nothing of it runs its queued requests fail (up to a waiting START)."""
        seq.stop_idle()
        stored = await self.store.pop(seq.key)
        if seq.live:
            seq.live = False
            await self.tell(seq.key, reason, stored if state is STORED else state)
        if not self.strategy.busy(seq):
            self.table.settle(seq, reason)
            if seq.queue:
                self.strategy.ready(seq)

    async def tell(self, key: str, reason: EndReason, state: Any) -> None:
        """Call the model's ``sequence_ended`` (counted by reason); its failure is logged, not raised."""
        self.table.ended_by[reason] += 1
        try:
            await self._ended(key, reason, state)
        except Exception:
            logger.exception("Model %r failed in sequence_ended(%r, %r)", self.name, key, reason)

    async def deliver_notices(self) -> None:
        """Tell the model of the endings decided outside the worker (timers, cancellations)."""
        while self._notices:
            key, reason = self._notices.popleft()
            await self.tell(key, reason, await self.store.pop(key))

    async def stop(self) -> None:
        """End every open sequence (reason ``unload``) and empty the store; call once nothing runs."""
        await self.deliver_notices()
        for seq in list(self.table.active.values()):
            seq.stop_timers()
            if seq.live:
                seq.live = False
                held, state = self.strategy.detach(seq)
                if not held:
                    state = await self.store.pop(seq.key)
                await self.tell(seq.key, "unload", state)
            seq.running = None
            self.table.settle(seq, "unload", everything=True)
        await self.store.clear()

    # ------------------------------------------------------------------ endings decided outside the worker

    def end_soon(self, seq: Sequence, reason: EndReason, *, everything: bool = False) -> None:
        """End a sequence that runs nothing, without awaiting: the worker tells the model later."""
        seq.stop_idle()
        if seq.live:
            seq.live = False
            self._notices.append((seq.key, reason))
            self.strategy.wake()
        self.table.settle(seq, reason, everything=everything)
        if seq.queue:
            self.strategy.ready(seq)

    def _start_idle(self, seq: Sequence) -> None:
        seq.idle_timer = asyncio.get_running_loop().call_later(self.idle_s, self._on_idle, seq)

    def _on_idle(self, seq: Sequence) -> None:
        """Idle time counts only while the sequence has nothing queued and nothing running."""
        seq.idle_timer = None
        if self.current(seq) and not self.strategy.busy(seq) and not seq.queue:
            self.end_soon(seq, "idle")

    def _on_lifetime(self, seq: Sequence) -> None:
        """A lifetime timeout lets the accepted requests finish and closes the sequence to later ones."""
        seq.life_timer = None
        if not self.current(seq):
            return
        if seq.closed is None:
            seq.closed = "timeout"
        if not self.strategy.busy(seq) and not seq.queue:
            self.end_soon(seq, "timeout")
        elif seq.pending_end is None:
            seq.pending_end = "timeout"

    # ------------------------------------------------------------------ metadata

    def describe(self) -> dict[str, Any]:
        """The sequence settings in force."""
        s = self.settings
        return {
            "max_sequences": s.max_sequences,
            "max_sequence_queue_size": s.max_sequence_queue_size,
            "max_sequence_idle_ms": s.max_sequence_idle_ms,
            "sequence_timeout_ms": s.sequence_timeout_ms,
            "sequence_state_capacity": self.store.capacity,
            "sequence_ended_memory": s.sequence_ended_memory,
        }

    def stats(self) -> dict[str, Any]:
        """The engine's counters: open sequences, queued requests, states held, endings and refusals."""
        table = self.table
        return {
            "open_sequences": len(table.active),
            "queued_requests": table.queued,
            "states_held": len(self.store),
            "ended": dict(table.ended_by),
            "rejected": dict(table.rejected),
        }
