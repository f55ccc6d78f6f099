"""The sequence lifecycle engine: one of it per model that serves sequences, whatever batches them.

It holds the table of open sequences (``lifecycle.Sequences``: admission, the queue per sequence
and its bound, the memory of recent endings), the state store (only through ``StateStore``), the
idle and lifetime timers (mixed in from ``timers.SequenceTimers``), and every ending: it tells the
model (``sequence_ended``, always with the reason) and settles what waits. What differs between
schedulers is *when* a request runs; that is a ``SequenceStrategy`` (``lifecycle``) plugged into
the engine:

- sequence batching (``runtime.scheduling.one_in_flight``): at most one request of a sequence in
  flight, one per batch; the state stays in the store while a step runs;
- continuous batching (``runtime.scheduling.continuous_sequences``): each request is a stream
  that joins a running set, several of one sequence at once, sharing the state in memory.

Threading: every method runs on the event loop. ``admit``, ``withdraw``, ``cancel`` and the timers
never await (they run in callers' tasks and callbacks); an ending they decide is left as a notice
that the scheduler's worker delivers (``deliver_notices``) before it runs anything else, so the
model hears of an ending before it sees a fresh sequence with the same id. Everything that awaits
(the store, the model's hook) runs in that one worker, so neither needs locks.

Exactly-once steps (mixed in from ``step_numbers.StepNumbers``): a client may number a sequence's steps (``sequence_step``: 1, 2, 3, ...). Before
a step runs (``prepare``), a retry of the last applied step gets that step's stored answer and
applies nothing, and a step that is not the next one is refused (409, ``SequenceStepConflict``, with
the expected number); after it (``commit``) the step count and the numbered step's answer are kept
with the state. A retry of the last step of a sequence that has since ended (recently enough to be
remembered) still gets its answer.

This engine keeps the states in this process (``LRUStateStore``). With a store that replicas share
(Redis), ``runtime.sequences.replicated.ReplicatedEngine`` adds the claims, leases and fenced
writes around the same hooks (``prepare``, ``commit``, ``checkpoint``, ``_record_end``,
``hand_over``); ``replicated.make_engine`` picks one from a model's settings.

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
from typing import Any, Final

from runtime.sequences.identity import SequenceControl
from runtime.sequences.lifecycle import Pending, Sequence, Sequences, SequenceStrategy
from runtime.sequences.sequence_model import EndReason, SequenceStep
from runtime.sequences.step_numbers import StepNumbers
from runtime.sequences.store import LRUStateStore, SharedStateStore, StateStore
from runtime.sequences.timers import SequenceTimers
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

EndedHook = Callable[[str, EndReason, Any], Awaitable[None]]
"""The model's ``sequence_ended(sequence_id, reason, state)``."""


STORED: Final[Any] = object()
"""As a state argument: "the one in the store" (taken out of it)."""


