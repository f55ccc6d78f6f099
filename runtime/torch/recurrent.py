"""What carries over between calls of a recurrent model, and forward calls over several callers.

A model's ``sequence_state`` maps each state input of its forward to the output that carries its
next value; under continuous batching ``feedback`` maps inputs to the outputs they take at the
next step, ``max_steps`` bounds a stream and ``stop`` may end it earlier. :func:`read_recurrence`
checks all of that against the declared inputs and outputs when the model loads, for the
strategies its settings turn on.

:func:`run_together` serves several callers (the steps of several sequences, or of several
streams) with as few forward calls as their shapes allow: callers whose inputs agree after the
first dimension are concatenated along it into one call, the others run as separate calls.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from runtime.errors import InvalidInput, ModelFailed
from runtime.settings import ModelSettings
from runtime.tensors import dtype_of
from runtime.torch.runner import TorchRunner
from runtime.torch.torch_settings import StopRule, TorchSettings
from runtime.types import InferenceRequest, InferenceResponse

Arrays = dict[str, np.ndarray]
Outputs = dict[str, tuple[np.ndarray, str]]
"""Output name -> (host array, protocol datatype), as the runner returns them."""


class TensorModel(Protocol):
    """What the sequence and step strategies use of the model (``.model.TorchModel``)."""

    @property
    def name(self) -> str: ...

    @property
    def runner(self) -> TorchRunner: ...

    def request_arrays(self, payload: InferenceRequest, may_omit: frozenset[str] = ...) -> Arrays: ...

    def response(self, outputs: Outputs) -> InferenceResponse: ...

    def shape_problem(self, name: str, shape: tuple[int, ...]) -> str | None: ...


@dataclass(frozen=True)
class Recurrence:
    """A model's checked ``sequence_state``, ``feedback``, ``max_steps`` and ``stop``."""

    state: dict[str, str]
    """State input -> the output that carries its next value."""
    zeros: dict[str, tuple[list[int], np.dtype[Any]]]
    """State input -> its dimensions after the first, and its dtype (for a first call)."""
    feedback: dict[str, str]
    """Input -> the output it takes at the next step (continuous batching)."""
    max_steps: int
    """The most steps of one stream (continuous batching; 0 otherwise)."""
    stop: StopRule | None

    def with_state(self, arrays: Arrays, state: Arrays | None) -> Arrays:
        """``arrays`` plus each state input they lack: from ``state``, else zeros."""
        count = rows(arrays)
        for name, (dims, dtype) in self.zeros.items():
            if name in arrays:
                continue  # the client's own value wins (e.g. to seed a sequence)
            kept = state.get(name) if state else None
            if kept is None:
                arrays[name] = np.zeros([count, *dims], dtype=dtype)
            elif kept.shape[0] != count:
                raise InvalidInput(
                    f"The state {name!r} has {kept.shape[0]} row(s) but this request has {count}; "
                    "a sequence keeps the number of rows of its first request"
                )
            else:
                arrays[name] = kept
        return arrays

    def next_state(self, outputs: Outputs) -> Arrays:
        """The state the next call starts from, out of this call's outputs."""
        return {name: outputs[output][0] for name, output in self.state.items()}

    def stops(self, outputs: Outputs) -> bool:
        """Whether the stop rule ends a stream after a step with these outputs."""
        if self.stop is None:
            return False
        return bool(np.isin(outputs[self.stop.output][0], self.stop.values).all())


