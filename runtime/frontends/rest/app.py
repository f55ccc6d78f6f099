"""The REST transport: OIP routes on Starlette, translating to and from the DataPlane only."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import monotonic
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.core.dataplane import DataPlane
from runtime.core.fairness import GRPC_ACTIVE_WINDOW
from runtime.core.request_checks import raw_request
from runtime.errors import Cancelled, PayloadTooLarge, ServerError, internal_error
from runtime.frontends.rest.codec import HEADER_LENGTH, dumps, encode_response, parse_request, split_body
from runtime.frontends.rest.disconnect import cancel_on_disconnect
from runtime.frontends.rest.sequence import SEQUENCE_PREFIX, STEP_HEADER, raw_sequence_headers
from runtime.frontends.rest.status import headers_of, status_of
from runtime.sequences.identity import apply_headers
from runtime.types import InferenceRequest

logger = logging.getLogger(__name__)

JSON = "application/json"


def json_response(document: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(dumps(document), status_code=status, media_type=JSON, headers=headers)


def error_response(message: str, status: int, headers: Mapping[str, str] | None = None) -> Response:
    return json_response({"error": message}, status, headers)


def _model(request: Request) -> tuple[str, str | None]:
    params = request.path_params
    return params["model_name"], params.get("model_version") or None


Read = tuple[bytes, str | None, list[tuple[str, str]] | None]
"""A REST request as :func:`read_request` reads it: the body; the binary extension's
``Inference-Header-Content-Length`` as sent (None: a JSON body); TorchServe's sequence headers
(``runtime.frontends.rest.sequence``), None when there are none. (A plain tuple: a NamedTuple's
``__new__`` costs ten times as much, once per request.)"""


async def read_request(scope: Scope, receive: Receive, limit: int) -> Read:
    """The one reader of REST requests: the scope's headers in one pass (Content-Length, the
    binary extension's header length, the sequence headers: the first of each, as Starlette's
    ``Headers.get`` finds it), then the whole body from the ASGI ``receive`` callable, refusing
    (413) one over ``limit`` bytes before reading past it (a client that leaves: ``Cancelled``)."""
    declared: str | None = None
    header_length: str | None = None
    sequence: list[tuple[str, str]] | None = None
    for key, value in scope["headers"]:
        if key == _CONTENT_LENGTH:
            if declared is None:
                declared = value.decode("latin-1")
        elif key == _HEADER_LENGTH:
            if header_length is None:
                header_length = value.decode("latin-1")
        elif key[:20] == SEQUENCE_PREFIX or key == STEP_HEADER:
            if sequence is None:
                sequence = []
            sequence.append((key.decode("latin-1"), value.decode("latin-1")))
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body of {declared} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:  # the ASGI messages themselves: cheaper than Request.stream() on the hot path
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Cancelled("The client disconnected while sending its request")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body is over the limit of {limit} bytes")
        if not message.get("more_body", False):
            if chunks:
                chunks.append(chunk)
                chunk = b"".join(chunks)
            return chunk, header_length, sequence
        chunks.append(chunk)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body of a Starlette request (see :func:`read_request`)."""
    return (await read_request(request.scope, request.receive, limit))[0]


_CONTENT_LENGTH = b"content-length"
_HEADER_LENGTH = HEADER_LENGTH.encode()
_JSON_TYPE = (b"content-type", b"application/json")
_BINARY_TYPE = (b"content-type", b"application/octet-stream")


class _Asgi:
    """Wraps a bound ``(scope, receive, send)`` method so that Starlette routes to it as an ASGI app."""

    __slots__ = ("handler",)

    def __init__(self, handler: ASGIApp) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handler(scope, receive, send)