class SequenceEngine(SequenceTimers, StepNumbers):
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
        if store is None:
            if settings.sequence_store != "memory":
                raise ValueError("a shared sequence_store needs runtime.sequences.replicated.make_engine")
            store = LRUStateStore(settings.sequence_state_capacity or settings.max_sequences)
        self.store = store
        self.table = Sequences(
            settings.name,
            settings.max_sequences,
            settings.max_sequence_queue_size,
            settings.sequence_ended_memory,
            shared=self.shared is not None,
        )
        """Open sequences, recently ended ids, the admission rules and their counters."""
        self.replayed = 0
        """Retried steps answered from the stored answer."""
        self.idle_s = settings.max_sequence_idle_ms / 1000
        self.life_s = settings.sequence_timeout_ms / 1000
        self.strategy = strategy
        self._ended = ended
        self.on_end: list[Callable[[str, EndReason], None]] = []
        """Told (without awaiting) of every ending, after the model: e.g. a worker process tells its
        server, which keeps which worker holds which open sequence."""
        self._notices: deque[tuple[str, EndReason]] = deque()
        self._arrivals = itertools.count()
        self._local = self.shared is None
        """The states live in this process only (``shared`` is None), asked once."""

    @property
    def shared(self) -> SharedStateStore | None:
        """The store, when replicas share it (``replicated.ReplicatedEngine``); None here."""
        return None

    @property
    def replica(self) -> str | None:
        """This replica's name in a shared store (told to clients with each answer)."""
        shared = self.shared
        return shared.replica if shared is not None else None

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
        """Queue a request in its sequence (or raise at once: 400 or 503 by the sequence rules).

        A retry of the last numbered step of a sequence that ended here is answered at once, from
        that step's stored answer (with a shared store the claim finds it in the store)."""
        loop = asyncio.get_running_loop()
        table = self.table
        # (only a numbered step may be a retry: no call for the others)
        if control.step is not None and self._local and (answer := table.replay(control)) is not None:
            done = Pending(
                request, control, Sequence(control.key), next(self._arrivals), loop.create_future()
            )
            self._replay(done, answer)
            return done
        seq, replaces = table.admit(control)
        pending = Pending(request, control, seq, next(self._arrivals), loop.create_future(), replaces)
        seq.queue.append(pending)
        table.queued += 1
        seq.stop_idle()
        if control.start and self.life_s:
            if seq.life_timer is not None:
                seq.life_timer.cancel()
            seq.life_timer = loop.call_later(self.life_s, self._on_lifetime, seq)
        strategy = self.strategy
        if not strategy.busy(seq):
            strategy.ready(seq)
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

    async def opening(self, pending: Pending, state: Any = STORED) -> None:
        """``pending`` is about to run: on a START to an id the model still holds, the old sequence
        ends first (reason ``restart``, or the reason it was already ending for)."""
        seq = pending.sequence
        if pending.control.start and seq.live:
            seq.live = False
            if state is STORED:
                state = await self.store.pop(seq.key)
            await self.tell(seq.key, pending.replaces or "restart", state)

    async def prepare(self, batch: list[Pending]) -> list[tuple[Pending, Any]]:
        """The requests of ``batch`` (one per sequence, each running) that run now, with their states;
        the others are answered here and their sequences go on (see the module docstring)."""
        runs: list[Pending] = []
        keys: list[str] = []  # of the sequences that go on: their states are loaded
        for pending in batch:
            control = pending.control
            if control.step is not None and self._answered_from_steps(
                pending, pending.sequence.step, pending.sequence.answer
            ):
                continue
            if control.start:
                if pending.sequence.live:  # else opening has nothing to do
                    await self.opening(pending)
            else:
                keys.append(control.key)
            runs.append(pending)
        if not keys:
            return [(p, None) for p in runs]
        loaded = iter(await self.store.load(keys))
        return [(p, None if p.control.start else next(loaded)) for p in runs]

    async def commit(
        self, batch: list[Pending], steps: list[SequenceStep], results: list[Any], ends: list[bool]
    ) -> list[tuple[str, Any]]:
        """Keep the outcome of the steps that succeeded (``results`` are responses, already marked):
        the states of those that go on, the step counts and the answers of numbered steps. A step
        whose write a shared store refused gets 503 in ``results`` instead. Returns the evicted states."""
        good = [i for i, result in enumerate(results) if isinstance(result, InferenceResponse)]
        keep = [(steps[i].sequence_id, steps[i].state) for i in good if not ends[i]]
        evicted = await self.store.save(keep) if keep else []
        self._count_steps(batch, results, good)
        return evicted

    async def checkpoint(self, items: list[tuple[Sequence, Any]]) -> dict[Sequence, Exception]:
        """Keep the states of sequences that run on (continuous batching, after each step) where other
        replicas see them; the sequences whose state was not kept, with the error their requests get
        (each is no longer held here). In this process's memory there is nothing to write."""
        return {}

    def moved(self, seq: Sequence) -> None:
        """Nothing of ``seq`` runs any more and its state was not kept here (``checkpoint``): forget
        it, without an ending; its next request claims it again."""
        seq.live = False
        seq.stop_idle()
        self._go_on(seq)

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
            self.goes_on(seq)

    def goes_on(self, seq: Sequence) -> None:
        """``finished`` for a sequence that neither ended nor waits to end (``pending_end`` None),
        whose state is where it belongs: its next request may run, or its idle time starts."""
        if seq.queue:
            self.strategy.ready(seq)
        elif self.idle_s and seq.live and self.table.current(seq):
            self._start_idle(seq)

    def released(self, seq: Sequence) -> None:
        """Like ``finished`` without awaiting (after an unexpected failure): endings become notices."""
        if not self.current(seq):
            return
        if seq.pending_end in ("cancel", "worker_lost") or (seq.pending_end == "timeout" and not seq.queue):
            self.end_soon(seq, seq.pending_end)
        elif seq.queue:
            self.strategy.ready(seq)
        elif self.idle_s and seq.live and seq.idle_since is None:
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
        await self._record_end(seq.key, reason)
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
        for listener in self.on_end:
            listener(key, reason)

    async def deliver_notices(self) -> None:
        """Tell the model of the endings decided outside the worker (timers, cancellations)."""
        while self._notices:
            key, reason = self._notices.popleft()
            await self._record_end(key, reason)
            await self.tell(key, reason, await self.store.pop(key))

    async def _record_end(self, key: str, reason: EndReason) -> None:
        """Record how the sequence ended where other replicas see it (nowhere, in memory)."""

    async def hand_over(self) -> None:
        """As the server drains: let other replicas take over what this one holds (nothing, in memory)."""

    async def stop(self) -> None:
        """End every open sequence (reason ``unload``) and empty the store; call once nothing runs.

        With a shared store the sequences go on elsewhere: their states stay in the store and their
        leases are released, so that another replica takes each over at its next step."""
        await self.deliver_notices()
        kept = dict(await self.store.clear()) if self.shared is not None else {}
        for seq in list(self.table.active.values()):
            seq.stop_timers()
            if seq.live:
                seq.live = False
                held, state = self.strategy.detach(seq)
                if not held:
                    state = kept.get(seq.key) if self.shared is not None else await self.store.pop(seq.key)
                await self.tell(seq.key, "unload", state)
            seq.running = None
            self.table.settle(seq, "unload", everything=True)
        if self.shared is None:
            await self.store.clear()
        await self.store.close()

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
            "sequence_store": "shared" if self.shared is not None else "memory",
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
            "replayed_steps": self.replayed,
        }
