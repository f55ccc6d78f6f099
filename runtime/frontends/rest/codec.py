"""REST wire format ⇄ the core's types: JSON bodies and the binary tensor data extension.

A request body is JSON, or (binary tensor data extension) a JSON header of
``Inference-Header-Content-Length`` bytes followed by the raw bytes of the inputs whose
parameters carry ``binary_data_size``, in input order. The body's Content-Type is not looked at:
real clients (tritonclient) send none. Raw bytes go into ``RequestInput.data`` as a memoryview;
the core turns them into ``np.frombuffer`` views.

A response is JSON, or JSON plus raw output bytes when the request asked for binary outputs
(``binary_data_output`` on the request, or ``binary_data`` on a requested output).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from pydantic import ValidationError

from runtime.errors import InvalidInput
from runtime.tensors import to_json_data, to_raw
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    ResponseOutput,
    extras,
    request_from_json,
    set_field,
)

HEADER_LENGTH = "inference-header-content-length"
JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(document: Any) -> bytes:
    return orjson.dumps(document, option=JSON_OPTIONS)


def validation_message(exc: ValidationError) -> str:
    """A one-line summary of what pydantic found wrong, naming the fields."""
    problems = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False)[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "body"
        problems.append(f"{where}: {error['msg']}")
    more = len(exc.errors()) - len(problems)
    suffix = f" (and {more} more)" if more > 0 else ""
    return "Invalid request: " + "; ".join(problems) + suffix


_NON_FINITE_TOKENS = (b"NaN", b"Infinity")


def parse_json(body: bytes | memoryview) -> Any:
    """A JSON document; the tokens ``NaN``, ``Infinity`` and ``-Infinity`` are accepted too (as
    Python's json and Triton's reader do), so that every float can be sent as it is."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        text = bytes(body)
        if any(token in text for token in _NON_FINITE_TOKENS):  # orjson has no option for them
            try:
                return json.loads(text)
            except ValueError:
                pass
        raise InvalidInput(f"Malformed JSON: {exc}") from None


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview | None]:
    """The JSON part of a body and, with the binary extension, the binary part after it."""
    if header_length is None:
        return body, None
    try:
        size = int(header_length)
    except ValueError:
        raise InvalidInput(
            f"Inference-Header-Content-Length must be an integer, got {header_length!r}"
        ) from None
    if size < 0 or size > len(body):
        raise InvalidInput(f"Inference-Header-Content-Length is {size} but the body has {len(body)} bytes")
    return body[:size], memoryview(body)[size:]


def parse_request(json_part: bytes, binary: memoryview | None) -> InferenceRequest:
    """An InferenceRequest from a JSON header and the binary part that follows it, if any."""
    try:
        request = request_from_json(json_part)
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc)) from None
    if binary is not None:
        attach_binary(request, binary)
    return request


def attach_binary(request: InferenceRequest, binary: memoryview) -> None:
    offset = 0
    for inp in request.inputs:
        size = _binary_size(inp.parameters, inp.name)
        if size is None:
            continue
        if inp.data is not None:
            raise InvalidInput(f"Input {inp.name!r} has both JSON data and binary_data_size")
        if offset + size > len(binary):
            raise InvalidInput(
                f"Input {inp.name!r} claims {size} binary bytes but only {len(binary) - offset} remain in the body"
            )
        set_field(inp, "data", binary[offset : offset + size])
        offset += size
    if offset != len(binary):
        raise InvalidInput(
            f"The body has {len(binary) - offset} binary bytes that no input's binary_data_size accounts for"
        )


def _binary_size(parameters: Parameters | None, name: str) -> int | None:
    if parameters is None:
        return None
    extra = extras(parameters)
    if not extra or "binary_data_size" not in extra:
        return None
    size = extra["binary_data_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(f"Input {name!r}: binary_data_size must be a non-negative integer")
    return size


def _flag(parameters: Parameters | None, key: str) -> bool | None:
    extra = extras(parameters)
    if not extra:
        return None
    value = extra.get(key)
    return value if isinstance(value, bool) else None


_PLAIN_VALUES = frozenset({str, int, bool, float})
"""Extra values pydantic dumps as they are (exactly these types: not a subclass such as UInt64)."""


def _parameters(parameters: Parameters | None) -> dict[str, Any] | None:
    if parameters is None:
        return None
    # the common case (a sequence's answer: only extras, each a plain value) without pydantic's
    # serializer: what model_dump(exclude_none=True) gives for it
    extra = extras(parameters)
    if extra is not None and type(parameters) is Parameters:
        values = parameters.__dict__
        if values["content_type"] is None and values["headers"] is None and len(values) == 2:
            data = {}
            for name, value in extra.items():
                if type(value) in _PLAIN_VALUES:
                    data[name] = value
                elif value is not None:
                    break
            else:
                return data or None
    data = parameters.model_dump(exclude_none=True)
    return data or None


_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})


def encode_response(
    response: InferenceResponse, request: InferenceRequest | None
) -> tuple[bytes, dict[str, str]]:
    """The response body, and the headers that go with it (binary extension)."""
    # (parameters that are None are skipped here rather than in _flag and _parameters: most
    # requests and responses have none, and this runs for every one)
    asked = request.parameters if request is not None else None
    binary_all = bool(asked is not None and _flag(asked, "binary_data_output"))
    requested = {out.name: out.parameters for out in request.outputs} if request and request.outputs else {}
    parts: list[bytes | memoryview] = []
    outputs = []
    floats: list[tuple[dict[str, Any], ResponseOutput, str]] = []  # JSON float outputs, unchecked
    for out in response.outputs:
        kind = out.datatype
        datatype = kind._value_ if type(kind) is Datatype else kind.value
        doc: dict[str, Any] = {"name": out.name, "datatype": datatype, "shape": out.shape}
        params = _parameters(out.parameters) if out.parameters is not None else None
        own = _flag(requested.get(out.name), "binary_data") if requested else None
        if own if own is not None else binary_all:
            raw = to_raw(out.data, datatype)
            params = {
                **(params or {}),
                "binary_data_size": len(raw) if isinstance(raw, bytes) else raw.nbytes,
            }
            parts.append(raw)
        elif datatype in _FLOATS:  # NaN and infinities: see below
            doc["data"] = to_json_data(out.data, datatype, check_finite=False)
            floats.append((doc, out, datatype))
        else:
            doc["data"] = to_json_data(out.data, datatype)
        if params:
            doc["parameters"] = params
        outputs.append(doc)
    document: dict[str, Any] = {"model_name": response.model_name}
    if response.model_version is not None:
        document["model_version"] = response.model_version
    if response.id is not None:
        document["id"] = response.id
    if response.parameters is not None:
        params = _parameters(response.parameters)
        if params:
            document["parameters"] = params
    document["outputs"] = outputs
    header = orjson.dumps(document, option=JSON_OPTIONS)
    if floats and b"null" in header:
        # orjson writes a NaN or an infinity as null (or the null is elsewhere, in a parameter or a
        # string): the float outputs again, checked, so that such values are written as tokens
        for doc, out, datatype in floats:
            doc["data"] = to_json_data(out.data, datatype)
        header = orjson.dumps(document, option=JSON_OPTIONS)
    if not parts:
        return header, {}
    body = b"".join([header, *parts])
    return body, {"Inference-Header-Content-Length": str(len(header))}
