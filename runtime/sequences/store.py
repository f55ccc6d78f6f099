"""Where sequence states live between requests: a small async interface and its default, an LRU.

The sequence scheduler is the store's only user, and it calls it from one task at a time, so an
implementation needs no locking of its own. Methods are async so that a store in another process
(Redis, a KV cache manager) fits the same interface without touching the scheduler.

A store with a capacity may evict a state to make room for another: ``save`` returns what it
evicted, and the scheduler ends those sequences (reason ``eviction``) so that their next request
is refused rather than silently started afresh.

A *shared* store (``SharedStateStore``, e.g. ``runtime.sequences.redis_store``) holds the states
where several replicas of a model see them. The engine then claims a sequence before each step (a
lease with a fencing token, so that one replica at a time applies its steps), writes the state,
the step number and the step's answer with one fenced write after it, and records the sequence's
ending there, so that every replica gives the same answer for an ended sequence.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lru import LRU


class StateStore(abc.ABC):
    """Per-sequence state, keyed by the sequence's key."""

    capacity: int

    @abc.abstractmethod
    async def load(self, keys: Sequence[str]) -> list[Any]:
        """The state of each key (None where there is none), marking each as recently used."""

    @abc.abstractmethod
    async def save(self, items: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Store each (key, state); return the (key, state) pairs evicted to make room, if any."""

    @abc.abstractmethod
    async def pop(self, key: str) -> Any:
        """Remove a key's state and return it (None if there is none)."""

    @abc.abstractmethod
    async def clear(self) -> list[tuple[str, Any]]:
        """Remove every state and return them."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """How many states are held."""

    async def close(self) -> None:
        """Release what the store holds outside the process (connections); the default holds none."""


ClaimKind = Literal["ok", "replay", "conflict", "busy", "ended", "none"]


@dataclass(slots=True)
class Claim:
    """What a shared store answers when a replica claims a sequence for one step.

    - ``ok``: this replica holds the sequence now; ``state`` and ``done`` (the steps applied so far)
      are the stored ones (a START starts afresh: None and 0);
    - ``replay``: the step was applied already; ``answer`` is the answer it got (nothing is applied);
    - ``conflict``: the step is not the next one; ``done`` + 1 is the one expected;
    - ``busy``: another replica holds an unexpired lease; ``retry_ms`` until it expires;
    - ``ended``: the sequence ended (``reason``); ``done`` steps were applied;
    - ``none``: the store holds no such sequence (never started, or its state expired).
    """

    kind: ClaimKind
    state: Any = None
    done: int = 0
    answer: Any = None
    reason: str | None = None
    retry_ms: int = 0


@dataclass(slots=True)
class Commit:
    """One step's outcome, written by a shared store with one fenced write."""

    key: str
    state: Any
    step: int | None
    """The number of steps applied, this one included (None: leave it, and the answer, as they are)."""
    answer: Any = None
    """The step's answer, kept for a retry of it (None: not kept)."""
    ended: str | None = None
    """The reason the sequence ended with this step (None: it goes on)."""
    release: bool = False
    """Free the lease with the write: the next step may go to any replica (a START whose id the
    server made: the client's next request, carrying the id, is routed by it, maybe elsewhere)."""


class SharedStateStore(StateStore):
    """A store that several replicas share: claims (leases with fencing tokens) and fenced writes.

    ``load``, ``save`` and ``pop`` act on the states this replica holds (claimed and not released);
    ``claim`` and ``commit`` are the step-by-step protocol the engine follows with such a store.
    """

    replica: str
    """This replica's identity, the owner named in its leases (told to clients with each answer)."""

    @abc.abstractmethod
    def holding(self, key: str) -> tuple[bool, Any]:
        """(True, state) when this replica holds the sequence under a lease that cannot have expired
        yet: no other replica can have written it, so its next step needs no claim (its write is
        fenced all the same). (False, None) otherwise."""

    @abc.abstractmethod
    async def claim(self, items: Sequence[tuple[str, bool, int | None]]) -> list[Claim]:
        """Claim each (key, start, step) for one step (``step``: the client's ``sequence_step``, or None)."""

    @abc.abstractmethod
    async def commit(self, items: Sequence[Commit]) -> list[bool]:
        """Write each step's outcome if this replica still holds the sequence (False: it was refused,
        another replica took the sequence over)."""

    @abc.abstractmethod
    async def record_end(self, key: str, reason: str) -> bool:
        """Record that the sequence ended (if this replica still holds it); drop its state."""

    @abc.abstractmethod
    async def release(self, keys: Sequence[str]) -> None:
        """Give up the leases of these sequences (their states stay) so another replica may take them."""


class LRUStateStore(StateStore):
    """States in process memory, at most ``capacity`` of them; the least recently used goes first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._evicted: list[tuple[str, Any]] = []
        self._states = LRU(capacity, callback=self._on_evict)

    def _on_evict(self, key: str, state: Any) -> None:
        self._evicted.append((key, state))

    async def load(self, keys: Sequence[str]) -> list[Any]:
        states = self._states
        return [states.get(key) for key in keys]

    async def save(self, items: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        states = self._states
        for key, state in items:
            states[key] = state
        if not self._evicted:
            return []
        evicted, self._evicted = self._evicted, []
        return evicted

    async def pop(self, key: str) -> Any:
        return self._states.pop(key, None)

    async def clear(self) -> list[tuple[str, Any]]:
        items = self._states.items()
        self._states.clear()
        return list(items)

    def __len__(self) -> int:
        return len(self._states)