class RestApi:
    """The handlers; each one translates, calls the DataPlane, translates back."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.turns = dataplane.turns
        self.max_request_size = dataplane.settings.max_request_size

    async def live(self, request: Request) -> Response:
        return Response(status_code=200) if self.dataplane.live() else error_response("Not live", 503)

    async def ready(self, request: Request) -> Response:
        because = self.dataplane.not_ready_because()
        if because is None:
            return Response(status_code=200)
        return error_response(f"The server is not ready: {because}", 503)

    async def metadata(self, request: Request) -> Response:
        return json_response(self.dataplane.metadata().model_dump(exclude_none=True))

    async def model_metadata(self, request: Request) -> Response:
        meta = await self.dataplane.model_metadata(*_model(request))
        return json_response(meta.model_dump(mode="json", exclude_none=True))

    async def model_config(self, request: Request) -> Response:
        return json_response(self.dataplane.model_config(*_model(request)))

    async def model_ready(self, request: Request) -> Response:
        name, version = _model(request)
        if self.dataplane.model_ready(name, version):
            return Response(status_code=200)
        entry = self.dataplane.registry.find(name, version)
        reason = f": {entry.reason}" if entry.reason else ""
        return error_response(f"Model {name!r} is not ready ({entry.state.value}){reason}", 503)

    async def infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST .../infer as a plain ASGI endpoint: the hot path skips Starlette's Response objects.

        Errors raised before anything is sent reach the app's exception handlers as usual.
        """
        start, body = await self.answer(scope, receive)
        await send(start)
        await send(body)

    async def answer(self, scope: Scope, receive: Receive) -> tuple[Message, Message]:
        """The two ASGI messages (start and body) that answer an infer request; nothing is sent.

        The hot path: no Starlette Request (:func:`read_request` reads the scope and the ASGI
        messages), the steps of :meth:`read_inference_request` called here (a coroutine less); the fair turns are skipped at the cost of two attribute reads when gRPC is
        quiet.
        """
        params = scope["path_params"]
        name = params["model_name"]
        version = params.get("model_version") or None
        turns = self.turns
        if turns.queue or (turns.enabled and monotonic() - turns.grpc_seen < GRPC_ACTIVE_WINDOW):
            await turns.rest_turn()
        dataplane = self.dataplane
        entry = dataplane.check_model(name, version)
        body, header_length, sequence = await read_request(scope, receive, self.max_request_size)
        inference_request = self.parse_inference_request(body, header_length, name, version)
        if sequence is not None:
            apply_headers(inference_request, sequence)
        served = dataplane.infer(inference_request, name, version, entry)
        response = await cancel_on_disconnect(receive, served)
        body, headers = encode_response(response, inference_request)
        raw = [_BINARY_TYPE if headers else _JSON_TYPE, (b"content-length", b"%d" % len(body))]
        if headers:
            raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        if response.parameters is not None:  # only a response with parameters has sequence headers
            raw += raw_sequence_headers(response)
        return (
            {"type": "http.response.start", "status": 200, "headers": raw},
            {"type": "http.response.body", "body": body},
        )

    async def read_inference_request(
        self, scope: Scope, receive: Receive, name: str, version: str | None
    ) -> InferenceRequest:
        """The InferenceRequest of an infer request to ``name`` (refused first if the model cannot
        take it): its body read (:func:`read_request`) and parsed, its sequence headers applied."""
        self.dataplane.check_model(name, version)
        body, header_length, sequence = await read_request(scope, receive, self.max_request_size)
        inference_request = self.parse_inference_request(body, header_length, name, version)
        if sequence is not None:
            apply_headers(inference_request, sequence)
        return inference_request

    def parse_inference_request(
        self, body: bytes, header_length: str | None, name: str, version: str | None
    ) -> InferenceRequest:
        """An InferenceRequest from a JSON body, or a JSON header and binary tensor data."""
        if header_length is None:  # a JSON body
            return parse_request(body, None)
        json_part, binary = split_body(body, header_length)
        if binary is not None and len(json_part) == 0:
            return raw_request(binary, self.dataplane.model_inputs(name, version))
        return parse_request(json_part, binary)

    def routes(self) -> list[BaseRoute]:
        model = "/v2/models/{model_name}"
        versioned = "/v2/models/{model_name}/versions/{model_version}"
        # Starlette tries routes in order: the hot path (infer) first, then health probes
        routes: list[BaseRoute] = [
            Route(model + "/infer", _Asgi(self.infer), methods=["POST"]),
            Route(versioned + "/infer", _Asgi(self.infer), methods=["POST"]),
            Route("/v2/health/live", self.live, methods=["GET"]),
            Route("/v2/health/ready", self.ready, methods=["GET"]),
            Route("/v2", self.metadata, methods=["GET"]),
            Route("/v2/", self.metadata, methods=["GET"]),
        ]
        for prefix in (model, versioned):
            routes += [
                Route(prefix, self.model_metadata, methods=["GET"]),
                Route(prefix + "/ready", self.model_ready, methods=["GET"]),
                Route(prefix + "/config", self.model_config, methods=["GET"]),
            ]
        return routes


async def _server_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServerError)
    return error_response(exc.message, status_of(exc), headers_of(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return json_response({"error": exc.detail}, exc.status_code, headers=exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("Unexpected error serving %s %s", request.method, request.url.path)
    return error_response(internal_error(exc), 500)
