"""``TorchSequenceModel``: a recurrent PyTorch model served with sequence batching, its hidden
state kept by the server between the requests of a sequence.

Configured by model-settings.json alone: ``"sequence_batching": true``, the implementation
``runtime.torch.TorchSequenceModel`` and ``parameters.extra.sequence_state``, which maps each
state input of the forward to the output that carries its next value (``{"h0": "h", "c0": "c"}``).
State inputs are declared inputs marked ``"parameters": {"optional": true}``: the client omits
them, and the server fills them from the sequence's state, or with zeros on the sequence's first
request (batch dimension: the request's rows; the other dimensions are fixed in the declaration).

A batch of steps (one per sequence) is grouped by the shapes of its inputs after the first
dimension; each group is concatenated along the first dimension and runs as one forward call of
the same :class:`~runtime.torch.runner.TorchRunner` that serves ``TorchModel`` (off the event
loop), and its outputs are cut back into one response per step. The state is kept as the host
arrays of the mapped outputs (views of the batch's outputs, no copy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput, ModelFailed
from ..sequences.model import SequenceModel, SequenceStep
from ..tensors import dtype_of
from ..types import Datatype, InferenceRequest, InferenceResponse, ResponseOutput
from .model import TorchModel
from .settings import read_config

Arrays = dict[str, np.ndarray]
Outputs = dict[str, tuple[np.ndarray, str]]


class TorchSequenceModel(TorchModel, SequenceModel):
    """A ``TorchModel`` whose state inputs are fed from each sequence's previous outputs.

    Requests outside any sequence are served by ``TorchModel.predict`` (and may be batched
    adaptively); state inputs they omit are zeros, as on a sequence's first request.
    """

    _keeps_state = True
    _state: dict[str, str]
    """State input -> the output that carries its next value."""
    _zeros: dict[str, tuple[list[int], np.dtype[Any]]]
    """State input -> its dimensions after the first, and its dtype."""

    async def load(self) -> bool:
        mapping = read_config(self.settings).options.sequence_state
        if not mapping:
            raise ValueError(
                "runtime.torch.TorchSequenceModel needs parameters.extra.sequence_state: each state input "
                'mapped to the output that carries its next value, e.g. {"h0": "h", "c0": "c"}'
            )
        inputs = {tensor.name: tensor for tensor in self.settings.inputs}
        outputs = {tensor.name: tensor for tensor in self.settings.outputs}
        zeros = {}
        for name, output in mapping.items():
            tensor = inputs.get(name)
            if tensor is None:
                raise ValueError(f"sequence_state names input {name!r}, which is not a declared input")
            if not tensor.optional:
                raise ValueError(
                    f'state input {name!r} must be declared with "parameters": {{"optional": true}}, '
                    "so that clients may omit it"
                )
            if len(tensor.shape) < 2 or any(size < 0 for size in tensor.shape[1:]):
                raise ValueError(
                    f"state input {name!r} is declared with shape {tensor.shape}; a state needs a batch "
                    "dimension and fixed dimensions after it, e.g. [-1, 1, 16]"
                )
            out = outputs.get(output)
            if out is None:
                raise ValueError(
                    f"sequence_state maps {name!r} to {output!r}, which is not a declared output "
                    f"(declared: {sorted(outputs)})"
                )
            if out.datatype != tensor.datatype:
                raise ValueError(
                    f"sequence_state maps {name!r} ({tensor.datatype.value}) to {output!r} "
                    f"({out.datatype.value}); they must have the same datatype"
                )
            zeros[name] = (list(tensor.shape[1:]), dtype_of(tensor.datatype))
        if len(zeros) == len(inputs):
            raise ValueError("every declared input is a state input; at least one must come from the client")
        self._state = dict(mapping)
        self._zeros = zeros
        return await super().load()

    # ------------------------------------------------------------------ requests outside any sequence

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = self._with_state(self._arrays(payload, frozenset(self._state)), None)
        outputs = await self.runner.infer(arrays)
        return self._response(outputs, slice(None))

    # ------------------------------------------------------------------ sequences

    async def predict_sequences(self, steps: list[SequenceStep]) -> Sequence[InferenceResponse | BaseException]:
        results: list[InferenceResponse | BaseException | None] = [None] * len(steps)
        groups: dict[tuple[Any, ...], list[tuple[int, Arrays]]] = {}
        for index, step in enumerate(steps):
            try:
                arrays = self._with_state(self._arrays(step.request, frozenset(self._state)), step.state)
            except InvalidInput as exc:
                results[index] = exc
                continue
            key = tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in arrays.items()))
            groups.setdefault(key, []).append((index, arrays))
        done = await asyncio.gather(*(self._run_group(members) for members in groups.values()), return_exceptions=True)
        for members, outcome in zip(groups.values(), done, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancellation: not a model failure
                for index, _ in members:
                    results[index] = outcome
                continue
            start = 0
            for index, arrays in members:
                rows = _rows(arrays)
                part = slice(start, start + rows)
                start += rows
                steps[index].state = {name: outcome[output][0][part] for name, output in self._state.items()}
                results[index] = self._response(outcome, part)
        return [result if result is not None else ModelFailed("step not served") for result in results]

    async def _run_group(self, members: list[tuple[int, Arrays]]) -> Outputs:
        """One forward call over the steps of a group, concatenated along the first dimension."""
        if len(members) == 1:
            arrays = members[0][1]
        else:
            arrays = {name: np.concatenate([a[name] for _, a in members], axis=0) for name in members[0][1]}
        outputs = await self.runner.infer(arrays)
        total = sum(_rows(a) for _, a in members)
        for name, (array, _) in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise ModelFailed(
                    f"Model {self.name!r} returned output {name!r} of shape {list(array.shape)} for "
                    f"{total} rows; a sequence-batched model must return one row per input row"
                )
        missing = [output for output in self._state.values() if output not in outputs]
        if missing:
            raise ModelFailed(f"Model {self.name!r} returned no state output(s) {missing}")
        return outputs

    # ------------------------------------------------------------------ helpers

    def _with_state(self, arrays: Arrays, state: dict[str, np.ndarray] | None) -> Arrays:
        """The request's arrays plus each state input it omits: the sequence's, or zeros."""
        rows = _rows(arrays)
        for name, (dims, dtype) in self._zeros.items():
            if name in arrays:
                continue  # the client's own value wins (e.g. to seed a sequence)
            kept = state.get(name) if state else None
            if kept is None:
                arrays[name] = np.zeros([rows, *dims], dtype=dtype)
            elif kept.shape[0] != rows:
                raise InvalidInput(
                    f"The sequence's state {name!r} has {kept.shape[0]} row(s) but this request has {rows}; "
                    "a sequence keeps the number of rows of its first request"
                )
            else:
                arrays[name] = kept
        return arrays

    def _response(self, outputs: Outputs, part: slice) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[
                ResponseOutput(name=name, shape=list(piece.shape), datatype=Datatype(datatype), data=piece)
                for name, (array, datatype) in outputs.items()
                for piece in (array[part],)
            ],
        )


def _rows(arrays: Arrays) -> int:
    """The rows (first dimension) the inputs agree on."""
    sizes = {array.shape[0] if array.ndim else -1 for array in arrays.values()}
    if len(sizes) != 1 or -1 in sizes:
        shapes = {name: list(array.shape) for name, array in arrays.items()}
        raise InvalidInput(f"The inputs must share their first (batch) dimension; got {shapes}")
    return sizes.pop()
