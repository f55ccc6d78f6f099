"""Cancel a request's work when its HTTP client goes away.

Starlette does not cancel a handler whose client disconnects: the work would run to the end for
nobody. Here the work runs in its own task while a watcher waits for ``http.disconnect``; on
disconnect the work is cancelled, so that the core can react (a sequence batcher drops the queued
request and cancels its sequence, as Triton does) and the handler raises ``Cancelled`` (499, which
nobody reads). Cancelling the handler task itself instead would surface in the server's logs as
an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from ..errors import Cancelled

T = TypeVar("T")


async def _watch(request: Request, work: asyncio.Future[Any]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            work.cancel()
            return


async def cancel_on_disconnect(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first (then raise ``Cancelled``)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_watch(request, task))
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled() and task.cancelled():
            raise Cancelled("The client disconnected before the answer was ready") from None
        raise
    finally:
        watcher.cancel()
