"""Which models stay resident: the limits on how many are loaded and on their memory, what a load
costs, and which model leaves first.

The registry owns one ``Residency`` (``max_loaded_models``, ``models_memory_limit``); it loads a
model named by a request on demand and asks this module which loaded model to unload to make room:
the least recently used one that is idle (no request in flight, no open stream, no live sequence)
and not pinned. Loads run one at a time (``one_load``), so memory passes the limit by at most the
model being loaded.

A model's memory is measured when it loads: the growth of the server process's resident set
(``/proc/self/statm``) across the load (warm-up included), or, for a model in worker processes,
the resident memory of its workers. It is an estimate: what the server allocates meanwhile for
requests of other models counts too, memory a framework caches on first use is charged to the
first model that uses it, and an allocator may keep freed memory (the next load then grows less).
See docs/many-models.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Protocol

from runtime.telemetry.counts import Histogram

LOAD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds, for the load-time histogram."""

UNLOAD_REASONS = ("evicted", "removed", "replaced", "requested")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """The resident memory of this process now, in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class Held(Protocol):
    """What residency reads of a registry entry."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str | None: ...

    @property
    def pinned(self) -> bool: ...

    @property
    def loaded(self) -> bool: ...

    @property
    def idle(self) -> bool: ...

    used: int
    memory: int


class LoadCounts:
    """Loads, unloads (by reason) and load times of one model version."""

    __slots__ = ("load_seconds", "loads", "unloads")

    def __init__(self) -> None:
        self.loads = 0
        self.unloads: dict[str, int] = {}
        self.load_seconds = Histogram(len(LOAD_BUCKETS))


class Residency:
    """The limits on loaded models, and the counts of loads and unloads.

    ``max_loaded`` and ``memory_limit``: 0 means no limit. ``on_demand`` tells whether models not
    loaded at start are loaded by the first request naming them (either limit set)."""

    def __init__(self, max_loaded: int = 0, memory_limit: int = 0, wait: float = 60.0) -> None:
        self.max_loaded = max_loaded
        self.memory_limit = memory_limit
        self.wait = wait
        """Most seconds a request waits for its model's load (and for room to load it)."""
        self.counts: dict[tuple[str, str], LoadCounts] = {}

    @property
    def on_demand(self) -> bool:
        return bool(self.max_loaded or self.memory_limit)

    def of(self, name: str, version: str | None) -> LoadCounts:
        key = (name, version or "")
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = LoadCounts()
        return counts

    def loaded(self, name: str, version: str | None, seconds: float) -> None:
        counts = self.of(name, version)
        counts.loads += 1
        counts.load_seconds.observe(seconds, LOAD_BUCKETS)

    def unloaded(self, name: str, version: str | None, reason: str) -> None:
        unloads = self.of(name, version).unloads
        unloads[reason] = unloads.get(reason, 0) + 1

    def fits(self, resident: Iterable[Held], adding: Held | None = None) -> bool:
        """Whether ``resident`` (and ``adding``, at the memory it took last time) are within the limits."""
        count, memory = 0, 0
        for entry in resident:
            if entry is not adding:
                count += 1
                memory += entry.memory
        if adding is not None:
            count += 1
            memory += adding.memory
        if self.max_loaded and count > self.max_loaded:
            return False
        return not (self.memory_limit and memory > self.memory_limit and count > 1)

    @staticmethod
    def victim(resident: Iterable[Held], keep: Held | None = None) -> Held | None:
        """The least recently used idle model that is not pinned (None when every one is busy)."""
        best: Held | None = None
        for entry in resident:
            if entry is keep or entry.pinned or not entry.idle:
                continue
            if best is None or entry.used < best.used:
                best = entry
        return best
