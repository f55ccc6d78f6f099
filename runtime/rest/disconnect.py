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
then (queued in a batch or a sequence, or a slow model), so the common path pays one timer
instead of a task. A disconnect is noticed at most ``WATCH_AFTER`` late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

from ..errors import Cancelled

T = TypeVar("T")

WATCH_AFTER = 0.005  # seconds


class _Watcher:
    __slots__ = ("fired", "request", "task", "watching")

    def __init__(self, request: Request, task: asyncio.Task[object]) -> None:
        self.request = request
        self.task = task
        self.fired = False
        self.watching: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.watching = asyncio.ensure_future(self.watch())

    def stop(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
            # the task ends holding its CancelledError, whose traceback holds this watcher: without
            # this, watcher -> task -> error -> frame -> watcher is a cycle per request for the GC
            self.watching = None

    async def watch(self) -> None:
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                self.fire()
                return

    def fire(self) -> None:
        """The client went away: cancel the handler's task."""
        self.fired = True
        self.task.cancel()


def _hooked_cycle(request: Request) -> Any:
    """The uvicorn cycle behind ``request`` when the server's protocol calls its ``on_disconnect``
    (its ``receive`` reached the app unwrapped), and its client is still there; else None."""
    cycle = getattr(request.receive, "__self__", None)
    if cycle is None or not hasattr(cycle, "on_disconnect") or getattr(cycle, "disconnected", True):
        return None
    return cycle


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ``Cancelled``."""
    task = asyncio.current_task()
    assert task is not None
    watcher = _Watcher(request, task)
    cycle = _hooked_cycle(request)
    if cycle is not None:
        cycle.on_disconnect = watcher.fire
        try:
            return await work
        except asyncio.CancelledError:
            if not watcher.fired:
                raise
            _uncancel(task)
            raise Cancelled("The client disconnected before the answer was ready") from None
        finally:
            cycle.on_disconnect = None
    timer = asyncio.get_running_loop().call_later(WATCH_AFTER, watcher.start)
    try:
        return await work
    except asyncio.CancelledError:
        if not watcher.fired:
            raise
        _uncancel(task)
        raise Cancelled("The client disconnected before the answer was ready") from None
    finally:
        timer.cancel()
        watcher.stop()


def _uncancel(task: asyncio.Task[Any]) -> None:
    uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this cancellation is handled
    if uncancel is not None:
        uncancel()
