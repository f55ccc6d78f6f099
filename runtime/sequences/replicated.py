"""The sequence engine with a store that replicas share (``sequence_store: "redis://..."``).

``ReplicatedEngine`` is ``engine.SequenceEngine`` with the step protocol of a ``SharedStateStore``
(``runtime.sequences.redis_store``): one replica at a time holds a sequence (a lease with a fencing
token), every write is fenced, and endings are recorded in the store so that every replica gives
the same answer for an ended sequence.

- Before a batch runs (``prepare``) each of its sequences is claimed in the store with one call for
  the batch, which loads its state, step count and last answer, unless this replica holds it under
  a lease that cannot have expired yet (then nobody else can have written it, and the step costs no
  claim). A sequence held by another replica gets 503 and ``Retry-After`` (``SequenceElsewhere``);
  an ended one the 400 of its ending; a retried numbered step its stored answer; a step out of
  order 409.
- After the batch (``commit``) the states, step counts and answers are written with one fenced
  write for the batch, which renews the leases; a step whose write is refused (another replica
  took the sequence over meanwhile) is answered 503 instead.
- Under continuous batching, after each step (``checkpoint``) the states of the sequences that took
  part are written the same way, their step counts left as they are.
- Endings are recorded in the store (``_record_end``); as the server drains (``hand_over``), and
  at unload (``stop``), the leases of the sequences that run nothing are released so that another
  replica takes each over at once; their states stay in the store. A step that runs as the server
  drains frees its lease with the write of its state.

``make_engine`` picks the engine a model's settings (or a given store) call for.
"""

from __future__ import annotations

import logging
from typing import Any

from runtime.errors import SequenceElsewhere, SequenceError, Unavailable
from runtime.sequences.engine import EndedHook, SequenceEngine
from runtime.sequences.lifecycle import Pending, Sequence, SequenceStrategy, ended_message
from runtime.sequences.sequence_model import EndReason, SequenceStep
from runtime.sequences.store import Commit, LRUStateStore, SharedStateStore, StateStore
from runtime.settings import ModelSettings
from runtime.types import InferenceResponse

logger = logging.getLogger(__name__)


def make_store(settings: ModelSettings) -> StateStore:
    """The state store a model's settings name (``sequence_store``)."""
    url = settings.sequence_store
    capacity = settings.sequence_state_capacity or settings.max_sequences
    if url == "memory":
        return LRUStateStore(capacity)
    from runtime.sequences.redis_store import RedisStateStore  # imports redis, an optional dependency

    return RedisStateStore(
        url,
        settings.name,
        settings.version,
        capacity=capacity,
        ttl_ms=settings.max_sequence_idle_ms,
        lease_ms=settings.sequence_lease_ms,
    )


def make_engine(
    settings: ModelSettings, ended: EndedHook, strategy: SequenceStrategy, store: StateStore | None = None
) -> SequenceEngine:
    """The sequence engine for a model: with a shared store (given, or named by ``sequence_store``)
    a ``ReplicatedEngine``, else a ``SequenceEngine`` on this process's memory."""
    if store is None:
        store = make_store(settings)
    if isinstance(store, SharedStateStore):
        return ReplicatedEngine(settings, ended, strategy, store)
    return SequenceEngine(settings, ended, strategy, store)


