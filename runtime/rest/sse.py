"""Server-Sent Events: typed events, their bytes, and the streamed response (sse-starlette).

A stream answers with one ``data:`` event per item (one JSON document each). A failure after the
stream has started cannot change the status any more, so it is an ``event: error`` whose data is
``{"error": "..."}``, and the stream ends there. A failure before the first item is an ordinary
JSON error with its status: the response waits for the model's first item before it sends its
200 headers, racing that wait against the client going away.

Cancellation: sse-starlette listens for the client's disconnect while it streams and cancels the
sending task, which closes the item iterator and with it the model's generator; before the first
item, :func:`first_or_disconnect` does the same. Back-pressure: the next item is pulled only after
the previous event was handed to the server, which waits while its write buffer is full.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any, Final, Literal, TypedDict, TypeVar

import orjson
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from ..errors import ServerError

logger = logging.getLogger(__name__)

T = TypeVar("T")

PING_SECONDS: Final = 15
"""Seconds between keep-alive comments on an idle stream (proxies close silent connections)."""

SEP: Final = b"\r\n"

EventName = Literal["message", "error"]
"""``message`` (the SSE default, sent without an ``event:`` line) carries one item; ``error`` ends a stream."""


class ErrorData(TypedDict):
    """The data of an ``error`` event (the same document as a JSON error response)."""

    error: str


class Event(TypedDict):
    """One Server-Sent Event: its name and its data, a JSON document on one line."""

    event: EventName
    data: bytes


def encode_event(event: Event) -> bytes:
    """The bytes of one event (orjson never writes a newline, so the data is one ``data:`` line)."""
    if event["event"] == "message":
        return b"data: " + event["data"] + SEP + SEP
    return b"event: " + event["event"].encode() + SEP + b"data: " + event["data"] + SEP + SEP


def message_event(document: bytes) -> bytes:
    return encode_event({"event": "message", "data": document})


def error_event(message: str) -> bytes:
    data: ErrorData = {"error": message}
    return encode_event({"event": "error", "data": orjson.dumps(data)})


class _End:
    """The marker of a stream that ended before its first item."""


END: Final = _End()


async def first_or_disconnect(request: Request, items: AsyncGenerator[T, None]) -> T | _End | None:
    """The first item of ``items``, END if there is none, or None if the client went away first.

    Errors of the first step (unknown model, bad request, the model failing at once) propagate,
    so that the transport answers them with a status. When the client goes away, the first step is
    cancelled: the model sees CancelledError and stops.
    """
    first = asyncio.ensure_future(_first(items))
    gone = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait((first, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        # this handler is cancelled (e.g. the server stops): stop the model and close the stream
        await _abandon(first, items)
        raise
    finally:
        gone.cancel()
    left = gone.done() and not gone.cancelled()
    if left:
        gone.exception()  # a failing receive counts as the client gone
    if first.done() and not left:
        return first.result()
    await _abandon(first, items)
    return None


async def _abandon(first: asyncio.Future[Any], items: AsyncGenerator[Any, None]) -> None:
    """Cancel the first step (the model sees CancelledError) and close the stream."""
    first.cancel()
    await asyncio.wait((first,))
    if not first.cancelled():
        first.exception()  # nobody is left to tell
    await items.aclose()


async def _first(items: AsyncGenerator[T, None]) -> T | _End:
    try:
        return await anext(items)
    except StopAsyncIteration:
        return END


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def sse_response(
    request: Request, items: AsyncGenerator[T, None], encode: Callable[[T], bytes]
) -> Response:
    """Stream ``items`` as Server-Sent Events, once the first one is in hand (see the module docstring)."""
    first = await first_or_disconnect(request, items)
    if first is None:
        return Response(status_code=499)  # the client is gone: nothing will read this
    return EventSourceResponse(_events(first, items, encode), ping=PING_SECONDS, sep=SEP.decode())


async def _events(
    first: T | _End, items: AsyncGenerator[T, None], encode: Callable[[T], bytes]
) -> AsyncGenerator[bytes, None]:
    try:
        if not isinstance(first, _End):
            yield encode(first)
            async for item in items:
                yield encode(item)
    except ServerError as exc:
        yield error_event(exc.message)
    except Exception as exc:
        logger.exception("Unexpected error in a stream")
        yield error_event(f"Internal server error: {type(exc).__name__}: {exc}")
    finally:
        await items.aclose()
