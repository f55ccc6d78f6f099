"""The callers of the continuous batcher: each call's items in order, each stream's entry, and
how a call of several requests (a stream) is served.

A *call* is one ``infer`` or one iteration of ``stream`` (an SSE response, a gRPC
``ModelStreamInfer`` call): the stepper pushes what the call's streams produce (chunks, their
ends, their errors) into the call's items, and the call's reader takes them in that order. An
*entry* is one stream from its arrival to its end: it waits in the queue as a
:class:`~.queueing.Waiter` whose future is done once it has joined the running set.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from runtime.continuous import Stream
from runtime.errors import ServerError
from runtime.sequences.identity import mark_response
from runtime.sequences.lifecycle import Pending
from runtime.streams.pipeline import Outbox, stop_tasks
from runtime.types import InferenceRequest, InferenceResponse, Parameters, set_extra
from runtime.scheduling.queueing import Waiter
from runtime.scheduling.scheduler import RequestFailed

STREAM_BUFFER: Final = 8
"""Chunks of one stream produced but not yet taken by its reader; at this many it sits out steps."""

CALL_WINDOW: Final = 64
"""How far (in requests) one call may read past its oldest unfinished request."""

CHUNK, END, ERROR, READ_END, READ_FAILED = range(5)
"""The kinds of a call's items: a chunk, a stream's end, a stream's error, the end of the
requests, the failure of the requests' iterator."""

Item = tuple[int, "Entry | None", Any]


class Call(Outbox[Item]):
    """One caller of the scheduler (an ``infer`` or a ``stream`` iteration): what its streams produce,
    in order (the pipeline's :class:`~runtime.streams.pipeline.Outbox`; each stream bounds its own
    unread chunks), and its streams that have not finished."""

    __slots__ = ("open", "reading", "room", "taken")

    def __init__(self) -> None:
        super().__init__()
        self.open: dict[Entry, None] = {}
        self.reading = True
        self.room: asyncio.Future[None] | None = None
        self.taken = 0

    def close(self, entry: Entry | None) -> None:
        if entry is not None and self.open.pop(entry, False) is None:
            if self.room is not None and not self.room.done():
                self.room.set_result(None)

    async def wait_for_room(self, index: int) -> None:
        while self.open and next(iter(self.open)).index <= index - CALL_WINDOW:
            self.room = asyncio.get_running_loop().create_future()
            try:
                await self.room
            finally:
                self.room = None


@dataclass(eq=False)
class Entry(Waiter[None]):
    """One stream from its arrival to its end; its future is done once it has joined the running set."""

    stream: Stream = field(default=None, repr=False)  # type: ignore[assignment]
    call: Call = field(default=None, repr=False)  # type: ignore[assignment]
    index: int = 0
    collect: bool = False
    """A unary request: keep the chunks and answer with them combined."""
    chunks: list[InferenceResponse] = field(default_factory=list, repr=False)
    started: bool = False
    """``start_stream`` succeeded: ``end_stream`` is owed."""
    gone: bool = False
    """Its caller went away while it was running: drop it before the next step."""
    ended: bool = False
    unread: int = 0
    last: tuple[int, int] = (0, 0)
    """The (batch_size, step_id) of its latest step."""
    order: int = 0
    """Its place among every stream that arrived at the scheduler."""
    pending: Pending | None = field(default=None, repr=False)
    """With sequences: its request's place in its sequence's lifecycle (None outside any sequence)."""
    replica: str | None = None
    """With a shared sequence store: this replica's name, told in each chunk (``sequence_replica``)."""


class StreamScheduler(Protocol):
    """What a call needs of the continuous batcher (``.continuous_batching.ContinuousScheduler``)."""

    def admit(self, request: InferenceRequest, call: Call, collect: bool = False) -> Entry: ...

    def leave(self, entry: Entry) -> None: ...

    def wake(self) -> None: ...


def stamp(response: InferenceResponse, entry: Entry, last: bool = False) -> None:
    """Tag a chunk with its stream's id and the size and id of its step; a chunk of a sequence
    also with its sequence id, and the last chunk of the stream that ends it with ``sequence_end``."""
    size, step_id = entry.last
    response.id = entry.stream.id
    params = response.parameters
    if params is None:
        extra: dict[str, Any] = {"batch_size": size, "step_id": step_id}
        response.parameters = Parameters(**extra)
    else:
        set_extra(params, "batch_size", size)
        set_extra(params, "step_id", step_id)
    sequence = entry.stream.sequence
    if entry.pending is not None and sequence is not None:
        mark_response(response, entry.pending.control, last and sequence.ends, entry.replica)


async def serve_stream(
    scheduler: StreamScheduler, requests: AsyncIterator[InferenceRequest]
) -> AsyncGenerator[InferenceResponse | RequestFailed, None]:
    """One call's requests, each run as a stream as it arrives; their chunks, in the order made.

    A request that is refused or fails is yielded as ``RequestFailed`` and the others go on.
    Closing the iteration takes every stream of the call out of the batch.
    """
    call = Call()
    reader = asyncio.create_task(_read(scheduler, requests, call))
    try:
        while True:
            kind, entry, payload = await call.get()
            if kind == CHUNK:
                assert entry is not None
                entry.unread -= 1
                if entry.unread == STREAM_BUFFER - 1:
                    scheduler.wake()  # it may step again
                yield payload
            elif kind == END:
                call.close(entry)
                if not call.reading and not call.open:
                    return
            elif kind == READ_END:
                if not call.open:
                    return
            elif kind == ERROR:  # one request failed: in band, the others go on
                call.close(entry)
                yield payload
                if not call.reading and not call.open:
                    return
            else:  # READ_FAILED: the requests themselves broke
                raise payload
    finally:
        # leave first, synchronously: this may run inside a cancelled anyio scope (an SSE
        # response whose client went away), where every await raises at once
        for entry in list(call.open):
            scheduler.leave(entry)
        call.open.clear()
        call.clear()
        await stop_tasks(reader)  # shielded: the requests' iterator must be free when we return


async def _read(scheduler: StreamScheduler, requests: AsyncIterator[InferenceRequest], call: Call) -> None:
    try:
        async for request in requests:
            await call.wait_for_room(call.taken)
            try:
                entry = scheduler.admit(request, call)
            except ServerError as exc:
                call.push((ERROR, None, RequestFailed(exc, request.id)))
                continue
            call.open[entry] = None
        call.reading = False
        call.push((READ_END, None, None))
    except Exception as exc:
        call.reading = False
        call.push((READ_FAILED, None, exc))
