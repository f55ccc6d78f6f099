"""TorchServe requests and answers as Open Inference Protocol tensors (translation only, no torch).

A TorchServe request is a set of named *entries* (the body, or one per multipart/form field, plus
the query pairs), each with a content type, and request headers. It travels through the core as
an ``InferenceRequest`` with one BYTES tensor of shape ``[1]`` per entry (named by the entry) and
one more, ``ts_request``, holding the row's JSON ``{"id", "headers", "content_types"}``. Tensors
of shape ``[1]`` merge along their first dimension, so the adaptive batcher batches TorchServe
requests like any others: row ``i`` of a merged request is request ``i``.

KServe V1 requests (TorchServe's KServe envelope) travel the same way, one row per instance: the
entry ``body`` holds the instance as JSON and the row's JSON says ``"kserve": true``, so that the
handler gets the instance itself as ``data[i]`` (:mod:`.handler`), as TorchServe's envelope gives
it, and its answer back as JSON.

A handler's answers travel back as two BYTES outputs of one row per request: ``body`` (the bytes
the client gets) and ``ts_response`` (JSON ``{"status", "phrase", "headers"}``). An OIP client may
call a TorchServe model directly: a request without ``ts_request`` is a row without headers whose
entries are its BYTES inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from runtime.errors import InvalidInput, ModelFailed
from runtime.ids import assign_id
from runtime.types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput, set_field

META = "ts_request"
BODY = "body"
ANSWER = "ts_response"
STREAM_NEXT = "ts_stream_next"


@dataclass(slots=True)
class Entry:
    """One named part of a request: the body, a form field or a query pair."""

    name: str
    value: bytes
    content_type: str | None = None


@dataclass(slots=True)
class Row:
    """One request as a handler sees it: ``data[i]`` and the headers ``ctx`` answers for it."""

    request_id: str
    data: dict[str, Any]
    """Entry name -> value, decoded by its content type."""
    content_types: dict[str, str | None]
    """Entry name -> its content type (the handler also sees it as a pseudo-header)."""
    headers: dict[str, str]
    """The request's own headers (names as sent)."""
    instance: bool = False
    """A KServe V1 instance: the handler gets ``data["body"]`` itself and answers it as JSON."""


@dataclass(slots=True)
class Answer:
    """One answer of a handler for one request."""

    body: bytes
    status: int = 200
    phrase: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def streams_on(self) -> bool:
        """More answers follow for this request (``ts_stream_next: true``)."""
        return self.headers.get(STREAM_NEXT) == "true"


def build_request(entries: list[Entry], headers: dict[str, str]) -> InferenceRequest:
    """The InferenceRequest for one TorchServe request (named by ``assign_id``: TorchServe's wire has no id)."""
    request = InferenceRequest(inputs=[])
    content_types = {e.name: e.content_type for e in entries if e.content_type}
    meta = orjson.dumps({"id": assign_id(request), "headers": headers, "content_types": content_types})
    inputs = [_bytes_input(e.name, e.value) for e in entries]
    inputs.append(_bytes_input(META, meta))
    set_field(request, "inputs", inputs)
    return request


def build_instances_request(instances: list[Any], headers: dict[str, str]) -> InferenceRequest:
    """The InferenceRequest for the instances of one KServe V1 request: one row per instance."""
    request = InferenceRequest(inputs=[])
    request_id = assign_id(request)
    rows = len(instances)
    metas = [
        orjson.dumps(
            {
                "id": f"{request_id}-{i}" if rows > 1 else request_id,
                "headers": headers,
                "content_types": {BODY: "application/json"},
                "kserve": True,
            }
        )
        for i in range(rows)
    ]
    bodies = [orjson.dumps(instance) for instance in instances]
    request.inputs = [_bytes_input(BODY, *bodies), _bytes_input(META, *metas)]
    return request


def _bytes_input(name: str, *values: bytes) -> RequestInput:
    data = np.empty(len(values), dtype=object)
    data[:] = values
    return RequestInput(name=name, shape=[len(values)], datatype="BYTES", data=data)


def decode_value(value: bytes, content_type: str | None) -> Any:
    """As TorchServe's worker decodes an entry: JSON parsed, text as str, anything else bytes."""
    if content_type:
        if content_type.startswith("application/json"):
            try:
                return json.loads(value)
            except ValueError:
                return value
        if content_type.startswith("text"):
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return value
    return value


def read_rows(request: InferenceRequest, fallback_id: str) -> list[Row]:
    """The rows of a (possibly merged) request, as the handler gets them."""
    columns: dict[str, np.ndarray] = {}
    for inp in request.inputs:
        if inp.datatype.value != "BYTES":
            raise InvalidInput(f"A TorchServe model takes BYTES inputs; {inp.name!r} is {inp.datatype.value}")
        columns[inp.name] = np.asarray(inp.data, dtype=object).reshape(-1)
    sizes = {len(col) for col in columns.values()}
    if len(sizes) != 1:
        raise InvalidInput("Every input of a TorchServe model must have the same number of rows")
    (count,) = sizes
    metas = columns.pop(META, None)
    rows = []
    for i in range(count):
        meta = orjson.loads(metas[i]) if metas is not None else {}
        given: dict[str, str] = meta.get("content_types", {})
        data: dict[str, Any] = {}
        content_types: dict[str, str | None] = {}
        for name, column in columns.items():
            content_types[name] = given.get(name)
            data[name] = decode_value(_as_bytes(column[i]), content_types[name])
        request_id = meta.get("id") or (f"{fallback_id}-{i}" if count > 1 else fallback_id)
        headers = dict(meta.get("headers", {}))
        rows.append(Row(request_id, data, content_types, headers, bool(meta.get("kserve"))))
    return rows


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


def answers_response(answers: list[Answer]) -> InferenceResponse:
    """An InferenceResponse with one row per answer."""
    bodies = np.empty(len(answers), dtype=object)
    metas = np.empty(len(answers), dtype=object)
    for i, answer in enumerate(answers):
        bodies[i] = answer.body
        metas[i] = orjson.dumps({"status": answer.status, "phrase": answer.phrase, "headers": answer.headers})
    shape = [len(answers)]
    return InferenceResponse(
        outputs=[
            ResponseOutput(name=BODY, shape=shape, datatype="BYTES", data=bodies),
            ResponseOutput(name=ANSWER, shape=shape, datatype="BYTES", data=metas),
        ]
    )


def read_answers(response: InferenceResponse) -> list[Answer]:
    """The answers in a response (one per row)."""
    outputs = {out.name: out for out in response.outputs}
    body, meta = outputs.get(BODY), outputs.get(ANSWER)
    if body is None:
        raise ModelFailed(f"The TorchServe model answered without a {BODY!r} output")
    bodies = np.asarray(body.data, dtype=object).reshape(-1)
    metas = np.asarray(meta.data, dtype=object).reshape(-1) if meta is not None else None
    answers = []
    for i, value in enumerate(bodies):
        info = orjson.loads(metas[i]) if metas is not None else {}
        answers.append(
            Answer(
                body=_as_bytes(value),
                status=int(info.get("status", 200)),
                phrase=str(info.get("phrase") or ""),
                headers=dict(info.get("headers") or {}),
            )
        )
    return answers
