"""Client streams whose requests each name their model (gRPC ``ModelStreamInfer``), served by the core.

A transport reads its messages into :class:`Routed` items (the model a request names, its id, a
way to decode it, and a tag of the transport's own) and writes what comes back: every
:class:`Reply` carries the tag of the request it answers, so the transport keeps no bookkeeping
of its own. The core serves the model streams: the DataPlane hands in the one function this
module needs (:data:`OpenStream`: check a model, then serve a stream of requests to it), and this
module never calls back into the DataPlane. Two ways to serve such a stream, one per wire format:

``in_sessions`` (MLServer's): consecutive requests naming one model feed one model stream
(errors in band: one call of the model's ``predict_stream``), so a stream-to-stream model sees
them all. A request naming another model ends that model stream's
input; it answers what it owes first, then the request starts a model stream of its own model.
When a model stops reading early, the next request starts a fresh model stream.

``each`` (Triton's): every request is a model stream of its own, served concurrently with the
others of the client stream, at most ``limit`` (``READ_AHEAD``) at a time; beyond that the
requests are not read, so the transport's flow control holds the client back. Replies wait for
the transport in the window (``runtime.streams.window``), at most ``BUFFERED`` of them, so a client
that stops reading stops the models. Each request ends with exactly one reply marked ``last``:
its failure, or an end marker after its last response.

What both guarantee, on top of the pipeline's (``runtime.streams.pipeline``: pull, fairness,
cancellation, ids):

- every reply names its request (the id the client gave, or the one the core made for it);
- errors are replies: a message that cannot be read, a request that cannot be decoded, names an
  unknown model, fails its checks or makes its model fail is answered by its failure (the
  pipeline's ``StreamError``, handed to the transport as it is), and the client stream goes on
  (after a model failure, the requests that follow are served by a fresh model stream);
- when the client half-closes, every reply still owed is sent before the stream ends;
- closing the stream, or cancelling its consumer, cancels everything under way in it; only the
  transport's own read failing ends the stream with that failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Generic, TypeVar

from runtime.errors import InvalidInput, ServerError
from runtime.ids import assign_id
from runtime.streams.pipeline import Recent, StreamError, one, sort_error
from runtime.streams.window import BUFFERED, READ_AHEAD, Window
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

T = TypeVar("T")

ModelStream = Callable[
    [AsyncIterator[InferenceRequest]], AsyncGenerator["InferenceResponse | StreamError", None]
]
"""Serves a stream of requests to one model: its responses, and its failures in band or raised."""

OpenStream = Callable[[str, "str | None", bool], ModelStream]
"""``open(model, version, in_band)``: checks the model a request names (raising its ServerError:
unknown, not ready) and gives what serves a stream of requests to it, its failures in band (True)
or raised; the DataPlane's ``model_stream``."""


@dataclass(frozen=True, slots=True)
class Routed(Generic[T]):
    """One request of a client stream, as the transport read it."""

    model: str
    version: str | None
    id: str | None
    """The id the client gave (None: the core makes one)."""
    decode: Callable[[], InferenceRequest]
    """The request itself; raises InvalidInput when the message is malformed."""
    tag: T
    """The transport's own: handed back with every reply to this request."""
    error: ServerError | None = None
    """Set when the message could not be read at all (it names no model): this error answers it."""


@dataclass(frozen=True, slots=True)
class Reply(Generic[T]):
    """A response to, or the failure of, the request tagged ``tag``; or (``each``) the end of it."""

    tag: T
    model: str
    version: str | None
    request_id: str | None
    response: InferenceResponse | None = None
    failure: StreamError | None = None
    """The request failed: the failure as the core made it, for the transport to report in band."""
    last: bool = False
    """``each`` only: nothing more will answer this request (set on its failure or its end marker)."""


def _decode(item: Routed[T]) -> InferenceRequest:
    request = item.decode()
    assign_id(request)  # here, so that every reply to the request can name it
    return request


def _failed(item: Routed[T], failure: StreamError, last: bool = False) -> Reply[T]:
    return Reply(item.tag, item.model, item.version, failure.request_id, failure=failure, last=last)


# ---------------------------------------------------------------------- MLServer's way


