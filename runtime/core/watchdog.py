"""A watchdog that names the model blocking the event loop.

REST, gRPC, health checks and every model share one event loop: a model's ``async def predict``
that computes without awaiting holds all of them. The loop ticks a heartbeat; a thread of the
watchdog checks it, and when the loop has not ticked for ``loop_block_warning`` seconds (0.1 by
default, asyncio's ``slow_callback_duration``) it reads the loop thread's stack
(``sys._current_frames``), finds the frame of a served model's own code and logs one warning
naming that model and where it is; a stall in the server's own code is reported once it lasts
``UNNAMED_FACTOR`` times as long. The loop itself pays one timer per tick.
A plain ``def predict`` runs on threads (``runtime.scheduling.executor``) and never blocks the loop.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import CodeType, FrameType

from runtime.model import MLModel

logger = logging.getLogger(__name__)

UNNAMED_FACTOR = 5
"""A stall with no served model's code on the loop's stack is reported once it lasts this many
times the threshold: at asyncio's 0.1 s, imports on first use and full garbage collections would
be reported, which no model author can act on."""


def _own_code(model: MLModel) -> Iterable[CodeType]:
    """The code objects of the functions a model's class and its bases (but MLModel) define."""
    for cls in type(model).__mro__:
        if cls is MLModel or cls is object:
            continue
        for value in vars(cls).values():
            function = getattr(value, "__func__", value)
            code = getattr(function, "__code__", None)
            if isinstance(code, CodeType):
                yield code


def culprit(frame: FrameType | None, models: Iterable[MLModel]) -> tuple[str, str] | None:
    """The name of the model whose code runs in ``frame``'s stack, and where (innermost frame)."""
    owners: dict[CodeType, list[str]] = {}
    for model in models:
        for code in _own_code(model):
            owners.setdefault(code, []).append(model.name)
    innermost = frame
    while frame is not None:
        names = owners.get(frame.f_code)
        if names:
            assert innermost is not None
            where = f"{innermost.f_code.co_filename}:{innermost.f_lineno} in {innermost.f_code.co_name}"
            return " or ".join(repr(n) for n in sorted(set(names))), where
        frame = frame.f_back
    return None


class LoopWatchdog:
    """Warns, once per stall, when the event loop has not run for ``threshold`` seconds."""

    def __init__(self, threshold: float, models: Callable[[], Iterable[MLModel]]) -> None:
        self.threshold = threshold
        self.models = models
        self.interval = min(threshold / 4, 0.1)
        self._beat = time.monotonic()
        self._reported = False
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    def start(self) -> None:
        """Start watching the running loop (call from inside it)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join()

    def _tick(self) -> None:
        self._beat = time.monotonic()
        self._reported = False
        assert self._loop is not None
        self._timer = self._loop.call_later(self.interval, self._tick)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            blocked = time.monotonic() - self._beat
            if blocked < self.threshold or self._reported:
                continue
            try:
                found = culprit(sys._current_frames().get(self._loop_thread), list(self.models()))
            except Exception:  # the loop changed what we read: report without a name
                found = None
            if found is None:
                # the server's own work (an import on first use, a full collection): looked at
                # again while the stall lasts, reported only once it is long
                if blocked >= self.threshold * UNNAMED_FACTOR:
                    self._reported = True
                    logger.warning("The event loop has been blocked for %.2fs", blocked)
            else:
                self._reported = True
                logger.warning(
                    "The event loop has been blocked for %.2fs by model %s (at %s): a model's async code "
                    "must not compute without awaiting; use a plain `def predict` (run on threads) or "
                    "run_in_executor",
                    blocked,
                    *found,
                )
