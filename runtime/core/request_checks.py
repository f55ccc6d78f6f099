"""The checks every request and response go through, whatever the transport.

A request is checked against the model's declared inputs and outputs, and every input's data
becomes a numpy array of its shape, once (:func:`prepare_request`); a body of raw bytes becomes
the model's single input (:func:`raw_request`); a response is named after the model and the
request it answers, its outputs checked, and only those asked for kept (:func:`finish_response`).
The DataPlane runs them for unary requests and each stream's requests.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import InvalidInput, ModelFailed
from runtime.ids import assign_id
from runtime.settings import ModelSettings
from runtime.tensors import dtype_of, element_count, input_array, output_array
from runtime.types import (
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    RequestInput,
    set_field,
    set_fields,
)


def prepare_request(request: InferenceRequest, settings: ModelSettings) -> None:
    """Check a request against the model's settings (its declared inputs and outputs) and turn
    every input's data into a numpy array."""
    declared = {tensor.name: tensor for tensor in settings.inputs} if settings.inputs else None
    seen: set[str] = set()
    for inp in request.inputs:
        if inp.name in seen:
            raise InvalidInput(f"Input {inp.name!r} appears more than once")
        seen.add(inp.name)
        if declared:
            _check_declared(inp, declared, settings.name)
        set_field(inp, "data", input_array(inp))
    if declared and settings.require_declared_inputs:
        missing = [name for name, tensor in declared.items() if name not in seen and not tensor.optional]
        if missing:
            raise InvalidInput(f"Model {settings.name!r} expects input(s) {missing} which the request lacks")
    if request.outputs and settings.outputs:
        known = {tensor.name for tensor in settings.outputs}
        for out in request.outputs:
            if out.name not in known:
                raise InvalidInput(
                    f"Model {settings.name!r} has no output {out.name!r}; its outputs are {sorted(known)}"
                )


def _check_declared(inp: RequestInput, declared: dict[str, MetadataTensor], model: str) -> None:
    spec = declared.get(inp.name)
    if spec is None:
        raise InvalidInput(f"Model {model!r} has no input {inp.name!r}; its inputs are {sorted(declared)}")
    if spec.datatype != inp.datatype:
        raise InvalidInput(f"Input {inp.name!r} must be {spec.datatype.value}, got {inp.datatype.value}")
    if spec.shape and not _shape_fits(inp.shape, spec.shape):
        raise InvalidInput(f"Input {inp.name!r} must have shape {spec.shape} (-1: any), got {inp.shape}")


def _shape_fits(shape: list[int], spec: list[int]) -> bool:
    if len(shape) != len(spec):
        return False
    for d, s in zip(shape, spec, strict=True):  # a loop, not all() over a generator: runs per input
        if s != d and s != -1:
            return False
    return True


def raw_request(body: bytes | memoryview, inputs: list[MetadataTensor]) -> InferenceRequest:
    """A request whose whole body is the raw data of the model's single declared input."""
    if len(inputs) != 1:
        raise InvalidInput(
            "A request without a JSON header (Inference-Header-Content-Length: 0) needs a model "
            f"that declares exactly one input; this one declares {len(inputs)}"
        )
    spec = inputs[0]
    shape = list(spec.shape)
    unknown = [i for i, d in enumerate(shape) if d < 0]
    if len(unknown) > 1 or (spec.datatype.value == "BYTES" and unknown):
        raise InvalidInput(f"Input {spec.name!r} has shape {spec.shape}; a raw body cannot say its size")
    if unknown:
        known = element_count([d for d in shape if d >= 0]) * dtype_of(spec.datatype).itemsize
        if known == 0 or len(body) % known:
            raise InvalidInput(
                f"A raw body of {len(body)} bytes does not fit input {spec.name!r} {spec.shape}"
            )
        shape[unknown[0]] = len(body) // known
    return InferenceRequest(
        inputs=[RequestInput(name=spec.name, shape=shape, datatype=spec.datatype, data=body)]
    )


def finish_response(
    response: InferenceResponse, request: InferenceRequest | None, settings: ModelSettings
) -> InferenceResponse:
    """Name the response after the model (its settings) and the request, check its outputs, keep
    only those asked for."""
    # (``type(...) is`` first: pydantic's classes answer isinstance through ABCMeta, in Python)
    if type(response) is not InferenceResponse and not isinstance(response, InferenceResponse):
        raise ModelFailed(
            f"Model {settings.name!r} returned a {type(response).__name__}, not an InferenceResponse"
        )
    named: dict[str, Any] = {"model_name": settings.name}
    if response.model_version is None:
        named["model_version"] = settings.version
    if request is not None:
        if request.id is not None:
            named["id"] = request.id
        elif response.id is None:
            named["id"] = assign_id(request)
    set_fields(response, named)
    for out in response.outputs:
        set_field(out, "data", output_array(out))
    if request is not None and request.outputs:
        by_name = {out.name: out for out in response.outputs}
        wanted = []
        for requested in request.outputs:
            found = by_name.get(requested.name)
            if found is None:
                raise InvalidInput(
                    f"Output {requested.name!r} was requested but model {settings.name!r} "
                    f"returned only {sorted(by_name)}"
                )
            wanted.append(found)
        response.outputs = wanted
    return response
