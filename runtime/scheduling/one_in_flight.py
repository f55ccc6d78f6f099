"""The sequence batcher's strategy: at most one request of a sequence in flight, one per batch.

A sequence with a waiting request and nothing running is *ready*; the worker takes the head
request of ready sequences, oldest first. The state stays in the store while a step runs (so a
failed step leaves the previous state), which is why ``detach`` holds nothing.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Any

from runtime.sequences.engine import SequenceEngine
from runtime.sequences.lifecycle import Pending, Sequence


class OneInFlight:
    """The ready sequences of a sequence batcher, oldest head request first."""

    def __init__(self, wake: asyncio.Event) -> None:
        self._wake = wake
        self._ready: list[tuple[int, Sequence]] = []
        self.engine: SequenceEngine | None = None
        """Set once the engine using this strategy exists."""

    def __len__(self) -> int:
        """Entries in the ready heap (some may be stale)."""
        return len(self._ready)

    # ------------------------------------------------------------------ SequenceStrategy

    def busy(self, seq: Sequence) -> bool:
        return seq.running is not None

    def ready(self, seq: Sequence) -> None:
        if not seq.in_ready:
            seq.in_ready = True
            heapq.heappush(self._ready, (seq.queue[0].arrival, seq))
            self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def detach(self, seq: Sequence) -> tuple[bool, Any]:
        return False, None

    # ------------------------------------------------------------------ the worker's side

    def take(self, limit: int) -> list[Pending]:
        """Up to ``limit`` head requests of ready sequences, oldest first; each sequence becomes running."""
        engine = self.engine
        assert engine is not None
        table = engine.table
        ready = self._ready
        pop = heapq.heappop
        taken: list[Pending] = []
        while ready and len(taken) < limit:
            arrival, seq = pop(ready)
            seq.in_ready = False
            queue = seq.queue
            if seq.running is not None or not queue or not table.current(seq):
                continue
            head = queue[0]
            if head.future.done():  # cancelled, its callback not yet run
                engine.cancel(head)
                continue
            if head.arrival != arrival:
                self.ready(seq)
                continue
            queue.popleft()  # engine.withdraw(head), knowing it is the head
            table.queued -= 1
            head.running = True
            seq.running = head
            taken.append(head)
        return taken
