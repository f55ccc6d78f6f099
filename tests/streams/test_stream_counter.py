"""The count of running streams and the end of the grace period (``runtime.streams.stream_counter``)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import ShuttingDown
from runtime.streams.stream_counter import StreamCounter, cut_error

pytestmark = pytest.mark.anyio


async def test_wait_idle_returns_once_the_last_stream_closes() -> None:
    counter = StreamCounter()
    await asyncio.wait_for(counter.wait_idle(), 5)  # none running: at once
    counter.opened()
    counter.opened()
    waiting = asyncio.create_task(counter.wait_idle())
    counter.closed()
    await asyncio.sleep(0)
    assert not waiting.done()
    counter.closed()
    await asyncio.wait_for(waiting, 5)
    assert (counter.active, counter.total) == (0, 2)


async def test_the_grace_period_runs_every_callback_once_and_late_ones_at_once() -> None:
    counter = StreamCounter()
    calls: list[str] = []
    counter.on_cut(lambda: calls.append("a"))
    forget = counter.on_cut(lambda: calls.append("forgotten"))
    forget()
    cut = asyncio.Event()
    counter.on_cut(cut.set)
    counter.cut_after(0.01)
    counter.cut_after(60)  # the first timer stands
    await asyncio.wait_for(cut.wait(), 5)
    assert counter.cut and calls == ["a"]
    counter.cut_now()  # nothing left to run
    assert calls == ["a"]
    counter.on_cut(lambda: calls.append("late"))
    assert calls == ["a", "late"]


def test_a_cut_stream_is_told_the_server_is_shutting_down() -> None:
    error = cut_error()
    assert isinstance(error, ShuttingDown) and "grace period" in error.message
