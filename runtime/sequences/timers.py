"""A sequence's idle and lifetime timers, and the endings decided outside the worker.

Part of the sequence engine (``engine.SequenceEngine`` mixes it in). Its methods never await: they
run in timer callbacks and in callers' tasks. An ending decided here becomes a notice (``end_soon``)
that the scheduler's worker delivers to the model before it runs anything else.

- **Idle time** (``max_sequence_idle_ms``) counts only while a sequence has nothing queued and
  nothing running; it starts again from the end of its last step. One timer per spell: a timer
  armed for an earlier spell re-arms itself for what is left of the current one when it fires.
- **Lifetime** (``sequence_timeout_ms``, armed at START by the engine's ``admit``) lets the accepted
  requests finish and closes the sequence to later ones (reason ``timeout``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from runtime.sequences.lifecycle import Sequence, Sequences, SequenceStrategy
from runtime.sequences.sequence_model import EndReason


class SequenceTimers:
    """The engine's timers and its endings without awaiting; see the module docstring."""

    table: Sequences
    strategy: SequenceStrategy
    idle_s: float
    """Idle time allowed, in seconds (0: none)."""
    _notices: deque[tuple[str, EndReason]]
    """Endings decided here, not yet told to the model (the engine's ``deliver_notices``)."""

    if TYPE_CHECKING:

        def current(self, seq: Sequence) -> bool: ...

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
        loop = asyncio.get_running_loop()
        seq.idle_since = loop.time()
        if seq.idle_timer is None:  # else the timer of an earlier spell arms itself again when it fires
            seq.idle_timer = loop.call_later(self.idle_s, self._on_idle, seq)

    def _on_idle(self, seq: Sequence) -> None:
        """Idle time counts only while the sequence has nothing queued and nothing running."""
        seq.idle_timer = None
        if seq.idle_since is None:
            return  # not idle now: the next spell arms its own timer
        loop = asyncio.get_running_loop()
        left = seq.idle_since + self.idle_s - loop.time()
        if left > 0:  # a later spell than the one this timer was armed for
            seq.idle_timer = loop.call_later(left, self._on_idle, seq)
            return
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
