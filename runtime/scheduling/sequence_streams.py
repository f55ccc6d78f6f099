"""Sequence batching over streams (gRPC ModelStreamInfer): read ahead, answer in order.

Requests of a stream are read ahead and admitted as they arrive, at most ``READ_AHEAD`` of them
unanswered (``runtime.streams.window``), so that the sequences of one stream share batches; they
are answered in the order they came, each response tagged with its request's id. A request whose
sequence queue is full of this stream's own earlier requests waits for room (back-pressure)
instead of being refused. A request that is refused or fails is reported in band (its
``StreamError``) and the stream goes on. Closing the stream cancels its unanswered requests, and
so their sequences.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Protocol

from runtime.sequences.identity import SequenceControl, parse_control
from runtime.sequences.lifecycle import Pending
from runtime.streams.pipeline import StreamError
from runtime.streams.window import Window
from runtime.types import InferenceRequest, InferenceResponse


class SequenceSubmitter(Protocol):
    """What a stream needs of the sequence batcher (``.sequence_batching.SequenceScheduler``)."""

    async def serve_stateless(self, request: InferenceRequest) -> InferenceResponse: ...

    def submit(self, request: InferenceRequest, control: SequenceControl) -> Pending: ...

    def has_room(self, key: str) -> bool: ...


Answer = asyncio.Future[InferenceResponse]
"""A request admitted: its response to come."""


async def serve_stream(
    scheduler: SequenceSubmitter, requests: AsyncIterator[InferenceRequest]
) -> AsyncIterator[InferenceResponse | StreamError]:
    """Serve a stream of requests (e.g. a gRPC stream carrying several sequences); see above."""
    window: Window[Answer, tuple[InferenceRequest, Answer | Exception]] = Window()
    mine: dict[str, deque[Answer]] = {}

    async def admit(request: InferenceRequest) -> None:
        answer = await _admit(scheduler, request, mine, window.size)
        if not isinstance(answer, Exception):
            window.opened(answer)
        window.push((request, answer))

    window.read(requests, admit)
    try:
        async for request, answer in window:
            if isinstance(answer, Exception):
                yield StreamError(answer, request.id)
                continue
            try:
                response = await answer
            except Exception as exc:
                yield StreamError(exc, request.id)
                continue
            finally:
                window.finished(answer)
            if request.id is not None:
                response.id = request.id
            yield response
    finally:
        for answer in window.open:
            answer.cancel()
        await window.close()


async def _admit(
    scheduler: SequenceSubmitter,
    request: InferenceRequest,
    mine: dict[str, deque[Answer]],
    remembered: int,
) -> Answer | Exception:
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
        if len(mine) > remembered:  # forget sequences this stream no longer has requests in
            for key in [key for key, futures in mine.items() if all(f.done() for f in futures)]:
                del mine[key]
        return future
    except Exception as exc:
        return exc
