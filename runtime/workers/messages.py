"""The messages a server and its worker processes exchange, and what both ends share about them.

Every message is a tuple ``(kind, id, payload)``; ``id`` names one call or stream (0: the worker
itself). Server → worker:

- ``init``      (sys.path, pickled ModelSettings, worker id): load the model
- ``call``      a request (or a merged batch) for ``predict``
- ``open``      a stream begins; ``item`` brings each of its requests, ``close_in`` their end
- ``seq``       a batch of sequence steps ``[(key, start, end, request), ...]`` for ``predict_sequences``
- ``seq_end``   ``(key, reason)``: a sequence has ended; the worker drops its state and tells the model
- ``ack``       the server has taken ``payload`` more chunks of a stream (the worker may send as many)
- ``cancel``    give up the call or stream
- ``stop``      finish, unload the model and exit

Worker → server:

- ``ready`` / ``failed``     the model loaded (payload: pid) or could not (payload: why)
- ``ok`` / ``err``           a call's result or exception (final)
- ``chunk``                  one response of a stream; ``end`` (final) after the last one
- ``gone``                   a cancelled call or stream has left the model (final)
- ``ack``                    the model has taken ``payload`` more requests of a stream
- ``ended``                  (id 0) the sequence ``payload`` ended in the worker's own batcher
                             (continuous batching: an END, idle or lifetime timeout, ...)

Every call and stream gets exactly one final message, so the server knows how busy a worker is
even after a caller gave up (a thread that cannot be interrupted still occupies the worker).
Both directions of a stream are bounded by ``WINDOW`` messages in flight.
"""

from __future__ import annotations

import asyncio
import pickle
from collections import deque
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

WINDOW: Final = 32
"""Messages of one stream (in either direction) that may be in flight before an ``ack``."""
ACK_EVERY: Final = WINDOW // 2
"""How many messages a receiver takes before it acknowledges them."""

FINAL: Final = frozenset({"ok", "err", "end", "gone"})

T = TypeVar("T")


class Inbox(Generic[T]):
    """The messages of one stream that arrived and have not been taken yet (at most ``WINDOW``,
    since the sender holds a :class:`Credit`)."""

    __slots__ = ("items", "waker")

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self.waker: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        self.items.append(item)
        _wake(self.waker)

    async def get(self) -> T:
        while not self.items:
            self.waker = asyncio.get_running_loop().create_future()
            try:
                await self.waker
            finally:
                self.waker = None
        return self.items.popleft()


class Credit:
    """How many more messages of one stream may be sent before the receiver acknowledges some."""

    __slots__ = ("left", "waker")

    def __init__(self) -> None:
        self.left = WINDOW
        self.waker: asyncio.Future[None] | None = None

    def give(self, n: int) -> None:
        self.left += n
        _wake(self.waker)

    async def take(self) -> None:
        while self.left <= 0:
            self.waker = asyncio.get_running_loop().create_future()
            try:
                await self.waker
            finally:
                self.waker = None
        self.left -= 1


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


@dataclass(frozen=True, slots=True)
class HeldState:
    """What the server keeps for a sequence whose state lives in a worker process: where it is."""

    worker: int


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling; else a ``RuntimeError`` that tells its type and message."""
    try:
        pickle.loads(pickle.dumps(exc, protocol=5))
    except Exception:
        return RuntimeError(f"{type(exc).__qualname__}: {exc}")
    return exc
