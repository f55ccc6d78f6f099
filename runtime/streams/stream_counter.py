"""How many streams are running now, and the end of the server's grace period for them.

Every transport's streams are counted here (the DataPlane opens and closes each one), whatever
pipeline serves them; draining waits until none is left, and when the grace period ends the
transports end the streams still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.errors import ShuttingDown


def cut_error() -> ShuttingDown:
    """What a stream still running when the grace period ends is told, on every transport."""
    return ShuttingDown("The server is shutting down: the stream was cut at the end of the grace period")


class StreamCounter:
    """How many streams are running now; ``wait_idle`` returns once none is (tests, draining, gauges).

    It also carries the end of the server's grace period, the one timer for it: ``cut_after`` arms it
    when the server starts draining, and when it ends every ``on_cut`` callback runs, so that a
    transport ends its streams still running with an in-band "shutting down" error before the server
    cuts them, and the server cancels the unary requests still running (their callers get 503).
    """

    def __init__(self) -> None:
        self.active = 0
        self.total = 0
        self._idle: asyncio.Event | None = None
        self.cut = False
        """The grace period has ended: streams still running must end now."""
        self._on_cut: set[Callable[[], None]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def opened(self) -> None:
        self.active += 1
        self.total += 1
        if self._idle is not None:
            self._idle.clear()

    def closed(self) -> None:
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        if self._idle is None:
            self._idle = asyncio.Event()
        if self.active == 0:
            self._idle.set()
            return
        self._idle.clear()
        await self._idle.wait()

    def cut_after(self, seconds: float) -> None:
        """Cut the streams still running ``seconds`` from now (the server's grace period)."""
        if self._timer is None and not self.cut:
            self._timer = asyncio.get_running_loop().call_later(max(seconds, 0.0), self.cut_now)

    def cut_now(self) -> None:
        self.cut = True
        callbacks, self._on_cut = self._on_cut, set()
        for callback in callbacks:
            callback()

    def on_cut(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when the streams are cut (at once if they are); returns its removal."""
        if self.cut:
            callback()
            return _nothing
        self._on_cut.add(callback)
        return lambda: self._on_cut.discard(callback)


def _nothing() -> None:
    pass
