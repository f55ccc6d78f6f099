"""Exactly-once steps: what a numbered step (``sequence_step``) is answered without running.

Part of the sequence engine (``engine.SequenceEngine`` mixes it in; ``replicated.ReplicatedEngine``
uses the same hooks with the step count it reads from a shared store). Before a step runs, a retry
of the last applied step gets that step's stored answer (a copy) and applies nothing, and a step
that is not the next one is refused (409, ``SequenceStepConflict``, with the expected number);
after a step ran, the step count and the numbered step's answer are kept with the sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.errors import SequenceStepConflict
from runtime.sequences.identity import STEP
from runtime.sequences.lifecycle import Pending, Sequence, Sequences
from runtime.types import InferenceResponse

if TYPE_CHECKING:
    from runtime.sequences.store import SharedStateStore


class StepNumbers:
    """The engine's exactly-once steps; see the module docstring."""

    table: Sequences
    replayed: int
    """Retried steps answered from the stored answer."""

    if TYPE_CHECKING:

        @property
        def shared(self) -> SharedStateStore | None: ...

        def released(self, seq: Sequence) -> None: ...

    def _unrun(self, pending: Pending, outcome: InferenceResponse | Exception) -> None:
        """Answer a request that was taken to run but does not run, and free its sequence."""
        pending.sequence.running = None
        pending.running = False
        if pending.future.done():
            return
        if isinstance(outcome, Exception):
            pending.future.set_exception(outcome)
        else:
            pending.future.set_result(outcome)

    def _replay(self, pending: Pending, answer: InferenceResponse) -> None:
        """Answer a retried step with the answer it got (a copy) and apply nothing."""
        self.replayed += 1
        self._unrun(pending, answer.model_copy())

    def _answered_from_steps(self, pending: Pending, done: int, answer: Any) -> bool:
        """Whether ``pending``'s ``sequence_step`` answers it without running (after ``done`` steps
        applied, the last one's ``answer`` kept or None): a retry of that step, or out of order."""
        step = pending.control.step
        if step is None:
            return False
        seq = pending.sequence
        if step == done and answer is not None and (seq.live or self.shared is not None):
            self._replay(pending, answer)
        elif pending.control.start or step == done + 1:
            return False
        else:
            self._unrun(
                pending,
                SequenceStepConflict(
                    f"Sequence {pending.control.echo!r} expects {STEP}={done + 1}, got {step}"
                    + (" (a retry of a step older than the last applied one)" if step <= done else ""),
                    done + 1,
                ),
            )
        self._go_on(seq)
        return True

    def _go_on(self, seq: Sequence) -> None:
        """After a request of ``seq`` was answered without running: its next request may run; a
        sequence this replica never ran (another replica served it) is not kept open here."""
        if self.shared is not None and not seq.live and not seq.queue:
            self.table.forget(seq)
        else:
            self.released(seq)

    def _count_steps(self, batch: list[Pending], results: list[Any], good: list[int]) -> None:
        for i in good:
            pending = batch[i]
            seq = pending.sequence
            seq.step = 1 if pending.control.start else seq.step + 1
            # a copy: the caller's is named after its request later (its id), the kept one is not
            seq.answer = results[i].model_copy() if pending.control.step is not None else None
