"""What the DataPlane tells the metrics and traces: one call per request, one object per stream.

The DataPlane holds an :class:`Observer` only when metrics or tracing are on; with both off it
holds None and pays nothing. Nothing here changes what a request gets.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ModelNotFound, ModelNotReady, Overloaded, QueueTimeout, ShuttingDown, WorkerLost
from .counts import ModelCounters, Recorder

if TYPE_CHECKING:
    from ..registry import Registry
    from .tracing import Tracing

T = TypeVar("T")

# 503s, by why (the label ``reason`` of model_infer_request_rejected); the most specific class first
REJECTIONS: tuple[tuple[type[Exception], str], ...] = (
    (Overloaded, "overloaded"),
    (QueueTimeout, "queue_timeout"),
    (ModelNotReady, "not_ready"),
    (ShuttingDown, "shutting_down"),
    (WorkerLost, "worker_lost"),
)


def rejection(exc: BaseException) -> str | None:
    for cls, reason in REJECTIONS:
        if isinstance(exc, cls):
            return reason
    return None


class Observer:
    """Counts inference requests and streams per model version, and traces them when asked."""

    def __init__(self, registry: Registry, recorder: Recorder | None, tracing: Tracing | None) -> None:
        self.registry = registry
        self.recorder = recorder
        self.tracing = tracing

    def _counters(self, name: str, version: str | None) -> ModelCounters | None:
        if self.recorder is None:
            return None
        try:  # the version served (the default one when none is named)
            entry = self.registry.find(name, version)
        except ModelNotFound:
            return None  # unknown names are not labels: a client could invent any number of them
        return self.recorder.model(entry.name, entry.version)

    async def infer(self, name: str, version: str | None, call: Coroutine[Any, Any, T]) -> T:
        """Await ``call`` (the DataPlane serving one request), counting and tracing it."""
        counters = self._counters(name, version)
        if counters is None and self.tracing is None:
            return await call
        span = self.tracing.infer_span(name, version) if self.tracing is not None else None
        start = time.perf_counter()
        if counters is not None:
            counters.pending += 1
        try:
            result = await call
        except BaseException as exc:
            if counters is not None:
                counters.failure += 1
                reason = rejection(exc)
                if reason is not None:
                    counters.rejected[reason] = counters.rejected.get(reason, 0) + 1
            if span is not None:
                span.fail(exc)
            raise
        else:
            if counters is not None:
                counters.success += 1
            return result
        finally:
            if counters is not None:
                counters.pending -= 1
                counters.duration.observe(time.perf_counter() - start)
            if span is not None:
                span.end()

    def stream(self, name: str, version: str | None) -> StreamObservation | None:
        counters = self.recorder.model(name, version) if self.recorder is not None else None
        return StreamObservation(counters) if counters is not None else None


class StreamObservation:
    """One stream: its events, and whether the client left it before its end."""

    __slots__ = ("counters", "ended")

    def __init__(self, counters: ModelCounters) -> None:
        self.counters = counters
        self.ended = False
        counters.streams_open += 1
        counters.streams_opened += 1

    def event(self) -> None:
        self.counters.stream_events += 1

    def close(self, cancelled: bool) -> None:
        self.counters.streams_open -= 1
        if cancelled:
            self.counters.streams_cancelled += 1
