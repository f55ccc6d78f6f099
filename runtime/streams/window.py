"""Reading a stream's requests ahead within a window, and its answers in the order they were made:
the one way every stream server does it.

A stream's requests are read by a task of their own, ahead of the answers, so that several of them
are served at once (they share a batch, or run side by side). At most ``size`` (``READ_AHEAD``) are
*open* at a time: read and not yet finished. Beyond that the next request is not read, so the
transport's flow control holds the client back and what a stream holds stays bounded, whatever
the client sends.

What answers the requests (responses, errors, the ends of streams) is put into the window by
whoever makes it: the reading task, a scheduler's steps, the tasks serving the requests. The
stream's consumer takes it in the order it was put (``async for``). A window with a ``bound``
(``BUFFERED``) makes its producers wait (``put``) while that many answers wait for the consumer,
so that a consumer that stops reading stops them; producers that bound themselves ``push``.

The consumer's iteration ends once the requests have ended and every open one has finished, after
everything put before that. When reading the requests fails, what was read is still answered, and
then the iteration raises that failure. ``close`` stops the reading (and the tasks it is given)
and forgets what is left; the caller first stops what it left open (a scheduler's streams,
futures), which it alone knows how to stop.

Three stream servers use it: the continuous batcher's calls (``runtime.scheduling.callers``: each
request a stream joining the running set), sequences over streams
(``runtime.scheduling.sequence_streams``: answered in the order they came) and Triton's client
streams (``runtime.core.client_streams``: each request served by a task of its own).
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Final, Generic, TypeVar

import anyio

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")

READ_AHEAD: Final = 64
"""Most requests of one stream open at once (read and not yet finished)."""

BUFFERED: Final = 8
"""Most answers made and not yet taken by a consumer that stopped reading: per stream under
continuous batching (a stream with this many unread chunks sits out steps), per client stream for
Triton's format (the tasks serving its requests wait)."""


class _Mark(enum.Enum):
    ENDED = enum.auto()
    """Put last: the requests have ended and every open one has finished."""


class Window(Generic[K, T]):
    """One stream's open requests (keys ``K``: whatever stops one) and its answers ``T`` for its
    consumer, in order; see the module docstring."""

    __slots__ = (
        "_reader",
        "_room",
        "_space",
        "_waker",
        "bound",
        "failure",
        "items",
        "open",
        "reading",
        "size",
    )

    def __init__(self, size: int = READ_AHEAD, bound: int | None = None) -> None:
        self.size = size
        self.bound = bound
        self.open: dict[K, None] = {}
        """The requests read and not yet finished, oldest first."""
        self.reading = False
        self.failure: Exception | None = None
        """Why reading the requests failed (raised once what was read is answered)."""
        self.items: deque[T | _Mark] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._waker: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None
        self._space: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self.items)

    # ------------------------------------------------------------------ the requests

    def read(self, requests: AsyncIterator[R], admit: Callable[[R], Awaitable[object]]) -> None:
        """Read ``requests`` in a task of their own: each is handed to ``admit``, which opens what
        it leaves running (``opened``) or answers it at once; the next one is read once fewer
        than ``size`` are open."""
        self.reading = True
        self._reader = asyncio.create_task(self._read(requests, admit))

    async def _read(self, requests: AsyncIterator[R], admit: Callable[[R], Awaitable[object]]) -> None:
        try:
            async for request in requests:
                await admit(request)
                while len(self.open) >= self.size:
                    self._room = asyncio.get_running_loop().create_future()
                    try:
                        await self._room
                    finally:
                        self._room = None
        except Exception as exc:  # the requests themselves broke: answer what was read, then fail
            self.failure = exc
        self.reading = False
        if not self.open:
            self.push(_Mark.ENDED)

    def opened(self, key: K) -> None:
        """A request read is running until ``finished(key)``."""
        self.open[key] = None

    def finished(self, key: K) -> None:
        """The request ``key`` opened has finished (again, or never opened: nothing happens)."""
        if key not in self.open:
            return
        del self.open[key]
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        if not self.open and not self.reading and self._reader is not None:
            self.push(_Mark.ENDED)

    async def close(self, *tasks: asyncio.Task[None]) -> None:
        """Stop the reading and ``tasks``, and forget what is open and what is left unread.

        Shielded: this runs when a stream is closed, possibly inside a cancelled anyio scope (an
        SSE response whose client went away), where every await would raise at once; the
        requests' iterator must be free when the stream's close returns.
        """
        self.open.clear()
        if self._reader is not None:
            await stop_tasks(self._reader, *tasks)
        else:
            await stop_tasks(*tasks)
        self.items.clear()

    # ------------------------------------------------------------------ the answers

    def push(self, item: T | _Mark) -> None:
        """Put ``item`` now, whatever the bound."""
        self.items.append(item)
        if self._waker is not None and not self._waker.done():
            self._waker.set_result(None)

    async def put(self, item: T) -> None:
        """Put ``item`` once fewer than ``bound`` answers wait for the consumer."""
        while self.bound is not None and len(self.items) >= self.bound:
            if self._space is None or self._space.done():
                self._space = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._space)
        self.push(item)

    def __aiter__(self) -> Window[K, T]:
        return self

    async def __anext__(self) -> T:
        """The next answer, once there is one; the end once the requests have ended and every open
        one has finished (or the failure of reading them)."""
        while not self.items:
            self._waker = asyncio.get_running_loop().create_future()
            try:
                await self._waker
            finally:
                self._waker = None
        item = self.items.popleft()
        if self._space is not None and not self._space.done():
            self._space.set_result(None)
        if item is _Mark.ENDED:
            if self.failure is not None:
                raise self.failure
            raise StopAsyncIteration
        return item


async def stop_tasks(*tasks: asyncio.Task[None]) -> None:
    """Cancel ``tasks`` (a stream's read-ahead and serving tasks) and wait until they have ended,
    shielded from the cancellation of the caller (see ``Window.close``)."""
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*pending, return_exceptions=True)
