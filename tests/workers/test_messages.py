"""What a server and its workers share about their messages (``runtime.workers.messages``): the
flow control of a stream (``Credit``, ``Inbox``) and exceptions that cross the wire."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.errors import InvalidInput
from runtime.workers.messages import ACK_EVERY, WINDOW, Credit, Inbox, portable

pytestmark = pytest.mark.anyio


async def test_a_sender_stops_after_a_window_until_the_receiver_acknowledges() -> None:
    credit = Credit()
    for _ in range(WINDOW):
        await credit.take()
    blocked = asyncio.create_task(credit.take())
    await asyncio.sleep(0)
    assert not blocked.done()
    credit.give(ACK_EVERY)
    await asyncio.wait_for(blocked, 5)
    assert credit.left == ACK_EVERY - 1


async def test_an_inbox_gives_items_in_order_and_wakes_a_waiting_taker() -> None:
    inbox: Inbox[int] = Inbox()
    inbox.put(1)
    assert await inbox.get() == 1
    waiting = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    inbox.put(2)
    inbox.put(3)
    assert await asyncio.wait_for(waiting, 5) == 2 and await inbox.get() == 3


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = threading.Lock()


def test_an_exception_crosses_as_it_is_or_as_its_type_and_message() -> None:
    error = InvalidInput("bad")
    assert portable(error) is error
    replaced = portable(Unpicklable())
    assert type(replaced) is RuntimeError and str(replaced) == "Unpicklable: holds a lock"
