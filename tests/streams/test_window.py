"""The one read-ahead window (runtime.streams.window), on its own: read ahead up to its size,
answers in the order put, the end after every open request, a failing read, the bound, close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from runtime.streams.window import BUFFERED, READ_AHEAD, Window, stop_tasks

pytestmark = pytest.mark.anyio


class Source:
    """Requests 0..n-1, counting how many were pulled; raises ``fail`` after them when given."""

    def __init__(self, n: int, fail: Exception | None = None) -> None:
        self.n = n
        self.fail = fail
        self.pulled = 0
        self.closed = False

    async def requests(self) -> AsyncGenerator[int, None]:
        try:
            for k in range(self.n):
                self.pulled += 1
                yield k
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)  # give a (wrong) eager reader every chance to read on


async def test_it_reads_no_further_than_its_size_and_reads_on_as_requests_finish() -> None:
    source = Source(10)
    window: Window[int, str] = Window(size=3)

    async def admit(k: int) -> None:
        window.opened(k)

    window.read(source.requests(), admit)
    await settle()
    assert (source.pulled, list(window.open)) == (3, [0, 1, 2])
    window.finished(1)  # any one finishing makes room for one more, not only the oldest
    await settle()
    assert (source.pulled, list(window.open)) == (4, [0, 2, 3])
    await window.close()
    assert source.pulled == 4


async def test_answers_come_in_the_order_put_and_the_end_after_every_open_request() -> None:
    window: Window[int, str] = Window()

    async def admit(k: int) -> None:
        window.opened(k)
        window.push(f"read {k}")

    async def finish_later() -> None:
        await settle()
        for k in (2, 0, 1):  # out of order: the end still waits for the last of them
            window.push(f"done {k}")
            window.finished(k)

    window.read(Source(3).requests(), admit)
    finisher = asyncio.create_task(finish_later())
    answers = [answer async for answer in window]
    await finisher
    assert answers == ["read 0", "read 1", "read 2", "done 2", "done 0", "done 1"]


async def test_requests_answered_at_once_end_the_window_when_the_requests_end() -> None:
    window: Window[int, int] = Window()

    async def admit(k: int) -> None:
        window.push(k * 10)  # answered at once: never open

    window.read(Source(4).requests(), admit)
    assert [answer async for answer in window] == [0, 10, 20, 30]
    assert not window.reading and not window.open


async def test_a_failing_read_is_raised_after_what_was_read_is_answered() -> None:
    window: Window[int, str] = Window()

    async def admit(k: int) -> None:
        window.opened(k)

    window.read(Source(2, fail=ConnectionError("the transport could not read")).requests(), admit)
    await settle()
    assert list(window.open) == [0, 1]
    window.push("answer 0")
    window.finished(0)
    window.push("answer 1")
    window.finished(1)
    got = []
    with pytest.raises(ConnectionError, match="could not read"):
        async for answer in window:
            got.append(answer)
    assert got == ["answer 0", "answer 1"]


async def test_put_waits_while_bound_answers_are_unread() -> None:
    window: Window[int, int] = Window(bound=2)
    put: list[int] = []

    async def producer() -> None:
        for k in range(5):
            await window.put(k)
            put.append(k)

    task = asyncio.create_task(producer())
    await settle()
    assert put == [0, 1]  # the third waits for the consumer
    assert await anext(window) == 0
    await settle()
    assert put == [0, 1, 2]
    assert [await anext(window) for _ in range(4)] == [1, 2, 3, 4]
    await task


async def test_close_stops_the_reader_and_the_tasks_it_is_given() -> None:
    source = Source(100)
    window: Window[asyncio.Task[None], str] = Window(size=2)
    started = asyncio.Event()

    async def serve() -> None:
        started.set()
        await asyncio.Event().wait()  # runs until cancelled

    async def admit(k: int) -> None:
        task = asyncio.create_task(serve())
        window.opened(task)
        task.add_done_callback(window.finished)

    requests = source.requests()
    window.read(requests, admit)
    await started.wait()
    await settle()
    tasks = list(window.open)
    await window.close(*tasks)
    assert all(task.cancelled() for task in tasks)
    await requests.aclose()  # the reader is out of the requests' iterator: its owner may close it
    assert source.closed and source.pulled == 2
    assert not window.open and len(window) == 0


async def test_finishing_what_is_not_open_does_nothing() -> None:
    window: Window[str, str] = Window()
    window.finished("never opened")
    window.opened("a")
    window.finished("a")
    window.finished("a")
    assert len(window) == 0  # a window that reads nothing never ends: a unary call keeps its own


async def test_stop_tasks_waits_for_every_task_it_cancels() -> None:
    cleaned: list[int] = []

    async def holds(k: int) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # a cleanup that itself awaits
            cleaned.append(k)

    tasks = [asyncio.create_task(holds(k)) for k in range(3)]
    await settle()
    await stop_tasks(*tasks)
    assert sorted(cleaned) == [0, 1, 2]


def test_a_window_reads_ahead_by_default_and_bounds_only_when_asked() -> None:
    window: Window[int, int] = Window()
    assert (window.size, window.bound) == (READ_AHEAD, None)
    assert Window(bound=BUFFERED).bound == BUFFERED
