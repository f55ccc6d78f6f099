"""Sequence batching over streams (gRPC ModelStreamInfer): read ahead, answer in order.

Requests of a stream are read ahead and admitted as they arrive, at most ``STREAM_WINDOW``
unanswered, so that the sequences of one stream share batches; they are answered in the order they
came, each response tagged with its request's id. A request whose sequence queue is full of this
stream's own earlier requests waits for room (back-pressure) instead of being refused. A request
that is refused or fails is reported in band (``RequestFailed``) and the stream goes on. Closing
the stream cancels its unanswered requests, and so their sequences.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Protocol

from runtime.sequences.identity import SequenceControl, parse_control
from runtime.sequences.lifecycle import Pending
from runtime.types import InferenceRequest, InferenceResponse
from runtime.scheduling.scheduler import RequestFailed


class SequenceSubmitter(Protocol):
    """What a stream needs of the sequence batcher (``.sequence_batching.SequenceScheduler``)."""

    async def serve_stateless(self, request: InferenceRequest) -> InferenceResponse: ...

    def submit(self, request: InferenceRequest, control: SequenceControl) -> Pending: ...

    def has_room(self, key: str) -> bool: ...


STREAM_WINDOW = 64
"""Most requests of one stream admitted but not yet answered (it reads no further until one is)."""

_DONE = object()


async def serve_stream(
    scheduler: SequenceSubmitter, requests: AsyncIterator[InferenceRequest]
) -> AsyncIterator[InferenceResponse | RequestFailed]:
    """Serve a stream of requests (e.g. a gRPC stream carrying several sequences); see above."""
    window: asyncio.Queue[Any] = asyncio.Queue(STREAM_WINDOW)
    mine: dict[str, deque[asyncio.Future[InferenceResponse]]] = {}

    async def read() -> None:
        try:
            async for request in requests:
                await window.put((request, await _admit(scheduler, request, mine)))
            await window.put(_DONE)
        except Exception as exc:  # the request stream itself failed
            await window.put(exc)

    reader = asyncio.create_task(read())
    try:
        while True:
            got = await window.get()
            if got is _DONE:
                return
            if isinstance(got, Exception):
                raise got
            request, item = got
            if isinstance(item, Exception):
                yield RequestFailed(item, request.id)
                continue
            try:
                response = await item
            except Exception as exc:
                yield RequestFailed(exc, request.id)
                continue
            if request.id is not None:
                response.id = request.id
            yield response
    finally:
        reader.cancel()
        while not window.empty():
            left = window.get_nowait()
            if isinstance(left, tuple) and isinstance(left[1], asyncio.Future):
                left[1].cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def _admit(
    scheduler: SequenceSubmitter,
    request: InferenceRequest,
    mine: dict[str, deque[asyncio.Future[InferenceResponse]]],
) -> asyncio.Future[InferenceResponse] | Exception:
    """Admit one request of a stream: its future, or the error that refused it."""
    try:
        control = parse_control(request.parameters)
        if control is None:
            return asyncio.ensure_future(scheduler.serve_stateless(request))
        own = mine.setdefault(control.key, deque())
        while own:
            while own and own[0].done():
                own.popleft()
            if not own or scheduler.has_room(control.key):
                break
            await asyncio.wait({own[0]})  # this stream's own requests fill the queue: wait for room
        future = scheduler.submit(request, control).future
        own.append(future)
        if len(mine) > STREAM_WINDOW:  # forget sequences this stream no longer has requests in
            for key in [key for key, futures in mine.items() if all(f.done() for f in futures)]:
                del mine[key]
        return future
    except Exception as exc:
        return exc
