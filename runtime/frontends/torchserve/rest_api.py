"""TorchServe's inference REST API on the main REST port: a translator onto the DataPlane.

``GET /ping``, ``/predictions/{model}[/{version}]`` (any method, any body) and
``/explanations/{model}[/{version}]``, the same with the header ``explain: True`` that TorchServe's
frontend adds and ``BaseHandler.handle`` reads (it calls ``explain_handle``, i.e.
``get_insights``). A model that is not a TorchServe handler has no explainer: 501. The body becomes the
handler's entries (:mod:`.payload`): multipart and form-urlencoded bodies one entry per field,
anything else the entry ``body``, query pairs one entry each. Every request header reaches the
handler. For a sequence model (``sequenceBatching``) the ``ts_request_sequence_*`` headers become
the OIP sequence parameters (a request without an id starts a new sequence, as in TorchServe), so
the one sequence engine decides. The answer is the handler's: its status, phrase, headers and
body; an answer marked ``ts_stream_next: true`` starts a chunked response, one chunk per answer.
Errors are TorchServe's body ``{"code", "type", "message"}`` (:mod:`.errors`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from runtime.core.dataplane import DataPlane
from runtime.errors import ServerError
from runtime.frontends.rest.app import _Asgi, read_body
from runtime.frontends.rest.disconnect import cancel_on_disconnect
from runtime.frontends.rest.sequence import sequence_headers
from runtime.frontends.rest.status import headers_of
from runtime.frontends.torchserve.error_body import describe
from runtime.frontends.torchserve.frontend import HEADER_ID, FrontEnd, is_handler, streamed
from runtime.settings import ModelSettings
from runtime.torchserve.payload import Answer, Entry
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

NO_CACHE = [
    (b"cache-control", b"no-cache; no-store, must-revalidate, private"),
    (b"expires", b"Thu, 01 Jan 1970 00:00:00 UTC"),
    (b"pragma", b"no-cache"),
]


def pretty(document: Any) -> bytes:
    """TorchServe's JSON answers: two-space indent and a trailing newline."""
    return (json.dumps(document, indent=2) + "\n").encode()


async def send_json(send: Send, document: Any, status: int, extra: dict[str, str] | None = None) -> None:
    body = pretty(document)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers + NO_CACHE})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: ServerError, model: str) -> int:
    """Send TorchServe's error body for ``error``; return its status."""
    code, kind, message = describe(error, model)
    extra = headers_of(error) if code == 503 else None  # Retry-After for a "try later" error
    await send_json(send, {"code": code, "type": kind, "message": message}, code, extra)
    return code


def read_entries(body: bytes, content_type: str | None, query: str) -> list[Entry]:
    """The handler's entries for a body and query string, as TorchServe's frontend makes them."""
    entries: list[Entry] = []
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "multipart/form-data" and content_type:
        import email.parser  # imported by the first multipart body, not at start-up
        import email.policy

        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if not isinstance(name, str):
                continue
            value = part.get_payload(decode=True)
            part_type = part.get("content-type")
            if part_type is None and part.get_filename() is None:
                part_type = "text/plain"  # a plain form field
            entries.append(Entry(name, value if isinstance(value, bytes) else b"", part_type))
    elif kind == "application/x-www-form-urlencoded":
        for name, value in parse_qsl(body.decode("latin-1"), keep_blank_values=True):
            entries.append(Entry(name, value.encode("latin-1"), "text/plain"))
    elif body:
        entries.append(Entry("body", body, content_type))
    if query:
        for name, value in parse_qsl(query, keep_blank_values=True):
            entries.append(Entry(name, value.encode(), "text/plain"))
    return entries


