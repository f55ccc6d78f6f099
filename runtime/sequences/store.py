"""Where sequence states live between requests: a small async interface and its default, an LRU.

The sequence scheduler is the store's only user, and it calls it from one task at a time, so an
implementation needs no locking of its own. Methods are async so that a store in another process
(Redis, a KV cache manager) fits the same interface without touching the scheduler.

A store with a capacity may evict a state to make room for another: ``save`` returns what it
evicted, and the scheduler ends those sequences (reason ``eviction``) so that their next request
is refused rather than silently started afresh.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

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
