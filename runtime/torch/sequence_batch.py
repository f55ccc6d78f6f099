"""Sequence batching of a PyTorch model: its hidden state kept by the server between the
requests of a sequence.

With ``"sequence_batching": true`` and ``parameters.extra.sequence_state`` (each state input of
the forward mapped to the output that carries its next value, ``{"h0": "h", "c0": "c"}``), a
batch of steps (one per sequence) is served by :func:`predict_sequences`: each step's state
inputs are the sequence's state, or zeros on its first request (batch dimension: the request's
rows; the other dimensions are fixed in the declaration). Steps whose inputs agree after the first
dimension share one forward call of the model's runner (off the event loop), and the outputs are
cut back into one response per step. The state is kept as the host arrays of the mapped outputs
(views of the batch's outputs, no copy).
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.errors import InvalidInput
from runtime.sequences.sequence_model import SequenceStep
from runtime.torch.recurrent import Arrays, Recurrence, TensorModel, part, run_together
from runtime.types import InferenceResponse


async def predict_sequences(
    model: TensorModel, recurrence: Recurrence, steps: list[SequenceStep]
) -> Sequence[InferenceResponse | BaseException]:
    """One response (or the error of that step alone) per step, in order; each served step's
    ``state`` becomes the sequence's next state."""
    results: list[InferenceResponse | BaseException] = [InvalidInput("not served")] * len(steps)
    served: list[tuple[int, Arrays]] = []
    for index, step in enumerate(steps):
        try:
            arrays = model.request_arrays(step.request, frozenset(recurrence.state))
            served.append((index, recurrence.with_state(arrays, step.state)))
        except InvalidInput as exc:
            results[index] = exc
    outcomes = await run_together(model.runner, [arrays for _, arrays in served])
    for (index, _), outcome in zip(served, outcomes, strict=True):
        if isinstance(outcome, Exception):
            results[index] = outcome
            continue
        outputs = part(*outcome)
        steps[index].state = recurrence.next_state(outputs)
        results[index] = model.response(outputs)
    return results
