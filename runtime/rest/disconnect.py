"""Cancel a request's work when its HTTP client goes away.

Starlette does not cancel a handler whose client disconnects: the work would run to the end for
nobody. Here a watcher task waits for ``http.disconnect`` while the handler awaits its work; on
disconnect it cancels the handler's task, so that the cancellation reaches the core (a sequence
batcher drops the queued request and cancels its sequence, as Triton does), and the handler turns
it into ``Cancelled`` (499, which nobody reads). A cancellation that the watcher did not cause
(the server stopping) propagates unchanged.

Most requests are answered in well under ``WATCH_AFTER``: the watcher task is created only for
those still waiting then (queued in a batch or a sequence, or a slow model), so the common path
pays one timer instead of a task. A disconnect is noticed at most ``WATCH_AFTER`` late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

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
                self.fired = True
                self.task.cancel()
                return


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ``Cancelled``."""
    task = asyncio.current_task()
    assert task is not None
    watcher = _Watcher(request, task)
    timer = asyncio.get_running_loop().call_later(WATCH_AFTER, watcher.start)
    try:
        return await work
    except asyncio.CancelledError:
        if not watcher.fired:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+: this cancellation is handled
        if uncancel is not None:
            uncancel()
        raise Cancelled("The client disconnected before the answer was ready") from None
    finally:
        timer.cancel()
        watcher.stop()