class ReplicatedEngine(SequenceEngine):
    """A sequence engine whose states live in a store shared by replicas; see the module docstring."""

    def __init__(
        self, settings: ModelSettings, ended: EndedHook, strategy: SequenceStrategy, store: SharedStateStore
    ) -> None:
        self._shared = store
        self._handing_over = False
        """Set as the server drains: each step written from then on frees its sequence's lease."""
        super().__init__(settings, ended, strategy, store)

    @property
    def shared(self) -> SharedStateStore:
        return self._shared

    async def prepare(self, batch: list[Pending]) -> list[tuple[Pending, Any]]:
        shared = self._shared
        runs: list[tuple[Pending, Any]] = []
        previous: dict[str, Any] = {}
        claiming: list[Pending] = []
        for pending in batch:
            seq, control = pending.sequence, pending.control
            if control.start:
                if seq.live:
                    previous[control.key] = await self.store.pop(control.key)
            elif seq.live:
                fresh, state = shared.holding(control.key)
                if fresh:  # held here under a live lease: the state here is the stored one
                    if not self._answered_from_steps(pending, seq.step, seq.answer):
                        runs.append((pending, state))
                    continue
            claiming.append(pending)
        if not claiming:
            return runs
        claims = await shared.claim([(p.control.key, p.control.start, p.control.step) for p in claiming])
        for pending, claim in zip(claiming, claims, strict=True):
            seq, control = pending.sequence, pending.control
            if claim.kind == "ok":
                seq.step = claim.done
                await self.opening(pending, previous.get(control.key))
                runs.append((pending, claim.state))
                continue
            if claim.kind == "replay":
                self._answered_from_steps(pending, control.step or 0, claim.answer)
                continue
            if claim.kind == "conflict":
                self._answered_from_steps(pending, claim.done, None)
                continue
            reason: EndReason = claim.reason or "end"  # type: ignore[assignment]
            if claim.kind == "busy":
                error: Exception = SequenceElsewhere(
                    f"Sequence {control.echo!r} is held by another replica for up to {claim.retry_ms} ms more; "
                    "try again later"
                )
            elif claim.kind == "ended":
                error = SequenceError(ended_message(control.echo, reason))
            else:
                error = SequenceError(
                    f"Sequence {control.echo!r} is not open on model {self.name!r}: "
                    "its first request must have sequence_start=true (or its state expired)"
                )
            self._unrun(pending, error)
            seq.live = False
            if claim.kind == "ended":
                seq.stop_idle()
                self.table.settle(seq, reason)
            else:  # another replica has it, or the store has nothing of it
                self._go_on(seq)
        return runs

    async def commit(
        self, batch: list[Pending], steps: list[SequenceStep], results: list[Any], ends: list[bool]
    ) -> list[tuple[str, Any]]:
        good = [i for i, result in enumerate(results) if isinstance(result, InferenceResponse)]
        self._count_steps(batch, results, good)
        commits = [
            Commit(
                batch[i].control.key,
                steps[i].state,
                batch[i].sequence.step,
                batch[i].sequence.answer,
                "end" if ends[i] else None,
                # a server-made id may hash to another replica; a draining replica takes no more steps
                release=batch[i].control.generated or self._handing_over,
            )
            for i in good
        ]
        written = await self._shared.commit(commits) if commits else []
        for i, ok in zip(good, written, strict=True):
            if not ok:
                results[i] = SequenceElsewhere(
                    f"Sequence {batch[i].control.echo!r} was taken over by another replica while this step ran; "
                    "its outcome was not kept: try the step again"
                )
        return []

    async def checkpoint(self, items: list[tuple[Sequence, Any]]) -> dict[Sequence, Exception]:
        """One fenced write of these states, which renews their leases (their step counts stay)."""
        shared = self._shared
        try:
            written = await shared.commit([Commit(seq.key, state, None) for seq, state in items])
        except Unavailable as exc:
            for seq, _state in items:
                await shared.pop(seq.key)
            return {seq: exc for seq, _state in items}
        return {
            seq: SequenceElsewhere(
                f"Sequence {seq.key!r} was taken over by another replica while this request ran; "
                "its outcome was not kept: try it again"
            )
            for (seq, _state), ok in zip(items, written, strict=True)
            if not ok
        }

    async def _record_end(self, key: str, reason: EndReason) -> None:
        await self._shared.record_end(key, reason)  # if this replica still holds it

    async def hand_over(self) -> None:
        """Release the leases of the sequences that run and wait for nothing here, so that another
        replica takes each over at its next step at once; the others are released with the write of
        the step they run (and at ``stop``)."""
        self._handing_over = True
        idle = [
            key for key, seq in self.table.active.items() if not self.strategy.busy(seq) and not seq.queue
        ]
        if idle:
            await self._shared.release(idle)
            logger.info("Model %r handed %d sequence(s) over to other replicas", self.name, len(idle))
