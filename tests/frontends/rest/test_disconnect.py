"""Cancelling a request's work when its HTTP client goes away (``runtime.frontends.rest.disconnect``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request
from starlette.types import Message

from runtime.errors import Cancelled
from runtime.frontends.rest.disconnect import cancel_on_disconnect

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
    from runtime.frontends.rest import disconnect

    receives: list[int] = []
    watched = asyncio.Event()

    async def receive() -> Message:
        receives.append(1)
        watched.set()
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
        await watched.wait()  # it waits until the ticks start its watcher: however late they run
        return "slow"

    assert await cancel_on_disconnect(receive, slow()) == "slow"
    assert receives == [1]  # work still waiting after the ticks got a watcher, one
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


async def test_a_watcher_leaves_no_reference_cycle_for_the_collector() -> None:
    """A request still waiting when the watcher starts (batched, queued) pays no cyclic garbage:
    the stopped watcher task must not hold its watcher through its CancelledError's traceback."""
    import gc

    from runtime.frontends.rest.disconnect import _Watcher

    async def work() -> str:
        await asyncio.sleep(0.02)  # past the moment the watcher starts
        return "answer"

    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            assert await cancel_on_disconnect(_request(asyncio.Event()), work()) == "answer"
        await asyncio.sleep(0.01)  # the watcher tasks run their cancellation
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, _Watcher)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert cyclic == []


class _Cycle:
    """What the server's protocol gives a request: a receive of its cycle, whose ``on_disconnect``
    the protocol calls when the connection is lost before the response is complete."""

    def __init__(self) -> None:
        self.disconnected = False
        self.on_disconnect: Any = None
        self.received = 0

    async def receive(self) -> Message:
        self.received += 1
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    def lose_connection(self) -> None:
        self.disconnected = True
        if self.on_disconnect is not None:
            self.on_disconnect()


def _served(cycle: _Cycle) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, cycle.receive)


async def test_under_the_servers_protocol_no_watcher_runs_and_a_disconnect_cancels_at_once() -> None:
    cycle, started, cancelled = _Cycle(), asyncio.Event(), asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    task = asyncio.create_task(cancel_on_disconnect(_served(cycle), work()))
    await started.wait()
    await asyncio.sleep(0.02)  # past WATCH_AFTER: still no watcher reading the request
    assert cycle.received == 0 and cycle.on_disconnect is not None
    cycle.lose_connection()
    with pytest.raises(Cancelled, match="client disconnected"):
        await asyncio.wait_for(task, 5)
    assert cancelled.is_set() and cycle.on_disconnect is None


async def test_under_the_servers_protocol_other_outcomes_are_unchanged() -> None:
    cycle = _Cycle()

    async def work() -> str:
        await asyncio.sleep(0.02)
        return "answer"

    assert await cancel_on_disconnect(_served(cycle), work()) == "answer"
    assert cycle.on_disconnect is None and cycle.received == 0
    cycle.lose_connection()  # after the answer: nothing to cancel

    started = asyncio.Event()

    async def waits() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(cancel_on_disconnect(_served(cycle := _Cycle()), waits()))
    await started.wait()
    task.cancel()  # a cancellation the client did not cause (the server stopping) goes on unchanged
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cycle.on_disconnect is None


async def test_a_client_already_gone_is_watched_as_before() -> None:
    class Gone(_Cycle):
        async def receive(self) -> Message:
            self.received += 1
            return {"type": "http.disconnect"}

    cycle = Gone()
    cycle.disconnected = True

    async def work() -> str:
        await asyncio.Event().wait()
        return "never"

    with pytest.raises(Cancelled):
        await asyncio.wait_for(cancel_on_disconnect(_served(cycle), work()), 5)
    assert cycle.received == 1 and cycle.on_disconnect is None  # the watcher read it, after WATCH_AFTER
