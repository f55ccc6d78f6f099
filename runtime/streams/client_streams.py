"""Client streams whose requests each name their model (gRPC ``ModelStreamInfer``), served by the core.

A transport reads its messages into :class:`Routed` items (the model a request names, its id, a
way to decode it, and a tag of the transport's own) and writes what comes back: every
:class:`Reply` carries the tag of the request it answers, so the transport keeps no bookkeeping
of its own. Two ways to serve such a stream, one per wire format:

``in_sessions`` (MLServer's): consecutive requests naming one model feed one model stream
(``DataPlane.infer_stream_in_band``: one call of the model's ``predict_stream``), so a
stream-to-stream model sees them all. A request naming another model ends that model stream's
input; it answers what it owes first, then the request starts a model stream of its own model.
When a model stops reading early, the next request starts a fresh model stream.

``each`` (Triton's): every request is a model stream of its own, served concurrently with the
others of the client stream, at most ``limit`` at a time; beyond that the requests are not read,
so the transport's flow control holds the client back. Replies wait for the transport in a queue
of ``EACH_BUFFER``, so a client that stops reading stops the models. Each request ends with
exactly one reply marked ``last``: its error, or an end marker after its last response.

What both guarantee, on top of the pipeline's (``runtime.streams.pipeline``: pull, fairness,
cancellation, ids):

- every reply names its request (the id the client gave, or the one the core made for it);
- errors are replies: a request that cannot be decoded, names an unknown model, fails its checks
  or makes its model fail is answered by an error, and the client stream goes on (after a model
  failure, the requests that follow are served by a fresh model stream);
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
from typing import Generic, Protocol, TypeVar

from runtime.errors import InvalidInput, ServerError
from runtime.ids import assign_id
from runtime.types import InferenceRequest, InferenceResponse
from runtime.streams.pipeline import Outbox, Recent, StreamError, one, sort_error, stop_tasks

logger = logging.getLogger(__name__)

T = TypeVar("T")

EACH_IN_FLIGHT = 64
"""Most requests of one client stream served at the same time in the ``each`` way."""

EACH_BUFFER = 8
"""Most replies of one client stream waiting for the transport in the ``each`` way (each request
served holds at most one more): a client that stops reading stops the models soon after."""


class StreamServer(Protocol):
    """What serves the model streams of a client stream (the DataPlane)."""

    def check_model(
        self, name: str, version: str | None = None
    ) -> object: ...  # the entry; streams only need the check

    def infer_stream(
        self, requests: AsyncIterator[InferenceRequest], name: str, version: str | None = None
    ) -> AsyncGenerator[InferenceResponse, None]: ...

    def infer_stream_in_band(
        self, requests: AsyncIterator[InferenceRequest], name: str, version: str | None = None
    ) -> AsyncGenerator[InferenceResponse | StreamError, None]: ...


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


@dataclass(frozen=True, slots=True)
class Reply(Generic[T]):
    """A response to, or the error of, the request tagged ``tag``; or (``each``) the end of it."""

    tag: T
    model: str
    version: str | None
    request_id: str | None
    response: InferenceResponse | None = None
    error: ServerError | None = None
    last: bool = False
    """``each`` only: nothing more will answer this request (set on its error or its end marker)."""


def _decode(item: Routed[T]) -> InferenceRequest:
    request = item.decode()
    assign_id(request)  # here, so that every reply to the request can name it
    return request


def _failed(item: Routed[T], error: ServerError, request_id: str | None, last: bool = False) -> Reply[T]:
    return Reply(item.tag, item.model, item.version, request_id, error=error, last=last)


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
            if item.model != first.model or item.version != first.version:
                self.next = item
                return
            try:
                request = _decode(item)
            except InvalidInput as exc:
                self.undecodable = _failed(item, exc, item.id)
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
            return Reply(
                self.tag(item.request_id), first.model, first.version, item.request_id, error=item.error
            )
        return Reply(self.tag(item.id), first.model, first.version, item.id, response=item)


async def in_sessions(
    dataplane: StreamServer, items: AsyncIterator[Routed[T]]
) -> AsyncGenerator[Reply[T], None]:
    """Serve a client stream MLServer's way: one model stream per run of requests for one model."""
    source = aiter(items)
    item = await anext(source, None)
    while item is not None:
        try:
            dataplane.check_model(item.model, item.version)
            request = _decode(item)
        except ServerError as exc:
            yield _failed(item, exc, item.id)
            item = await anext(source, None)
            continue
        segment = _Segment(source, item, request)
        async with aclosing(segment.requests()) as requests:
            try:
                stream = dataplane.infer_stream_in_band(requests, item.model, item.version)
                async with aclosing(stream) as replies:
                    async for reply in replies:
                        yield segment.reply(reply)
            except ServerError as exc:  # the model went away between the check and the first step
                latest = segment.tags.latest_id
                yield Reply(segment.tag(latest), item.model, item.version, latest, error=exc)
        if segment.undecodable is not None:
            yield segment.undecodable
        item = segment.next or await anext(source, None)


# ---------------------------------------------------------------------- Triton's way


class _End:
    """What the reader puts last: every request has been answered (or the read failed)."""

    def __init__(self, failure: BaseException | None = None) -> None:
        self.failure = failure


async def _answer(dataplane: StreamServer, item: Routed[T]) -> AsyncGenerator[Reply[T], None]:
    """The replies to one request, served as a model stream of its own; the last one is ``last``."""
    try:
        dataplane.check_model(item.model, item.version)
        request = _decode(item)
    except ServerError as exc:
        yield _failed(item, exc, item.id, last=True)
        return
    try:
        stream = dataplane.infer_stream(one(request), item.model, item.version)
        async with aclosing(stream) as responses:
            async for response in responses:
                yield Reply(item.tag, item.model, item.version, request.id, response=response)
    except Exception as exc:  # the core sorted the model's errors already; anything else is a bug
        yield _failed(item, sort_error(item.model, exc), request.id, last=True)
        return
    yield Reply(item.tag, item.model, item.version, request.id, last=True)


async def each(
    dataplane: StreamServer, items: AsyncIterator[Routed[T]], limit: int = EACH_IN_FLIGHT
) -> AsyncGenerator[Reply[T], None]:
    """Serve a client stream Triton's way: every request on its own, at most ``limit`` at a time."""
    replies: Outbox[Reply[T] | _End] = Outbox(EACH_BUFFER)
    slots = asyncio.Semaphore(limit)
    tasks: set[asyncio.Task[None]] = set()

    async def serve(item: Routed[T]) -> None:
        try:
            async with aclosing(_answer(dataplane, item)) as answers:
                async for reply in answers:
                    await replies.put(reply)
        finally:
            slots.release()

    async def read() -> None:
        failure: BaseException | None = None
        source = aiter(items)
        try:
            while True:
                await slots.acquire()  # before reading: a request beyond the limit stays unread
                item = await anext(source, None)
                if item is None:
                    break
                task = asyncio.create_task(serve(item))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except Exception as exc:  # the transport could not read: answer what was read, then fail
            failure = exc
        try:
            while tasks:
                await asyncio.gather(*tasks)
        except Exception as exc:  # a bug in serving one request: end the stream with it
            failure = failure or exc
        await replies.put(_End(failure))

    reader = asyncio.create_task(read())
    try:
        while not isinstance(reply := await replies.get(), _End):
            yield reply
        if reply.failure is not None:
            raise reply.failure
    finally:
        # closed early or cancelled: cancel the reading and every request still served
        await stop_tasks(reader, *tasks)
