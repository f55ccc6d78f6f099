"""CORS and gzip on every REST route, as MLServer applies them (``cors_settings``, ``gzip_enabled``).

The same middleware as MLServer's, Starlette's ``CORSMiddleware`` (outside) and ``GZipMiddleware``
(inside, answers of 500 bytes or more to a client that accepts gzip; ``text/event-stream`` is left
alone, so streams stream), with two additions: a request body sent with ``Content-Encoding: gzip``
is read decompressed (MLServer's request class does that), within ``max_request_size`` after
decompression; and a refused CORS preflight is a JSON ``{"error": ...}`` body like every other
refusal.

The REST app's hot path goes through them only when they have something to do
(:func:`wants_middleware`, one pass over the request's headers): with CORS on, every request
does (its answers always say ``Vary: Origin``); with gzip alone, only a request that accepts gzip
or sends an encoded body. What a plain request misses is the ``Vary: Accept-Encoding`` that
Starlette adds to an uncompressed answer of 500 bytes or more, which a cache does not need:
the uncompressed answer suits every client.
"""

from __future__ import annotations

import zlib

import orjson
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.errors import Cancelled, InvalidInput, PayloadTooLarge, ServerError
from runtime.frontends.rest.status import status_of
from runtime.settings import Settings

_ACCEPT_ENCODING = b"accept-encoding"
_CONTENT_ENCODING = b"content-encoding"
_CONTENT_LENGTH = b"content-length"
_GZIP = b"gzip"
_IDENTITY = (b"identity", b"")


def wants_middleware(headers: list[tuple[bytes, bytes]], cors: bool) -> bool:
    """Whether a request with these headers goes through the middleware: always with CORS on,
    otherwise when it accepts gzip or sends a ``Content-Encoding``."""
    if cors:
        return True
    for name, value in headers:
        if name == _ACCEPT_ENCODING:
            if _GZIP in value:
                return True
        elif name == _CONTENT_ENCODING:
            return True
    return False


class JsonCORSMiddleware(CORSMiddleware):
    """Starlette's CORSMiddleware, whose refused preflight says why in a JSON ``{"error"}`` body."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        body = orjson.dumps({"error": bytes(response.body).decode()})
        return Response(
            body, status_code=response.status_code, headers=headers, media_type="application/json"
        )


class GunzipRequests:
    """Reads a request body sent with ``Content-Encoding: gzip`` (or ``x-gzip``) decompressed,
    refusing (413) one that decompresses to more than ``limit`` bytes before inflating past it,
    and (400) one that is not gzip or is in another encoding. The request's headers then describe
    the decompressed body (its ``Content-Length``, no ``Content-Encoding``)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        encoding = None
        for name, value in scope["headers"]:
            if name == _CONTENT_ENCODING:
                encoding = value.strip().lower()
        if encoding is None or encoding in _IDENTITY:
            await self.app(scope, receive, send)
            return
        try:
            if encoding not in (_GZIP, b"x-gzip"):
                raise InvalidInput(
                    f"The request body's Content-Encoding {encoding.decode(errors='replace')!r} is not "
                    "supported (gzip is)"
                )
            body = await self._inflate(receive)
        except ServerError as exc:
            response = Response(
                orjson.dumps({"error": exc.message}),
                status_code=status_of(exc),
                media_type="application/json",
            )
            await response(scope, receive, send)
            return
        # in place: the access log and the metrics read this scope after the app has answered
        scope["headers"] = [
            (name, value)
            for name, value in scope["headers"]
            if name not in (_CONTENT_ENCODING, _CONTENT_LENGTH)
        ] + [(_CONTENT_LENGTH, str(len(body)).encode())]
        await self.app(scope, _Replay(body, receive), send)

    async def _inflate(self, receive: Receive) -> bytes:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip's header and trailer
        parts: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Cancelled("The client disconnected while sending its request")
            more = message.get("more_body", False)
            data = message.get("body", b"")
            while data:
                try:
                    part = inflater.decompress(data, self.limit + 1 - size)
                except zlib.error as exc:
                    raise InvalidInput(f"The request body is not valid gzip: {exc}") from None
                size += len(part)
                if size > self.limit:
                    raise PayloadTooLarge(
                        f"The request body decompresses to more than the limit of {self.limit} bytes"
                    )
                parts.append(part)
                data = inflater.unconsumed_tail
        if not inflater.eof:
            raise InvalidInput("The request body is not valid gzip: it ends before the gzip stream does")
        return b"".join(parts)


class _Replay:
    """An ASGI ``receive`` that gives the decompressed body once, then what the client sends."""

    __slots__ = ("_body", "_receive")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> Message:
        if self._body is None:
            return await self._receive()
        body, self._body = self._body, None
        return {"type": "http.request", "body": body, "more_body": False}


def with_middleware(app: ASGIApp, settings: Settings) -> ASGIApp | None:
    """``app`` behind the CORS and gzip middleware that ``settings`` turn on, or None when none is."""
    wrapped: ASGIApp = app
    if settings.gzip_enabled:
        wrapped = GZipMiddleware(GunzipRequests(app, settings.max_request_size))
    cors = settings.cors_settings
    if cors is not None:
        wrapped = JsonCORSMiddleware(wrapped, **cors.model_dump())
    return None if wrapped is app else wrapped
