"""Sending one V2 request body to a server, over REST (httpx) or gRPC (the protocol's stubs), with
the answer as the V2 JSON REST would give.

A request refused for good (400, 404, INVALID_ARGUMENT…) raises :class:`Refused`; one the server
could not take now (503, UNAVAILABLE) or that did not reach it (connection refused or reset)
raises :class:`TryLater`, with the server's ``Retry-After`` when it said one. Over gRPC the tensors
travel as ``raw_input_contents`` (every datatype has a byte layout there) and are read back from
``raw_output_contents`` or the typed contents, whichever the server answered with.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Protocol

import numpy as np
import orjson

from runtime.client.merge import Body, flat

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_TYPED = {  # datatype -> the typed contents field of InferTensorContents
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class Refused(Exception):
    """The server refused the request (or its answer was unusable): retrying will not help."""


class TryLater(Exception):
    """The server could not take the request now, or could not be reached."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Transport(Protocol):
    async def infer(self, body: Body) -> Body: ...

    async def close(self) -> None: ...


def retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` value (delay-seconds; an HTTP date is not honoured), or None."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _error_of(content: bytes, status: int) -> str:
    try:
        document = orjson.loads(content)
    except orjson.JSONDecodeError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return f"{status}: {document['error']}"
    return f"{status}: {content[:500].decode(errors='replace')}"


class RestTransport:
    """``POST /v2/models/{model}[/versions/{version}]/infer`` on one pooled httpx client."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str | None,
        connections: int,
        timeout: float,
        headers: dict[str, str],
    ) -> None:
        import httpx

        self._httpx = httpx
        base = url if "://" in url else f"http://{url}"
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        self._path = path
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        # httpx writes a request's head and body in two writes: without TCP_NODELAY the body waits
        # for the server's delayed ACK of the head (40 ms on Linux) on every request
        nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        self._client = httpx.AsyncClient(
            base_url=base,
            timeout=timeout,
            transport=httpx.AsyncHTTPTransport(limits=limits, socket_options=nodelay),
            headers={"content-type": "application/json", **headers},
        )

    async def infer(self, body: Body) -> Body:
        try:
            response = await self._client.post(self._path, content=orjson.dumps(body))
        except self._httpx.TransportError as exc:  # refused, reset, timed out
            raise TryLater(f"{type(exc).__name__}: {exc}") from None
        if response.status_code == 200:
            try:
                answer = orjson.loads(response.content)
            except orjson.JSONDecodeError as exc:
                raise Refused(f"the answer is not JSON: {exc}") from None
            if not isinstance(answer, dict):
                raise Refused("the answer is not a JSON object")
            return answer
        message = _error_of(response.content, response.status_code)
        if response.status_code == 503:
            raise TryLater(message, retry_after(response.headers.get("retry-after")))
        raise Refused(message)

    async def close(self) -> None:
        await self._client.aclose()


class GrpcTransport:
    """``ModelInfer`` on one grpc.aio channel."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str | None,
        timeout: float,
        headers: dict[str, str],
        max_message: int,
    ) -> None:
        import grpc

        from runtime.frontends.grpc.generated import dataplane_pb2, dataplane_pb2_grpc

        self._grpc = grpc
        self._pb = dataplane_pb2
        target = url.split("://", 1)[-1]
        options = [
            ("grpc.max_send_message_length", max_message),
            ("grpc.max_receive_message_length", max_message),
        ]
        self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._model, self._version = model, version or ""
        self._timeout = timeout
        self._metadata = tuple((k.lower(), v) for k, v in headers.items())

    async def infer(self, body: Body) -> Body:
        try:
            request = request_to_proto(self._pb, body, self._model, self._version)
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            raise Refused(f"the request cannot be sent over gRPC: {exc}") from None
        try:
            response = await self._stub.ModelInfer(request, timeout=self._timeout, metadata=self._metadata)
        except self._grpc.aio.AioRpcError as exc:
            code = exc.code()
            message = f"{code.name}: {exc.details()}"
            if code == self._grpc.StatusCode.UNAVAILABLE:
                trailers = dict(exc.trailing_metadata() or ())
                after = trailers.get("retry-after")
                raise TryLater(message, retry_after(after if isinstance(after, str) else None)) from None
            raise Refused(message) from None
        try:
            return response_from_proto(response)
        except (ValueError, KeyError) as exc:
            raise Refused(f"the answer cannot be read: {exc}") from None

    async def close(self) -> None:
        await self._channel.close()


def _set_parameters(target: Any, parameters: Any) -> None:
    if not parameters:
        return
    if not isinstance(parameters, dict):
        raise ValueError("parameters must be a JSON object")
    for key, value in parameters.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value >= 2**63:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise ValueError(f"parameter {key!r} is not a boolean, a number or a string")


def _parameters(params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is not None:
            out[key] = getattr(param, kind)
    return out


def _raw(data: Any, datatype: str) -> bytes:
    values = flat(data)
    if datatype == "BYTES":
        parts = []
        for value in values:
            item = value.encode() if isinstance(value, str) else bytes(value)
            parts.append(struct.pack("<I", len(item)) + item)
        return b"".join(parts)
    dtype = DTYPES.get(datatype)
    if dtype is None:
        raise ValueError(f"datatype {datatype!r} cannot be sent from JSON over gRPC")
    return np.asarray(values, dtype=dtype).tobytes()


def request_to_proto(pb: Any, body: Body, model: str, version: str) -> Any:
    """A ModelInferRequest of a V2 JSON request body, its tensors in ``raw_input_contents``."""
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    if body.get("id") is not None:
        request.id = str(body["id"])
    _set_parameters(request.parameters, body.get("parameters"))
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        raise ValueError("'inputs' must be a list")
    for tensor in inputs:
        entry = request.inputs.add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        _set_parameters(entry.parameters, tensor.get("parameters"))
        request.raw_input_contents.append(_raw(tensor["data"], tensor["datatype"]))
    for output in body.get("outputs") or []:
        requested = request.outputs.add(name=output["name"])
        _set_parameters(requested.parameters, output.get("parameters"))
    return request


def _from_raw(raw: bytes, datatype: str) -> list[Any]:
    if datatype == "BYTES":
        values, at = [], 0
        while at < len(raw):
            (size,) = struct.unpack_from("<I", raw, at)
            values.append(raw[at + 4 : at + 4 + size].decode(errors="replace"))
            at += 4 + size
        return values
    dtype = DTYPES.get(datatype)
    if dtype is None:
        raise ValueError(f"datatype {datatype!r} cannot be written as JSON")
    data: list[Any] = np.frombuffer(raw, dtype=dtype).tolist()
    return data


def response_from_proto(response: Any) -> Body:
    """The V2 JSON answer of a ModelInferResponse."""
    answer: Body = {"model_name": response.model_name}
    if response.model_version:
        answer["model_version"] = response.model_version
    if response.id:
        answer["id"] = response.id
    if response.parameters:
        answer["parameters"] = _parameters(response.parameters)
    outputs = []
    raw = list(response.raw_output_contents)
    for i, tensor in enumerate(response.outputs):
        if raw:
            data = _from_raw(raw[i], tensor.datatype)
        else:
            values = list(getattr(tensor.contents, _TYPED[tensor.datatype]))
            data = [v.decode(errors="replace") for v in values] if tensor.datatype == "BYTES" else values
        output: Body = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
            "data": data,
        }
        if tensor.parameters:
            output["parameters"] = _parameters(tensor.parameters)
        outputs.append(output)
    answer["outputs"] = outputs
    return answer
