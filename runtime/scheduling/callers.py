"""The callers of the continuous batcher: each call's items in order, each stream's entry, and
how a call of several requests (a stream) is served.

A *call* is one ``infer`` or one iteration of ``stream`` (an SSE response, a gRPC
``ModelStreamInfer`` call): a :class:`~runtime.streams.window.Window` whose open requests are the
call's streams. The stepper pushes what they produce (chunks, their ends, their failures) into
it, and the call's reader takes them in that order. An *entry* is one stream from its arrival to
its end: it waits in the queue as a :class:`~.queueing.Waiter` whose future is done once it has
joined the running set.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.continuous import Stream
from runtime.errors import ServerError
from runtime.scheduling.queueing import Waiter
from runtime.sequences.identity import mark_response
from runtime.sequences.lifecycle import Pending
from runtime.streams.pipeline import StreamError
from runtime.streams.window import BUFFERED, Window
from runtime.types import InferenceRequest, InferenceResponse, Parameters, set_extra

CHUNK, END, ERROR = range(3)
"""The kinds of a call's items: a chunk, a stream's end, a stream's failure (a ``StreamError``)."""

Item = tuple[int, "Entry | None", Any]


class Call(Window["Entry", Item]):
    """One caller of the scheduler (an ``infer`` or a ``stream`` iteration): what its streams
    produce, in order, and its streams that have not finished (the window's open requests; each
    stream bounds its own unread chunks, ``BUFFERED``)."""

    __slots__ = ()


@dataclass(eq=False)
class Entry(Waiter[None]):
    """One stream from its arrival to its end; its future is done once it has joined the running set."""

    stream: Stream = field(default=None, repr=False)  # type: ignore[assignment]
    call: Call = field(default=None, repr=False)  # type: ignore[assignment]
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
) -> AsyncGenerator[InferenceResponse | StreamError, None]:
    """One call's requests, each run as a stream as it arrives; their chunks, in the order made.

    A request that is refused or fails is yielded as its ``StreamError`` and the others go on.
    Closing the iteration takes every stream of the call out of the batch.
    """
    call = Call()

    async def admit(request: InferenceRequest) -> None:
        try:
            call.opened(scheduler.admit(request, call))
        except ServerError as exc:
            call.push((ERROR, None, StreamError(exc, request.id)))

    call.read(requests, admit)
    try:
        async for kind, entry, payload in call:
            if kind == CHUNK:
                assert entry is not None
                entry.unread -= 1
                if entry.unread == BUFFERED - 1:
                    scheduler.wake()  # it may step again
                yield payload
            else:  # END, or ERROR: one request failed, in band, and the others go on
                if entry is not None:
                    call.finished(entry)
                if kind == ERROR:
                    yield payload
    finally:
        # leave first, synchronously: this may run inside a cancelled anyio scope (an SSE
        # response whose client went away), where every await raises at once
        for entry in list(call.open):
            scheduler.leave(entry)
        await call.close()  # shielded: the requests' iterator must be free when we return
