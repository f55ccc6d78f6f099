"""Cancel a request's work when its HTTP client goes away.

Starlette does not cancel a handler whose client disconnects: the work would run to the end for
nobody. Here a watcher task waits for ``http.disconnect`` while the handler awaits its work; on
disconnect it cancels the handler's task, so that the cancellation reaches the core (a sequence
batcher drops the queued request and cancels its sequence, as Triton does), and the handler turns
it into ``Cancelled`` (499, which nobody reads). A cancellation that the watcher did not cause
(the server stopping) propagates unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from ..errors import Cancelled

T = TypeVar("T")


class _Watcher:
    __slots__ = ("fired", "request", "task")

    def __init__(self, request: Request, task: asyncio.Task[object]) -> None:
        self.request = request
        self.task = task
        self.fired = False

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
    watching = asyncio.ensure_future(watcher.watch())
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
        watching.cancel()
