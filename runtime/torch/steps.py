"""Continuous batching of a PyTorch model: every running stream advances by one forward call per step.

With ``"continuous_batching": true`` each streaming request is a stream of the running set (see
:mod:`runtime.continuous`), and the model's settings say how a stream goes on from one step to the
next (``parameters.extra``, checked at load by :func:`~.recurrent.read_recurrence`):

- the first step takes the request's inputs (state inputs it omits are zeros);
- each later step takes the previous step's outputs named by ``feedback`` (the generated token
  becomes the next input) and by ``sequence_state`` (the hidden state), and the request's value
  for every other input;
- every step sends one chunk, the step's outputs for the stream's rows; the stream ends after
  ``max_steps`` steps (or the request's ``max_tokens``, when fewer), or after the step whose
  ``stop`` output holds only stop values.

One step serves every stream with as few forward calls as their shapes allow: streams whose inputs
agree after the first dimension share one call (a stream reading its prompt runs beside the ones
generating, in a call of its own). A unary request runs as a stream too and is answered with its
chunks combined (:func:`combine`).

With ``"sequence_batching": true`` as well, a stream of a sequence starts from the sequence's
state and leaves its last state to the sequence: a conversation goes on where the previous request
left it. The requests of one sequence step in their arrival order: a later one waits, sending
nothing, until the earlier one has finished.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.continuous import StepResult, Stream, stack_chunks
from runtime.errors import InvalidInput, ModelFailed
from runtime.tensors import output_array
from runtime.torch.recurrent import Arrays, Outputs, Recurrence, TensorModel, part, rows, run_together
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


class Decoding:
    """One stream's progress (``stream.state``)."""

    __slots__ = ("done", "failed", "inputs", "limit", "rows", "state")

    def __init__(self, inputs: Arrays, limit: int) -> None:
        self.inputs = inputs
        """The inputs of the stream's next step, state inputs apart (unless the client gave them)."""
        self.limit = limit
        """The most steps this stream takes."""
        self.rows = rows(inputs)
        self.done = 0
        """Steps taken."""
        self.state: Arrays | None = None
        """The stream's own state (outside any sequence; a sequence's streams share the sequence's)."""
        self.failed: Exception | None = None
        """Why the stream cannot take another step (it ends with this error at its next step)."""


class Steps:
    """A model's continuous batching: the streams' progress, and which stream of a sequence steps."""

    def __init__(self, model: TensorModel, recurrence: Recurrence) -> None:
        self.model = model
        self.recurrence = recurrence
        self._turns: dict[str, list[Stream]] = {}
        """Sequence id -> its started streams in arrival order; the first one steps."""

    def start(self, stream: Stream) -> None:
        """Check the stream's request and set up its progress (InvalidInput: a 400, nothing streamed)."""
        recurrence = self.recurrence
        arrays = self.model.request_arrays(stream.request, frozenset(recurrence.state))
        decoding = Decoding(arrays, _limit(stream.request, recurrence.max_steps))
        sequence = stream.sequence
        if sequence is not None:
            kept = sequence.state
            if isinstance(kept, dict):
                recurrence.with_state(dict(arrays), kept)  # InvalidInput now for a mismatch of rows
            self._turns.setdefault(sequence.id, []).append(stream)
        stream.state = decoding

    def end(self, stream: Stream) -> None:
        """The stream left the running set."""
        if stream.sequence is None:
            return
        turns = self._turns.get(stream.sequence.id)
        if turns is not None and stream in turns:
            turns.remove(stream)
            if not turns:
                del self._turns[stream.sequence.id]

    async def step(self, streams: list[Stream]) -> Sequence[StepResult]:
        """One forward call per group of streams that agree in shape; one result per stream.

        A forward call that raises fails the whole step before any stream's progress changed, so
        that the server can run each stream alone and end only those that fail alone."""
        recurrence = self.recurrence
        results = [StepResult() for _ in streams]
        served: list[tuple[int, Arrays]] = []
        for index, stream in enumerate(streams):
            sequence = stream.sequence
            if sequence is not None and self._turns.get(sequence.id, [stream])[0] is not stream:
                continue  # an earlier request of its sequence is still streaming
            decoding: Decoding = stream.state
            if decoding.failed is not None:
                results[index] = StepResult(error=decoding.failed)
                continue
            try:
                kept = sequence.state if sequence is not None else decoding.state
                served.append((index, recurrence.with_state(dict(decoding.inputs), kept)))
            except InvalidInput as exc:
                results[index] = StepResult(error=exc)
        outcomes = await run_together(self.model.runner, [arrays for _, arrays in served])
        done = []
        for (index, _), outcome in zip(served, outcomes, strict=True):
            if isinstance(outcome, Exception):
                raise outcome  # before any stream advanced
            done.append((index, outcome))
        for index, outcome in done:
            results[index] = self._advance(streams[index], part(*outcome))
        return results

    def _advance(self, stream: Stream, outputs: Outputs) -> StepResult:
        recurrence = self.recurrence
        decoding: Decoding = stream.state
        state = recurrence.next_state(outputs)
        if stream.sequence is not None:
            stream.sequence.state = state
        else:
            decoding.state = state
        for name in recurrence.state:
            decoding.inputs.pop(name, None)  # a state the client seeded is now the kept one
        decoding.done += 1
        finished = decoding.done >= decoding.limit or recurrence.stops(outputs)
        if not finished:
            for name, output in recurrence.feedback.items():
                value = outputs[output][0]
                why = self.model.shape_problem(name, value.shape)
                if why is not None:  # this step's chunk is good; the stream cannot go on
                    decoding.failed = ModelFailed(
                        f"Model {self.model.name!r} returned output {output!r} of shape {list(value.shape)}, "
                        f"which cannot feed input {name!r} at the next step: {why}"
                    )
                    break
                decoding.inputs[name] = value
        return StepResult(self.model.response(outputs), finished=finished)

    def combine(self, chunks: list[InferenceResponse]) -> InferenceResponse:
        """A unary request's answer: each output's chunks stacked along a new step axis after the
        rows (``[rows, steps, ...]``: a ``[rows, 1]`` token per step gives ``[rows, steps, 1]``),
        and the state outputs' last value."""
        if not chunks:
            return stack_chunks(self.model.name, chunks)  # raises: a unary request got no chunk
        last = chunks[-1]
        kept = set(self.recurrence.state.values())
        outputs = []
        for out in last.outputs:
            if out.name in kept:
                outputs.append(out)
                continue
            data = np.stack([_array_of(chunk, out.name) for chunk in chunks], axis=1)
            outputs.append(
                ResponseOutput(name=out.name, shape=list(data.shape), datatype=out.datatype, data=data)
            )
        return last.model_copy(update={"outputs": outputs})  # the last chunk's id and parameters


def _array_of(chunk: InferenceResponse, name: str) -> np.ndarray:
    for out in chunk.outputs:
        if out.name == name:
            return output_array(out).reshape(out.shape)
    raise ModelFailed(f"a chunk lacks output {name!r}")


def _limit(request: InferenceRequest, max_steps: int) -> int:
    """The steps a stream may take: the request's ``max_tokens`` when given (at most ``max_steps``)."""
    wanted = getattr(request.parameters, "max_tokens", None) if request.parameters is not None else None
    if wanted is None:
        return max_steps
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise InvalidInput(f"Parameter 'max_tokens' must be a positive integer, got {wanted!r}")
    if wanted > max_steps:
        raise InvalidInput(
            f"Parameter 'max_tokens' is {wanted}, more than this model's max_steps ({max_steps})"
        )
    return wanted
