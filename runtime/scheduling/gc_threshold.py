"""The cyclic garbage collector's youngest generation, sized for batching.

A batcher keeps many requests in flight by design (64 callers queued behind a batch of 32, 128
sequences waiting for their step): each holds live objects the cyclic collector tracks (requests,
responses, futures, tasks, coroutines, dicts). CPython collects its youngest generation whenever
700 more tracked objects were made than freed, and a collection walks every young object, to find
them alive and move them to the next generation, which is walked again ten collections later.
Under a batcher's load that is a collection every few requests for nothing: in the ``torch`` row
of ``python3 -m benchmarks`` (64 clients) some 9 us per request, in the ``sequence`` row (128
sequences) some 20 us, with pauses of up to 10 ms; none of them found garbage.

So while a batching scheduler runs, generation 0's threshold is at least :data:`YOUNG`, which the
objects in flight do not reach: collections happen where garbage is made, not per request. The
older generations' thresholds are untouched, a higher threshold the process set itself is kept,
and a collector switched off by a threshold of 0 stays off. When the last batcher stops, the
previous threshold returns (unless something else changed it meanwhile).
"""

from __future__ import annotations

import gc
import threading
from typing import Final

YOUNG: Final = 10_000
"""Generation 0's threshold while a batcher runs (CPython's default is 700)."""

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None
"""The thresholds before the first holder raised generation 0's; None when it did not."""
_set: tuple[int, int, int] | None = None
"""The thresholds it set."""


def hold() -> None:
    """A batcher starts: generation 0's threshold is at least :data:`YOUNG` until it calls :func:`release`."""
    global _holders, _saved, _set
    with _lock:
        _holders += 1
        if _holders > 1:
            return
        before = gc.get_threshold()
        if 0 < before[0] < YOUNG:
            _saved, _set = before, (YOUNG, before[1], before[2])
            gc.set_threshold(*_set)
        else:
            _saved = _set = None


def release() -> None:
    """A batcher stopped; the last one puts back the threshold it found (if still as it left it)."""
    global _holders, _saved, _set
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders:
            return
        if _saved is not None and gc.get_threshold() == _set:
            gc.set_threshold(*_saved)
        _saved = _set = None


def holders() -> int:
    """Batchers holding the threshold now."""
    return _holders
