"""Server-Sent Events: typed events, their bytes, and the streamed response (sse-starlette).

A stream answers with one ``data:`` event per item (one JSON document each). A failure after the
stream has started cannot change the status any more, so it is an ``event: error`` whose data is
``{"error": "..."}``, and the stream ends there. A failure before the first item is an ordinary
JSON error with its status: the response waits for the model's first item before it sends its
200 headers, racing that wait against the client going away.

Shutdown: a stream still running when the server's grace period ends (``StreamCounter.cut_after``)
ends with an ``event: error`` whose message says the server is shutting down (503's meaning), and
the model's generator is closed; one still waiting for its first item is answered 503.

Cancellation: sse-starlette listens for the client's disconnect while it streams and cancels the
sending task, which closes the item iterator and with it the model's generator; before the first
item, :func:`first_or_disconnect` does the same. Back-pressure: the next item is pulled only after
the previous event was handed to the server, which waits while its write buffer is full.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from runtime.errors import ServerError, internal_error
from runtime.streams.stream_counter import StreamCounter, cut_error

if TYPE_CHECKING:
    from sse_starlette import EventSourceResponse

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


def error_event(exc: BaseException) -> bytes:
    """The ``event: error`` that ends a started stream: the one place SSE's in-band errors are made."""
    if isinstance(exc, ServerError):
        message = exc.message
    else:
        logger.error("Unexpected error in a stream: %s: %s", type(exc).__name__, exc, exc_info=exc)
        message = internal_error(exc)
    data: ErrorData = {"error": message}
    return encode_event({"event": "error", "data": orjson.dumps(data)})


def _cut_event() -> bytes:
    logger.warning("A stream was still running when the grace period ended: it ends with an error event")
    return error_event(cut_error())


class _End:
    """The marker of a stream that ended before its first item."""


END: Final = _End()


async def first_or_disconnect(
    request: Request, items: AsyncGenerator[T, None], streams: StreamCounter | None = None
) -> T | _End | None:
    """The first item of ``items``, END if there is none, or None if the client went away first.

    Errors of the first step (unknown model, bad request, the model failing at once) propagate,
    so that the transport answers them with a status. When the client goes away, the first step is
    cancelled: the model sees CancelledError and stops. When ``streams`` are cut (the server's grace
    period ended), the first step is cancelled too and ShuttingDown raised.
    """
    first = asyncio.ensure_future(_first(items))
    gone = asyncio.ensure_future(_wait_disconnect(request.receive))
    cut = asyncio.get_running_loop().create_future()
    remove = streams.on_cut(lambda: _settle(cut)) if streams is not None else _keep
    try:
        await asyncio.wait((first, gone, cut), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        # this handler is cancelled (e.g. the server stops): stop the model and close the stream
        await _abandon(first, items)
        raise
    finally:
        gone.cancel()
        remove()
    left = gone.done() and not gone.cancelled()
    if left:
        gone.exception()  # a failing receive counts as the client gone
    if first.done() and not left:
        return first.result()
    await _abandon(first, items)
    if cut.done() and not left:
        logger.warning("A stream was still waiting for its first item when the grace period ended")
        raise cut_error()
    return None


def _keep() -> None:
    pass


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
    request: Request,
    items: AsyncGenerator[T, None],
    encode: Callable[[T], bytes],
    streams: StreamCounter | None = None,
) -> Response:
    """Stream ``items`` as Server-Sent Events, once the first one is in hand (see the module docstring).

    ``streams``: the DataPlane's, whose cut (the end of the grace period) ends the stream in band.
    """
    first = await first_or_disconnect(request, items, streams)
    if first is None:
        return Response(status_code=499)  # the client is gone: nothing will read this
    events = _events(first, items, encode, streams)
    return _event_source()(events, ping=PING_SECONDS, sep=SEP.decode())


@functools.cache
def _event_source() -> type[EventSourceResponse]:
    """sse-starlette's ``EventSourceResponse`` (imported by the first stream: a server may never
    stream), whose messages go out without a cancel scope each when it has no send timeout (it
    has none here): an anyio scope per event was a tenth of a token stream's event-loop time."""
    from sse_starlette import EventSourceResponse

    class EventSource(EventSourceResponse):
        async def _send_with_timeout(self, send: Any, message: Any) -> None:
            if self.send_timeout is None:
                await send(message)
            else:
                await super()._send_with_timeout(send, message)

    return EventSource


class _Cut:
    """Ends a running stream when the grace period ends: cancels the wait for its next item (the
    model sees CancelledError), or, while an event is being sent, marks it to end after that."""

    __slots__ = ("fired", "task", "waiting")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.waiting = False
        self.fired = False

    def __call__(self) -> None:
        self.fired = True
        if self.waiting and self.task is not None:
            self.task.cancel()

    def handled(self) -> None:
        if self.task is not None:
            self.task.uncancel()  # this cancellation ends the stream in band, nothing more


async def _events(
    first: T | _End,
    items: AsyncGenerator[T, None],
    encode: Callable[[T], bytes],
    streams: StreamCounter | None,
) -> AsyncGenerator[bytes, None]:
    cut = _Cut()
    remove = streams.on_cut(cut) if streams is not None else _keep
    try:
        if not isinstance(first, _End):
            yield encode(first)
            while True:
                if cut.fired:
                    yield _cut_event()
                    return
                cut.waiting = True
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    return
                finally:
                    cut.waiting = False
                yield encode(item)
    except asyncio.CancelledError:
        if not cut.fired:
            raise
        cut.handled()
        yield _cut_event()
    except Exception as exc:
        yield error_event(exc)
    finally:
        remove()
        await items.aclose()