class _Segment(Generic[T]):
    """Consecutive requests of a client stream that name one model, fed to one model stream."""

    def __init__(self, source: AsyncIterator[Routed[T]], first: Routed[T], request: InferenceRequest) -> None:
        self.source = source
        self.first = first
        self.request = request
        self.tags: Recent[T] = Recent()
        self._take(first, request)
        self.next: Routed[T] | None = None
        """The request that named another model (it ended this segment's input)."""
        self.undecodable: Reply[T] | None = None
        """The error of a request that could not be decoded (it ended this segment's input)."""

    async def requests(self) -> AsyncGenerator[InferenceRequest, None]:
        first = self.first
        yield self._take(first, self.request)
        while True:
            item = await anext(self.source, None)
            if item is None:
                return
            if item.error is not None:
                self.undecodable = _failed(item, StreamError(item.error, item.id))
                return
            if item.model != first.model or item.version != first.version:
                self.next = item
                return
            try:
                request = _decode(item)
            except InvalidInput as exc:
                self.undecodable = _failed(item, StreamError(exc, item.id))
                return
            yield self._take(item, request)

    def _take(self, item: Routed[T], request: InferenceRequest) -> InferenceRequest:
        assert request.id is not None
        self.tags.take(request.id, item.tag)
        return request

    def tag(self, request_id: str | None) -> T:
        """The tag of the request ``request_id`` names (else of the latest request taken)."""
        found = self.tags.find(request_id)
        return self.first.tag if found is None else found

    def reply(self, item: InferenceResponse | StreamError) -> Reply[T]:
        first = self.first
        if isinstance(item, StreamError):
            return Reply(self.tag(item.request_id), first.model, first.version, item.request_id, failure=item)
        return Reply(self.tag(item.id), first.model, first.version, item.id, response=item)


async def in_sessions(
    open_stream: OpenStream, items: AsyncIterator[Routed[T]]
) -> AsyncGenerator[Reply[T], None]:
    """Serve a client stream MLServer's way: one model stream per run of requests for one model."""
    source = aiter(items)
    item = await anext(source, None)
    while item is not None:
        try:
            if item.error is not None:  # the message could not be read: it names no model
                raise item.error
            serve = open_stream(item.model, item.version, True)
            request = _decode(item)
        except ServerError as exc:
            yield _failed(item, StreamError(exc, item.id))
            item = await anext(source, None)
            continue
        segment = _Segment(source, item, request)
        async with aclosing(segment.requests()) as requests:
            try:
                async with aclosing(serve(requests)) as replies:
                    async for reply in replies:
                        yield segment.reply(reply)
            except ServerError as exc:  # the model went away between the check and the first step
                latest = segment.tags.latest_id
                yield segment.reply(StreamError(exc, latest))
        if segment.undecodable is not None:
            yield segment.undecodable
        item = segment.next or await anext(source, None)


# ---------------------------------------------------------------------- Triton's way


async def _answer(open_stream: OpenStream, item: Routed[T]) -> AsyncGenerator[Reply[T], None]:
    """The replies to one request, served as a model stream of its own; the last one is ``last``."""
    try:
        if item.error is not None:  # the message could not be read: it names no model
            raise item.error
        serve = open_stream(item.model, item.version, False)
        request = _decode(item)
    except ServerError as exc:
        yield _failed(item, StreamError(exc, item.id), last=True)
        return
    try:
        async with aclosing(serve(one(request))) as responses:
            async for response in responses:
                assert isinstance(response, InferenceResponse)  # its failures are raised
                yield Reply(item.tag, item.model, item.version, request.id, response=response)
    except Exception as exc:  # the core sorted the model's errors already; anything else is a bug
        yield _failed(item, StreamError(sort_error(item.model, exc), request.id), last=True)
        return
    yield Reply(item.tag, item.model, item.version, request.id, last=True)


async def each(
    open_stream: OpenStream, items: AsyncIterator[Routed[T]], limit: int = READ_AHEAD
) -> AsyncGenerator[Reply[T], None]:
    """Serve a client stream Triton's way: every request on its own, at most ``limit`` at a time."""
    window: Window[asyncio.Task[None], Reply[T]] = Window(limit, bound=BUFFERED)

    async def serve(item: Routed[T]) -> None:
        try:
            async with aclosing(_answer(open_stream, item)) as answers:
                async for reply in answers:
                    await window.put(reply)
        except Exception as exc:  # a bug in serving one request: end the stream with it
            window.failure = window.failure or exc

    async def admit(item: Routed[T]) -> None:
        task = asyncio.create_task(serve(item))
        window.opened(task)
        task.add_done_callback(window.finished)

    window.read(items, admit)
    try:
        async for reply in window:
            yield reply
    finally:
        # closed early or cancelled: cancel the reading and every request still served
        await window.close(*window.open)
