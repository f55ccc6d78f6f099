"""Cancelling a request's work when its HTTP client goes away (``runtime.rest.disconnect``)."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request
from starlette.types import Message

from runtime.errors import Cancelled
from runtime.rest.disconnect import cancel_on_disconnect

pytestmark = pytest.mark.anyio


def _request(disconnect: asyncio.Event) -> Request:
    async def receive() -> Message:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


async def test_work_that_ends_first_gives_its_result() -> None:
    async def work() -> str:
        await asyncio.sleep(0.02)  # past the moment the watcher starts
        return "answer"

    assert await cancel_on_disconnect(_request(asyncio.Event()), work()) == "answer"


async def test_a_disconnect_cancels_the_work_and_is_reported_as_cancelled() -> None:
    disconnect, started, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    task = asyncio.create_task(cancel_on_disconnect(_request(disconnect), work()))
    await started.wait()
    disconnect.set()
    with pytest.raises(Cancelled, match="client disconnected"):
        await asyncio.wait_for(task, 5)
    assert cancelled.is_set()


async def test_a_cancellation_the_client_did_not_cause_goes_on_unchanged() -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(cancel_on_disconnect(_request(asyncio.Event()), work()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_only_work_still_waiting_after_the_first_ticks_gets_a_watcher_and_the_timer_stops() -> None:
    from runtime.rest import disconnect

    receives: list[int] = []

    async def receive() -> Message:
        receives.append(1)
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def quick() -> str:
        return "quick"

    assert await cancel_on_disconnect(receive, quick()) == "quick"
    await asyncio.sleep(disconnect.WATCH_AFTER * 2)
    assert receives == []  # answered before any tick: never watched
    ticker = disconnect._ticker
    assert ticker is not None and not ticker.waiting and ticker.handle is None  # nothing waits: no timer

    async def slow() -> str:
        await asyncio.sleep(disconnect.WATCH_AFTER * 3)
        return "slow"

    assert await cancel_on_disconnect(receive, slow()) == "slow"
    assert receives == [1]  # watched once it had waited WATCH_AFTER at the most
    await asyncio.sleep(disconnect.WATCH_AFTER * 2)
    assert not ticker.waiting and ticker.handle is None


async def test_a_receive_callable_is_watched_as_a_request_is() -> None:
    disconnect = asyncio.Event()

    async def receive() -> Message:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def work() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(cancel_on_disconnect(receive, work()))
    await asyncio.sleep(0.02)
    disconnect.set()
    with pytest.raises(Cancelled, match="client disconnected"):
        await asyncio.wait_for(task, 5)
