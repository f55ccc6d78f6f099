"""Merging requests into one along the first dimension, and splitting the batch's response back.

Requests can share a batch only when nothing the model sees would differ between them except
their rows (:func:`batch_key`): the same input names, datatypes and dimensions after the first,
the same parameters that reach the model (content types, custom request parameters), the same
parameters on requested outputs. Parameters that only concern the caller's own transport or
queue are left out of the key and out of the merged request: ``timeout``, ``priority``,
``headers``, ``binary_data_output``, ``triton_*`` on the request, ``binary_data_size`` on inputs,
``binary_data`` on requested outputs. Those stay with each caller's own request, and so does
its list of requested outputs: the merged request asks for the union (or all outputs when any
caller asked for all), and each caller's response keeps only what it asked for.

A request whose inputs have no first dimension, or disagree on it, is served alone (key None).

The model must answer a merged request with outputs whose first dimension is the batch's total
number of rows; anything else is a :class:`~runtime.errors.ModelFailed`, never a guess.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from runtime.errors import ModelFailed
from runtime.tensors import input_array, output_array
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
    built,
    extra_parameters,
)

CALLER_REQUEST_PARAMETERS = frozenset({"timeout", "priority", "headers", "binary_data_output"})
CALLER_INPUT_PARAMETERS = frozenset({"binary_data_size"})
CALLER_OUTPUT_PARAMETERS = frozenset({"binary_data"})


@dataclass(frozen=True)
class BatchShape:
    """How a request can be batched: its group key (None: alone) and its number of rows."""

    key: Hashable | None
    rows: int


def _freeze(value: Any) -> Hashable:
    if isinstance(value, (list, dict)):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    return (type(value).__name__, value)


def model_parameters(parameters: Parameters | None, caller_only: frozenset[str]) -> dict[str, Any]:
    """The parameters that reach the model: all but those that concern only the caller."""
    if parameters is None:
        return {}
    found: dict[str, Any] = {}
    if parameters.content_type is not None:
        found["content_type"] = parameters.content_type
    if parameters.headers is not None and "headers" not in caller_only:
        found["headers"] = parameters.headers
    for name, value in (parameters.model_extra or {}).items():
        if name not in caller_only and not name.startswith("triton_") and value is not None:
            found[name] = value
    return found


def _key_of(parameters: dict[str, Any]) -> Hashable:
    return tuple(sorted((name, _freeze(value)) for name, value in parameters.items()))


def _first(item: tuple[Any, ...]) -> Any:
    return item[0]


def batch_shape(request: InferenceRequest, default_is_all: bool = True) -> BatchShape:
    """The group a request batches in, and its rows. Inputs must already be checked arrays.

    ``default_is_all``: whether the model answers a request that names no outputs with all of
    them (``MLModel.default_outputs_all``); when it does not, such requests batch only together."""
    rows = -1
    inputs: list[tuple[Any, ...]] = []
    for inp in request.inputs:
        data = inp.data
        if not isinstance(data, np.ndarray) or data.shape != tuple(inp.shape):
            inp.data = data = input_array(inp)  # normally done once by the DataPlane
        if not inp.shape or (rows >= 0 and inp.shape[0] != rows):
            return BatchShape(None, 1)
        rows = inp.shape[0]
        params = model_parameters(inp.parameters, CALLER_INPUT_PARAMETERS)
        inputs.append((inp.name, inp.datatype, tuple(inp.shape[1:]), _key_of(params) if params else ()))
    if rows < 0:
        return BatchShape(None, 1)
    if len(inputs) > 1:
        inputs.sort(key=_first)
    outputs: list[tuple[Any, ...]] = []
    for out in request.outputs or ():
        params = model_parameters(out.parameters, CALLER_OUTPUT_PARAMETERS)
        if params:
            outputs.append((out.name, _key_of(params)))
    if len(outputs) > 1:
        outputs.sort(key=_first)
    request_params = model_parameters(request.parameters, CALLER_REQUEST_PARAMETERS)
    key: Hashable = (tuple(inputs), tuple(outputs), _key_of(request_params) if request_params else ())
    if not default_is_all:
        key = (key, not request.outputs)
    return BatchShape(key, rows)


def merge(requests: Sequence[InferenceRequest], rows: Sequence[int], batch_id: int) -> InferenceRequest:
    """One request holding the rows of ``requests`` (all of one batch key), in order."""
    first = requests[0]
    total = sum(rows)
    inputs = []
    for index, inp in enumerate(first.inputs):
        if len(requests) == 1:
            data = inp.data
        else:
            data = np.concatenate([_same_input(r, index, inp.name).data for r in requests], axis=0)
        params = model_parameters(inp.parameters, CALLER_INPUT_PARAMETERS)
        inputs.append(
            RequestInput(
                name=inp.name,
                shape=[total, *inp.shape[1:]],
                datatype=inp.datatype,
                parameters=Parameters(**params) if params else None,
                data=data,
            )
        )
    params = model_parameters(first.parameters, CALLER_REQUEST_PARAMETERS)
    return InferenceRequest(
        id=f"batch-{batch_id}",
        parameters=Parameters(**params) if params else None,
        inputs=inputs,
        outputs=_merged_outputs(requests),
    )


def _same_input(request: InferenceRequest, index: int, name: str) -> RequestInput:
    inputs = request.inputs
    if index < len(inputs) and inputs[index].name == name:
        return inputs[index]
    return next(inp for inp in inputs if inp.name == name)


def _merged_outputs(requests: Sequence[InferenceRequest]) -> list[RequestOutput] | None:
    if any(not r.outputs for r in requests):
        return None  # someone asked for every output
    merged: dict[str, RequestOutput] = {}
    for request in requests:
        for out in request.outputs or ():
            if out.name not in merged:
                params = model_parameters(out.parameters, CALLER_OUTPUT_PARAMETERS)
                merged[out.name] = RequestOutput(
                    name=out.name, parameters=Parameters(**params) if params else None
                )
    return list(merged.values())


def split(
    response: Any, rows: Sequence[int], model: str, extra: Sequence[dict[str, Any]]
) -> list[InferenceResponse]:
    """Cut a batch's response into one response per request, ``rows[i]`` rows each.

    ``extra[i]`` holds response parameters to add to the i-th response (batch id and size).
    Each piece's outputs are views of the batch's arrays (no copy).
    """
    if not isinstance(response, InferenceResponse):
        raise ModelFailed(f"Model {model!r} returned a {type(response).__name__}, not an InferenceResponse")
    total = sum(rows)
    arrays = []
    for out in response.outputs:
        array = output_array(out)
        if not out.shape or out.shape[0] != total:
            raise ModelFailed(
                f"Model {model!r} returned output {out.name!r} of shape {list(out.shape)} for a batch of "
                f"{total} rows from {len(rows)} requests; a batched model must return {total} rows "
                "(first dimension) in every output"
            )
        arrays.append(array.reshape(out.shape))
    common = response.parameters.model_dump(exclude_none=True) if response.parameters else {}
    # the pieces are made from values of the batch's response, already of their fields' types:
    # built as validation would build them, without validating each piece again (``types.built``)
    plain = (
        type(response) is InferenceResponse
        and type(response.model_name) is str
        and (response.model_version is None or type(response.model_version) is str)
    )
    outs = [(out, arrays[i], plain and _plain_output(out)) for i, out in enumerate(response.outputs)]
    pieces: list[InferenceResponse] = []
    start = 0
    for count, params in zip(rows, extra, strict=True):
        end = start + count
        outputs = [_output(out, [count, *out.shape[1:]], array[start:end], fast) for out, array, fast in outs]
        values = {**common, **params}
        parameters = _parameters(values)
        if plain:
            pieces.append(
                built(
                    InferenceResponse,
                    {
                        "model_name": response.model_name,
                        "model_version": response.model_version,
                        "id": None,
                        "parameters": parameters,
                        "outputs": outputs,
                    },
                    set(_RESPONSE_SET),
                )
            )
        else:
            pieces.append(
                InferenceResponse(
                    model_name=response.model_name,
                    model_version=response.model_version,
                    parameters=parameters,
                    outputs=outputs,
                )
            )
        start = end
    return pieces


_RESPONSE_SET = frozenset({"model_name", "model_version", "parameters", "outputs"})
_OUTPUT_SET = frozenset({"name", "shape", "datatype", "parameters", "data"})
_PARAMETER_FIELDS = frozenset(Parameters.model_fields)


def _plain_output(out: ResponseOutput) -> bool:
    """Whether ``out``'s name and datatype are of their fields' types (a model may have assigned
    others after building it: those pieces are validated, which converts them, as before)."""
    return type(out) is ResponseOutput and type(out.name) is str and type(out.datatype) is Datatype


def _output(out: ResponseOutput, shape: list[int], data: Any, fast: bool) -> ResponseOutput:
    parameters = out.parameters.model_copy() if out.parameters else None
    if fast:
        values = {
            "name": out.name,
            "shape": shape,
            "datatype": out.datatype,
            "parameters": parameters,
            "data": data,
        }
        return built(ResponseOutput, values, set(_OUTPUT_SET))
    return ResponseOutput(name=out.name, shape=shape, datatype=out.datatype, parameters=parameters, data=data)


def _parameters(values: dict[str, Any]) -> Parameters:
    """``Parameters(**values)``; without validation when every name is an extra one (pydantic
    keeps extras as given)."""
    if not _PARAMETER_FIELDS.isdisjoint(values):
        return Parameters(**values)
    return extra_parameters(values)
