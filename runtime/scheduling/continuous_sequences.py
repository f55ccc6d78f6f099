"""Sequences in a continuous batch: many streams of one sequence may run at once.

The continuous batcher of a model with ``sequence_batching`` uses the sequence lifecycle engine
(``runtime.sequences.engine``: admission, queues, timers, endings, the state store, the model's
``sequence_ended`` hook) with this strategy; what differs from the sequence batcher
(``.one_in_flight``) is when a request runs. There, a sequence has at most one request in flight; here, a request joins the
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
- **A shared store** (``sequence_store: "redis://..."``): when the first stream of a sequence joins,
  the sequence is claimed (a lease with a fencing token, as with the sequence batcher: held by
  another replica, 503; ended, 400) and its state loaded; at the end of each step the states of
  the sequences that took part are written with one fenced write (one round trip for the whole
  step), which also renews their leases, before their chunks go out. A sequence whose write is
  refused (another replica took it over) or fails (Redis out of reach) fails its streams with 503
  and is forgotten here: its next request claims it again and goes on from the last state written.
  ``sequence_step`` is refused (400): a sequence's requests overlap and share one state, so no
  step can be applied exactly once (docs/replicas.md).
- **Cancellation.** When a caller gives up on a request of a sequence (a client disconnects, a gRPC
  call is cancelled) or a request of it times out in the queue, the sequence is cancelled, as with
  the sequence batcher: its waiting requests fail with ``Cancelled``, so do its other running
  streams (in band), the model is told (reason ``cancel``) and later requests to the id get 400.

Every call here comes from the batcher's stepper task, except ``admit`` and ``cancel`` (the
caller's task; they never await) and the engine's timers (which leave notices for the stepper).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from runtime.continuous import ContinuousModel, SequenceState, Stream, StreamSequence
from runtime.errors import Cancelled, SequenceError
from runtime.sequences.identity import STEP, SequenceControl
from runtime.sequences.lifecycle import Pending, Sequence
from runtime.sequences.replicated import make_engine
from runtime.sequences.store import StateStore
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest


class StreamEntry(Protocol):
    """A stream of the continuous batcher (``.callers.Entry``), as far as its sequence goes."""

    request: InferenceRequest
    stream: Stream
    pending: Pending | None
    replica: str | None


E = TypeVar("E", bound=StreamEntry)


class _Running(SequenceState):
    """A sequence with streams in the running set: its state, in memory while they run."""

    __slots__ = ("ending", "entries", "lost")

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.entries: dict[Any, None] = {}
        self.ending = False
        """A stream that ends the sequence has finished: it ends once none of its streams runs."""
        self.lost = False
        """With a shared store: its state could not be written (taken over, or the store out of
        reach); its streams fail and it is forgotten here once they have left."""


class RunningSet(Generic[E]):
    """The sequences of one continuously batched model: the engine, with streams that share a
    running set as its strategy; see the module docstring."""

    def __init__(
        self,
        model: ContinuousModel,
        settings: ModelSettings,
        wake: Callable[[], None],
        store: StateStore | None = None,
    ) -> None:
        self._wake = wake
        self._running: dict[Sequence, _Running] = {}
        self.engine = make_engine(settings, model.sequence_ended, self, store)

    # ------------------------------------------------------------------ SequenceStrategy

    def busy(self, seq: Sequence) -> bool:
        return seq in self._running

    def ready(self, seq: Sequence) -> None:
        self._wake()  # a START may have been waiting for the streams it replaces to leave

    def wake(self) -> None:
        self._wake()

    def detach(self, seq: Sequence) -> tuple[bool, Any]:
        running = self._running.pop(seq, None)
        return (True, running.state) if running is not None else (False, None)

    # ------------------------------------------------------------------ arrival (the caller's task)

    def admit(self, entry: E, control: SequenceControl) -> None:
        """Admit a request into its sequence (or raise at once: 400 or 503 by the sequence rules)."""
        if control.step is not None:
            raise SequenceError(
                f"{STEP} is served with sequence batching: under continuous batching the requests of "
                "a sequence overlap and share one state, so a step cannot be applied exactly once"
            )
        entry.pending = self.engine.admit(entry.request, control)

    def withdraw(self, entry: E) -> None:
        """Take a request that never joined out of its sequence's queue (admission failed later)."""
        if entry.pending is not None:
            self.engine.withdraw(entry.pending)

    def may_join(self, entry: E) -> bool:
        """Whether a waiting request of a sequence may join now (a START waits for the old streams)."""
        pending = entry.pending
        assert pending is not None
        return not (pending.control.start and pending.sequence in self._running)

    # ------------------------------------------------------------------ in the stepper

    async def join(self, entry: E) -> None:
        """The request joins the running set: give its stream the sequence and its state."""
        pending = entry.pending
        assert pending is not None
        seq, control = pending.sequence, pending.control
        self.withdraw(entry)
        running = self._running.get(seq)
        if running is None:
            if self.engine.shared is not None:
                # claimed in the shared store (or answered: held elsewhere, ended, unknown)
                runs = await self.engine.prepare([pending])
                if not runs:
                    error = pending.future.exception()
                    assert error is not None
                    raise error
                state = runs[0][1]
            elif control.start:
                await self.engine.opening(pending)  # a START on an open id: the old sequence ends now
                state = None
            else:
                state = await self.engine.store.pop(seq.key)  # in memory while its streams run
            running = self._running[seq] = _Running(state)
            seq.live = True
        running.entries[entry] = None
        seq.running = pending
        pending.running = True
        entry.replica = self.engine.replica
        entry.stream.sequence = StreamSequence(control.key, control.start, control.end, running)

    async def left(self, entry: E, finished: bool) -> None:
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
        if running.lost and not running.ending:
            self.engine.moved(seq)
            return
        await self.engine.finished(seq, ended=running.ending, state=running.state, keep=True)

    async def stepped(self, entries: list[E]) -> dict[Sequence, Exception]:
        """After a step of ``entries``: with a shared store, write the states of their sequences
        (one round trip). Returns the sequences whose state could not be written, with why: their
        streams fail (their chunks of this step are not delivered)."""
        if self.engine.shared is None:
            return {}
        stepped: dict[Sequence, _Running] = {}
        for entry in entries:
            if entry.pending is not None:
                running = self._running.get(entry.pending.sequence)
                if running is not None and not running.lost:
                    stepped[entry.pending.sequence] = running
        if not stepped:
            return {}
        failed = await self.engine.checkpoint([(seq, running.state) for seq, running in stepped.items()])
        for seq in failed:
            stepped[seq].lost = True
        return failed

    async def deliver_notices(self) -> None:
        """Tell the model of the endings decided outside the stepper (timers, cancellations)."""
        await self.engine.deliver_notices()

    async def stop(self) -> None:
        """End every open sequence (reason ``unload``), once nothing runs."""
        await self.engine.stop()

    # ------------------------------------------------------------------ cancellation (any task)

    def cancel(self, entry: E) -> list[E]:
        """A caller gave up on a request of a sequence: cancel the sequence. Returns its other
        running streams, which the batcher ends with ``Cancelled``."""
        pending = entry.pending
        if pending is None or not self.engine.cancel(pending):
            return []
        return [other for other in self._running[pending.sequence].entries if other is not entry]

    def cancelled_error(self, entry: E) -> Cancelled:
        echo = entry.pending.control.echo if entry.pending is not None else entry.stream.id
        return Cancelled(
            f"Cancelled: another request of sequence {echo!r} was cancelled, which cancels the sequence"
        )

    # ------------------------------------------------------------------ metadata

    def describe(self) -> dict[str, Any]:
        return {
            "sequence_batching": True,
            **self.engine.describe(),
            "sequence_stats": {**self.engine.stats(), "running_sequences": len(self._running)},
        }
