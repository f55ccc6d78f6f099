"""The generate extension, transport-free: text in, text out, on top of ordinary inference.

A generate request ``{"text_input": str, "parameters"?: {...}, "id"?: str}`` becomes an
``InferenceRequest`` with one BYTES input (named by the model's ``generate.text_input`` setting,
``text_input`` by default) holding the UTF-8 text, the generate parameters as request parameters
(``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``details`` and any other key), and the id.

The model's response becomes ``{"text_output", "model_name", "model_version"?, "details"?}``:
``text_output`` is the text of its BYTES output named by ``generate.text_output`` (``text_output``
by default), which must hold one element. ``details`` is sent only when the request asked for it
(``parameters.details: true``) and the model gave some: its response parameter ``details`` (an
object), with its response parameter ``finish_reason`` (``length``, ``eos_token`` or
``stop_sequence``) added when present. Streamed, each response is one such object, whose
``text_output`` is that response's piece of text.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import InvalidInput, ModelFailed
from runtime.settings import ModelSettings
from runtime.types import Datatype, InferenceRequest, InferenceResponse, Parameters, RequestInput

FinishReason = Literal["length", "eos_token", "stop_sequence"]


class GenerateParameters(BaseModel):
    """The generate parameters the OIP names; any other key is kept and passed to the model."""

    model_config = ConfigDict(extra="allow", defer_build=True)  # built by the first generate request

    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: list[str] | None = None
    details: bool | None = None


class GenerateRequest(BaseModel):
    """The body of POST .../generate and .../generate_stream (OIP generate extension)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)  # built by the first generate request

    id: str | None = None
    text_input: str
    parameters: GenerateParameters | None = None


class _GenerateResponseFields(TypedDict):
    text_output: str
    model_name: str


class GenerateResponse(_GenerateResponseFields, total=False):
    """The answer to a generate request, and each event of a generate stream."""

    model_version: str
    details: dict[str, Any]


def is_generate_body(document: Any) -> bool:
    """Whether a parsed JSON body is a generate request (rather than a tensor InferenceRequest)."""
    return isinstance(document, dict) and "text_input" in document and "inputs" not in document


def to_inference_request(body: GenerateRequest, settings: ModelSettings) -> InferenceRequest:
    """The inference request a generate request stands for, for the model ``settings`` describe."""
    name = settings.generate.text_input
    shape = [1]
    declared = next((tensor for tensor in settings.inputs if tensor.name == name), None)
    if declared is not None:
        if declared.datatype is not Datatype.BYTES:
            raise InvalidInput(
                f"Model {settings.name!r} declares input {name!r} as {declared.datatype.value}; "
                "the generate extension needs a BYTES input"
            )
        if declared.shape and all(dim in (1, -1) for dim in declared.shape):
            shape = [1] * len(declared.shape)
    parameters = body.parameters.model_dump(exclude_none=True) if body.parameters else {}
    return InferenceRequest(
        id=body.id,
        parameters=Parameters(**parameters) if parameters else None,
        inputs=[
            RequestInput(
                name=name,
                shape=shape,
                datatype=Datatype.BYTES,
                parameters=Parameters(content_type="str"),
                data=[body.text_input.encode("utf-8")],
            )
        ],
    )


def wants_details(body: GenerateRequest) -> bool:
    return bool(body.parameters and body.parameters.details)


def to_generate_response(
    response: InferenceResponse, settings: ModelSettings, details: bool
) -> GenerateResponse:
    """The generate answer for a model's (checked) response."""
    name = settings.generate.text_output
    output = next((out for out in response.outputs if out.name == name), None)
    if output is None:
        raise ModelFailed(
            f"Model {response.model_name!r} returned no output {name!r} for the generate extension "
            f"(it returned {[out.name for out in response.outputs]}); "
            "model-settings.json can name another one in generate.text_output"
        )
    answer: GenerateResponse = {"text_output": _text(output.data, name), "model_name": response.model_name}
    if response.model_version is not None:
        answer["model_version"] = response.model_version
    if details:
        found = _details(response.parameters)
        if found:
            answer["details"] = found
    return answer


def _text(data: Any, name: str) -> str:
    items = data.reshape(-1) if isinstance(data, np.ndarray) else np.asarray(data, dtype=object).reshape(-1)
    if items.size != 1:
        raise ModelFailed(
            f"Output {name!r} has {items.size} elements; the generate extension needs exactly one"
        )
    item = items[0]
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item).decode("utf-8", errors="replace")
    return str(item)


def _details(parameters: Parameters | None) -> dict[str, Any]:
    extra = parameters.model_extra if parameters is not None else None
    if not extra:
        return {}
    given = extra.get("details")
    details: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    finish = extra.get("finish_reason")
    if finish is not None and "finish_reason" not in details:
        details["finish_reason"] = finish
    return details