def read_recurrence(settings: ModelSettings, options: TorchSettings) -> Recurrence | None:
    """The model's recurrence, checked against its declarations and strategies; ValueError
    saying what is wrong. None for a model without state or steps."""
    continuous = settings.continuous_batching
    inputs = {tensor.name: tensor for tensor in settings.inputs}
    outputs = {tensor.name: tensor for tensor in settings.outputs}
    state = options.sequence_state
    if not state and settings.sequence_batching and not continuous:
        raise ValueError(
            'with "sequence_batching": true the PyTorch runtime needs parameters.extra.sequence_state: '
            'each state input mapped to the output that carries its next value, e.g. {"h0": "h", "c0": "c"}'
        )
    if state and not (settings.sequence_batching or continuous):
        raise ValueError(
            'parameters.extra.sequence_state is used with "sequence_batching": true or '
            '"continuous_batching": true, and this model\'s settings set neither'
        )
    _check_state(state, inputs, outputs)
    if not continuous:
        for key in ("feedback", "max_steps", "stop"):
            if getattr(options, key):
                raise ValueError(f'parameters.extra.{key} is used with "continuous_batching": true only')
        if not state:
            return None
    elif options.max_steps is None:
        raise ValueError(
            'with "continuous_batching": true the PyTorch runtime needs parameters.extra.max_steps: '
            "the most steps (forward calls, streamed chunks) of one stream"
        )
    for name in _check_mapping("feedback", options.feedback, inputs, outputs):
        if name in state:
            raise ValueError(f"input {name!r} is in both feedback and sequence_state")
    if options.stop is not None and options.stop.output not in outputs:
        raise ValueError(
            f"stop watches output {options.stop.output!r}, which is not a declared output "
            f"(declared: {sorted(outputs)})"
        )
    return Recurrence(
        state=dict(state),
        zeros={name: (list(inputs[name].shape[1:]), dtype_of(inputs[name].datatype)) for name in state},
        feedback=dict(options.feedback),
        max_steps=options.max_steps or 0,
        stop=options.stop,
    )


def _check_state(mapping: dict[str, str], inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    for name in _check_mapping("sequence_state", mapping, inputs, outputs):
        tensor = inputs[name]
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
    if mapping and len(mapping) == len(inputs):
        raise ValueError("every declared input is a state input; at least one must come from the client")


def _check_mapping(
    key: str, mapping: dict[str, str], inputs: dict[str, Any], outputs: dict[str, Any]
) -> list[str]:
    """The inputs of ``mapping`` (input -> output), each checked to be declared, to map to a
    declared output, and to share its datatype."""
    for name, output in mapping.items():
        tensor = inputs.get(name)
        if tensor is None:
            raise ValueError(f"{key} names input {name!r}, which is not a declared input")
        out = outputs.get(output)
        if out is None:
            raise ValueError(
                f"{key} maps {name!r} to {output!r}, which is not a declared output (declared: {sorted(outputs)})"
            )
        if out.datatype != tensor.datatype:
            raise ValueError(
                f"{key} maps {name!r} ({tensor.datatype.value}) to {output!r} ({out.datatype.value}); "
                "they must have the same datatype"
            )
    return list(mapping)


async def run_together(runner: TorchRunner, items: list[Arrays]) -> list[tuple[Outputs, slice] | Exception]:
    """Serve each caller's arrays, concatenating callers whose inputs agree after the first
    dimension into one forward call; per caller, the call's outputs and its rows in them (or the
    exception that failed its call). Cancellation propagates."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, arrays in enumerate(items):
        key = tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in arrays.items()))
        groups.setdefault(key, []).append(index)
    members = list(groups.values())
    done = await asyncio.gather(
        *(_call(runner, [items[i] for i in group]) for group in members), return_exceptions=True
    )
    results: list[tuple[Outputs, slice] | Exception] = [ModelFailed("not served")] * len(items)
    for group, outcome in zip(members, done, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome  # cancellation: not a model failure
            for index in group:
                results[index] = outcome
            continue
        start = 0
        for index in group:
            count = rows(items[index])
            results[index] = (outcome, slice(start, start + count))
            start += count
    return results


async def _call(runner: TorchRunner, group: list[Arrays]) -> Outputs:
    """One forward call over a group, concatenated along the first dimension."""
    if len(group) == 1:
        arrays = group[0]
    else:
        arrays = {name: np.concatenate([a[name] for a in group], axis=0) for name in group[0]}
    outputs = await runner.infer(arrays)
    total = sum(rows(a) for a in group)
    for name, (array, _) in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ModelFailed(
                f"Model {runner.name!r} returned output {name!r} of shape {list(array.shape)} for "
                f"{total} rows; a model that keeps state or steps streams must return one row per input row"
            )
    return outputs


def rows(arrays: Arrays) -> int:
    """The rows (first dimension) the inputs agree on."""
    sizes = {array.shape[0] if array.ndim else -1 for array in arrays.values()}
    if len(sizes) != 1 or -1 in sizes:
        shapes = {name: list(array.shape) for name, array in arrays.items()}
        raise InvalidInput(f"The inputs must share their first (batch) dimension; got {shapes}")
    return sizes.pop()


def part(outputs: Outputs, rows_: slice) -> Outputs:
    """One caller's rows of a call's outputs (views, no copy)."""
    return {name: (array[rows_], datatype) for name, (array, datatype) in outputs.items()}
