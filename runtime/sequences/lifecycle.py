"""The table of open sequences: who may send what, and what a request to an ended sequence is told.

Pure bookkeeping, no I/O: the sequence engine (``engine.SequenceEngine``) calls it from the event
loop and owns the timers, the state store and the model calls. Rules (../shared/SEQUENCES.md):

- START on a new id opens a sequence, unless ``max_sequences`` are open (503).
- START on an open id queues behind that sequence's requests; when it runs, the old sequence
  ends (reason ``restart``, or the reason it was already ending for) and a fresh one begins.
- A request without START to an unknown id is refused (400) and told to START; to an id that
  ended recently, it is told how it ended (remembered in a bounded table). Never a silent restart.
- After an accepted END (or a lifetime timeout, or a cancellation) an open sequence takes no more
  requests but START; the ones already accepted run.
- At most ``max_sequence_queue_size`` requests of a sequence wait beyond the one running (503).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.errors import Cancelled, Overloaded, SequenceError, SequenceNotOpen, ServerError
from runtime.sequences.identity import SequenceControl
from runtime.sequences.sequence_model import END_REASONS, EndReason
from runtime.types import InferenceRequest, InferenceResponse

_HOW = {
    "end": "it was ended by a request with sequence_end",
    "idle": "it was idle for longer than max_sequence_idle_ms",
    "timeout": "it outlived sequence_timeout_ms",
    "cancel": "it was cancelled: a caller gave up on one of its requests",
    "eviction": "its state was evicted from the state store to make room (sequence_state_capacity)",
    "unload": "the model was unloaded",
    "restart": "a new START replaced it",
    "worker_lost": "the worker process that held its state died",
}


@dataclass(eq=False, slots=True)
class Pending:
    """One accepted request of a sequence, waiting for (or in) a batch."""

    request: InferenceRequest
    control: SequenceControl
    sequence: Sequence
    arrival: int
    future: asyncio.Future[InferenceResponse]
    replaces: EndReason | None = None
    """On a START that arrived while the id was open: why the old sequence ends when this runs."""
    running: bool = False
    queued_at: float = field(default_factory=time.monotonic)
    """When it was accepted (``time.monotonic()``), for its queue time."""
    context: contextvars.Context = field(default_factory=contextvars.copy_context, repr=False)
    """The caller's context (its trace span, for the batch's spans)."""


@dataclass(eq=False, slots=True)
class Sequence:
    """One open sequence id and its requests."""

    key: str
    queue: deque[Pending] = field(default_factory=deque)
    running: Pending | None = None
    live: bool = False
    """The model has seen a step of the current sequence and has not been told it ended."""
    closed: EndReason | None = None
    """Why new requests other than START are refused (an END was accepted, a timeout, a cancel)."""
    pending_end: EndReason | None = None
    """A reason to end the sequence once its accepted requests have run (timeout, cancel)."""
    idle_timer: asyncio.TimerHandle | None = None
    """Armed while idle time counts, or since an earlier idle spell (it then arms itself again for
    what is left of this one: a step starts and stops the idle time without a timer of its own)."""
    idle_since: float | None = None
    """When the current idle spell began (``loop.time()``); None while the sequence is not idle."""
    life_timer: asyncio.TimerHandle | None = None
    in_ready: bool = False
    step: int = 0
    """Steps of the current sequence applied so far (with a shared store: as the last claim said)."""
    answer: Any = None
    """The answer of the last applied step, when the client numbered it (``sequence_step``)."""

    def stop_timers(self) -> None:
        for timer in (self.idle_timer, self.life_timer):
            if timer is not None:
                timer.cancel()
        self.idle_timer = self.life_timer = None
        self.idle_since = None

    def stop_idle(self) -> None:
        """Idle time stops counting (a timer still armed finds nothing to do, or a later spell)."""
        self.idle_since = None


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


def ended_message(echo: Any, reason: EndReason) -> str:
    return (
        f"Sequence {echo!r} has ended (reason: {reason}): {_HOW[reason]}. "
        "Send sequence_start=true to start a new one"
    )


class Sequences:
    """Open sequences by key, recently ended ones by key, and the admission rules."""

    def __init__(
        self, model: str, max_sequences: int, max_queue: int, memory: int, *, shared: bool = False
    ) -> None:
        self.model = model
        self.shared = shared
        """The states live in a store shared by replicas: a request to an id not open here may be
        for a sequence another replica served, so it is admitted and the store decides."""
        self.max_sequences = max_sequences
        self.max_queue = max_queue
        self.memory = memory
        self.active: dict[str, Sequence] = {}
        self.ended: OrderedDict[str, EndReason] = OrderedDict()
        self.last_steps: dict[str, tuple[int, Any]] = {}
        """Of the remembered ended sequences whose last step was numbered: (its number, its answer),
        so that a retry of that step gets its answer after the ending too (as with a shared store)."""
        self.queued = 0
        self.rejected: dict[str, int] = {"capacity": 0, "queue_full": 0, "not_open": 0, "ended": 0}
        self.ended_by: dict[str, int] = dict.fromkeys(END_REASONS, 0)

    def current(self, seq: Sequence) -> bool:
        return self.active.get(seq.key) is seq

    # ------------------------------------------------------------------ admission

    def admit(self, control: SequenceControl) -> tuple[Sequence, EndReason | None]:
        """The sequence a request joins (and, for a START on an open id, why the old one ends); or raise."""
        seq = self.active.get(control.key)
        replaces: EndReason | None = None
        if control.start:
            if seq is None:
                seq = self._open(control)
            else:
                self._check_room(seq, control)
                if seq.live or seq.queue or seq.running is not None:
                    replaces = seq.pending_end or "restart"
                seq.pending_end = None
                seq.closed = None
        else:
            if seq is None and self.shared:
                seq = self._open(control)
            elif seq is None:
                reason = self.ended.get(control.key)
                if reason is not None:
                    self.rejected["ended"] += 1
                    raise SequenceError(ended_message(control.echo, reason))
                self.rejected["not_open"] += 1
                raise SequenceNotOpen(
                    f"Sequence {control.echo!r} is not open on model {self.model!r}: "
                    "its first request must have sequence_start=true"
                )
            if seq.closed is not None:
                self.rejected["ended"] += 1
                raise SequenceError(ended_message(control.echo, seq.closed))
            self._check_room(seq, control)
        if control.end:
            seq.closed = "end"
        return seq, replaces

    def _open(self, control: SequenceControl) -> Sequence:
        if len(self.active) >= self.max_sequences:
            self.rejected["capacity"] += 1
            raise Overloaded(
                f"Model {self.model!r} has {len(self.active)} open sequences, its max_sequences; "
                "end one or try again later"
            )
        seq = Sequence(control.key)
        self.active[control.key] = seq
        self.ended.pop(control.key, None)
        self.last_steps.pop(control.key, None)
        return seq

    def _check_room(self, seq: Sequence, control: SequenceControl) -> None:
        if len(seq.queue) >= self.max_queue:
            self.rejected["queue_full"] += 1
            raise Overloaded(
                f"Sequence {control.echo!r} already has {len(seq.queue)} requests waiting "
                f"(max_sequence_queue_size={self.max_queue}); wait for its answers before sending more"
            )

    # ------------------------------------------------------------------ endings

    def remember(self, key: str, reason: EndReason, step: int = 0, answer: Any = None) -> None:
        self.ended[key] = reason
        self.ended.move_to_end(key)
        if answer is not None:
            self.last_steps[key] = (step, answer)
        else:
            self.last_steps.pop(key, None)
        while len(self.ended) > self.memory:
            old, _reason = self.ended.popitem(last=False)
            self.last_steps.pop(old, None)

    def replay(self, control: SequenceControl) -> Any:
        """The stored answer when ``control`` retries the last (numbered) step of a sequence that
        ended here, else None."""
        if control.step is None or control.key in self.active:
            return None
        last = self.last_steps.get(control.key)
        if last is None or last[0] != control.step:
            return None
        return last[1]

    def forget(self, seq: Sequence) -> None:
        """Drop a sequence that runs and waits for nothing without remembering an ending (with a
        shared store: another replica holds it, or the store has no such sequence)."""
        if seq.queue or seq.running is not None or not self.current(seq):
            return
        seq.stop_timers()
        seq.live = False
        del self.active[seq.key]

    def settle(self, seq: Sequence, reason: EndReason, *, everything: bool = False) -> None:
        """After the sequence ended: fail its queued requests (up to the next START, or ``everything``),
        and forget the id (remembering why) unless a START is waiting to open it again."""
        failed: list[Pending] = []
        while seq.queue and (everything or not seq.queue[0].control.start):
            failed.append(seq.queue.popleft())
        self.queued -= len(failed)
        for pending in failed:
            error: ServerError
            if reason == "cancel":
                error = Cancelled(
                    f"Cancelled: another request of sequence {pending.control.echo!r} was cancelled, "
                    "which cancels the sequence"
                )
            else:
                error = SequenceError(
                    ended_message(pending.control.echo, reason) + " (before this request ran)"
                )
            if not pending.future.done():
                pending.future.set_exception(error)
        if seq.queue or seq.running is not None:
            return
        seq.stop_timers()
        if self.current(seq):
            del self.active[seq.key]
            self.remember(seq.key, reason, seq.step, seq.answer)