class TorchServeRest:
    """The TorchServe inference routes over one DataPlane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.front = FrontEnd(dataplane)
        self.max_request_size = dataplane.settings.max_request_size

    def routes(self) -> list[BaseRoute]:
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
        return [
            Route("/predictions/{model_name}", _Asgi(self.predictions), methods=methods),
            Route("/predictions/{model_name}/{model_version}", _Asgi(self.predictions), methods=methods),
            Route(
                "/predictions/{model_name}/{model_version}/{url_path:path}",
                _Asgi(self.predictions),
                methods=methods,
            ),
            Route("/explanations/{model_name}", _Asgi(self.explanations), methods=methods),
            Route("/explanations/{model_name}/{model_version}", _Asgi(self.explanations), methods=methods),
            Route("/ping", _Asgi(self.ping), methods=["GET", "POST"]),
        ]

    async def ping(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.dataplane.ready():
            await send_json(send, {"status": "Healthy"}, 200)
        else:
            await send_json(send, {"status": "Unhealthy"}, 500)

    async def explanations(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.predictions(scope, receive, send, explain=True)

    async def predictions(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        explain: bool = False,
        status: list[int] | None = None,
    ) -> None:
        """Answer one request. The status sent, once sent, is appended to ``status`` (the app's
        direct dispatch counts it; a failure after it cannot be answered any more)."""
        if status is None:
            status = []
        request = Request(scope, receive, send)
        params = scope["path_params"]
        name = params["model_name"]
        version = params.get("model_version") or None
        try:
            settings = self.dataplane.check_model(name, version).settings
            if explain and not is_handler(settings):
                message = f"Model {name} is not a TorchServe handler model: it has no explainer"
                status.append(501)
                await send_json(
                    send, {"code": 501, "type": "NotImplementedException", "message": message}, 501
                )
                return
            inference_request = await self.read_request(request, settings, explain)
            request_id = inference_request.id or ""
            # a client that goes away cancels the work, streamed or not (the sequence engine
            # cancels its sequence, the continuous batcher drops its stream)
            if not streamed(settings):  # one answer: no generators on this path
                work = self.front.answer(inference_request, name, version)
                answer, response = await cancel_on_disconnect(request, work)
                status.append(answer.status)
                await send_answer(send, answer, _headers(answer, response, request_id))
                return
            responses = self.front.answers(inference_request, name, version, settings)
            await cancel_on_disconnect(request, self.respond(send, responses, request_id, status))
        except ServerError as exc:
            if not status:
                status.append(await send_error(send, exc, name))

    async def read_request(
        self, request: Request, settings: ModelSettings, explain: bool = False
    ) -> InferenceRequest:
        body = await read_body(request, self.max_request_size)
        scope = request.scope
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if "url_path" in scope["path_params"]:  # segments after the version reach the handler
            headers["url_path"] = scope["path_params"]["url_path"]
        query = scope.get("query_string", b"")
        entries = read_entries(body, headers.get("content-type"), query.decode() if query else "")
        return self.front.request(settings, entries, headers, headers.get(HEADER_ID), explain)

    async def respond(
        self,
        send: Send,
        answers: AsyncIterator[tuple[Answer, InferenceResponse]],
        request_id: str,
        status: list[int],
    ) -> None:
        async with aclosing(answers) as items:  # type: ignore[type-var]
            first = await anext(items)  # errors before the first answer are TorchServe error bodies
            answer, response = first
            headers = _headers(answer, response, request_id)
            status.append(answer.status)
            if not answer.streams_on:
                await send_answer(send, answer, headers)
                return
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": answer.body, "more_body": True})
            try:
                async for answer, _ in items:
                    if answer.body:
                        await send({"type": "http.response.body", "body": answer.body, "more_body": True})
                    if not answer.streams_on:
                        break
            except ServerError as exc:  # the status is sent: a failure ends the stream
                logger.warning("A streamed TorchServe answer failed: %s", exc)
            await send({"type": "http.response.body", "body": b""})


async def send_answer(send: Send, answer: Answer, headers: list[tuple[bytes, bytes]]) -> None:
    """One whole answer, with its length."""
    headers.append((b"content-length", str(len(answer.body)).encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


def _headers(answer: Answer, response: InferenceResponse, request_id: str) -> list[tuple[bytes, bytes]]:
    headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in answer.headers.items()]
    given = {k for k, _ in headers}
    for key, value in sequence_headers(response).items():
        if key.encode() not in given:
            headers.append((key.encode(), value.encode()))
    if b"x-request-id" not in given:
        headers.append((b"x-request-id", request_id.encode()))
    return headers + NO_CACHE
