"""Cancel a request's work when its HTTP client goes away.

Starlette does not cancel a handler whose client disconnects: the work would run to the end for
nobody. Here a watcher task waits for ``http.disconnect`` while the handler awaits its work; on
disconnect it cancels the handler's task, so that the cancellation reaches the core (a sequence
batcher drops the queued request and cancels its sequence, as Triton does), and the handler turns
it into ``Cancelled`` (499, which nobody reads). A cancellation that the watcher did not cause
(the server stopping) propagates unchanged.

Served by the server's own protocol (``protocol.GuardedHttpToolsProtocol``), no watcher is needed:
the request's uvicorn cycle has an ``on_disconnect`` slot that the protocol calls when the
connection is lost before the response is complete, and the handler's task is cancelled from
there, at once. Under any other server (a test client, another ASGI server), most requests are
answered in well under ``WATCH_AFTER``: the watcher task is created only for those still waiting
then (queued in a batch or a sequence, or a slow model). The requests waiting
are noted in a dict of the event loop's :class:`_Ticker`, whose one timer, armed while any request
waits, goes off every ``WATCH_AFTER / 2`` seconds and starts the watchers of the requests it saw
at its previous tick: a request pays a dict entry, not a timer of its own (a timer handle, a heap
push and a cancellation). A watcher starts between ``WATCH_AFTER / 2`` and ``WATCH_AFTER`` after its
request began to wait, so a disconnect is noticed at most ``WATCH_AFTER`` late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import FunctionType, MethodType
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import Receive

from runtime.errors import Cancelled

T = TypeVar("T")

WATCH_AFTER = 0.005  # seconds


class _Watcher:
    __slots__ = ("fired", "receive", "task", "watching")

    def __init__(self, receive: Receive, task: asyncio.Task[object]) -> None:
        self.receive = receive
        self.task = task
        self.fired = False
        self.watching: asyncio.Task[None] | None = None

    async def watch(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.fire()
                return

    def fire(self) -> None:
        """The client went away: cancel the handler's task."""
        self.fired = True
        self.task.cancel()


def _hooked_cycle(receive: Receive) -> Any:
    """The uvicorn cycle behind ``receive`` when the server's protocol calls its ``on_disconnect``
    (its ``receive`` reached the app unwrapped), and its client is still there; else None."""
    cycle = getattr(receive, "__self__", None)
    if cycle is None or not hasattr(cycle, "on_disconnect") or getattr(cycle, "disconnected", True):
        return None
    return cycle


class _Ticker:
    """The requests of one event loop waiting for their work, and the one timer that starts the
    watchers of those that wait long (see the module docstring)."""

    __slots__ = ("handle", "loop", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[_Watcher, bool] = {}
        """Each waiting request's watcher, not started yet: whether a tick has seen it."""
        self.handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        self.handle = self.loop.call_later(WATCH_AFTER / 2, self.tick)

    def tick(self) -> None:
        self.handle = None
        waiting = self.waiting
        for watcher, seen in list(waiting.items()):
            if seen:  # waiting since the previous tick at least
                del waiting[watcher]
                watcher.watching = asyncio.ensure_future(watcher.watch())
            else:
                waiting[watcher] = True
        if waiting:
            self.arm()


_ticker: _Ticker | None = None
_CALLABLES = (FunctionType, MethodType)


async def cancel_on_disconnect(request: Request | Receive, work: Awaitable[T]) -> T:
    """Await ``work``; if the client of ``request`` (or of the ASGI ``receive`` callable)
    disconnects first, cancel it and raise ``Cancelled``."""
    global _ticker
    task = asyncio.current_task()
    assert task is not None
    receive: Receive
    if type(request) in _CALLABLES:  # a receive callable (isinstance of Request would run ABCMeta's check)
        receive = request  # type: ignore[assignment]
    else:
        receive = request.receive if isinstance(request, Request) else request
    watcher = _Watcher(receive, task)
    cycle = _hooked_cycle(receive)
    waiting: dict[_Watcher, bool] | None = None
    if cycle is not None:  # the server's protocol tells of a disconnect: no watcher needed
        cycle.on_disconnect = watcher.fire
    else:
        ticker = _ticker
        loop = asyncio.get_running_loop()
        if ticker is None or ticker.loop is not loop:
            ticker = _ticker = _Ticker(loop)
        waiting = ticker.waiting
        waiting[watcher] = False
        if ticker.handle is None:
            ticker.arm()
    try:
        return await work
    except asyncio.CancelledError:
        if not watcher.fired:
            raise
        _uncancel(task)
        raise Cancelled("The client disconnected before the answer was ready") from None
    finally:
        if cycle is not None:
            cycle.on_disconnect = None
        elif waiting is not None and waiting.pop(watcher, None) is None and watcher.watching is not None:
            watcher.watching.cancel()
            # the task ends holding its CancelledError, whose traceback holds this watcher: without
            # this, watcher -> task -> error -> frame -> watcher is a cycle per request for the GC
            watcher.watching = None


def _uncancel(task: asyncio.Task[Any]) -> None:
    uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this cancellation is handled
    if uncancel is not None:
        uncancel()
