"""What the DataPlane tells the metrics and traces: two calls per request, one object per stream.

The DataPlane holds an :class:`Observer` only when metrics or tracing are on; with both off it
holds None and pays nothing. Nothing here changes what a request gets.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import ModelNotFound, ModelNotReady, Overloaded, QueueTimeout, ShuttingDown, WorkerLost
from .counts import ModelCounters, Recorder

if TYPE_CHECKING:
    from ..registry import Registry
    from .tracing import Tracing

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
        self._entry: Any = None
        self._entry_counters: ModelCounters | None = None
        """The counters of the version last served (most requests go to the one before them)."""

    def _counters(self, name: str, version: str | None) -> ModelCounters | None:
        if self.recorder is None:
            return None
        try:  # the version served (the default one when none is named)
            entry = self.registry.find(name, version)
        except ModelNotFound:
            return None  # unknown names are not labels: a client could invent any number of them
        if entry is self._entry:  # a version's name and version never change: its counters neither
            return self._entry_counters
        counters = self.recorder.model(entry.name, entry.version)
        self._entry, self._entry_counters = entry, counters
        return counters

    def begin(self, name: str, version: str | None) -> Watch | None:
        """What :meth:`done` needs to count and trace one inference request, which starts now; None
        when there is nothing to count or trace (an unknown model with tracing off)."""
        counters = self._counters(name, version)
        if counters is None and self.tracing is None:
            return None
        span = self.tracing.infer_span(name, version) if self.tracing is not None else None
        if counters is not None:
            counters.pending += 1
        return Watch(counters, span)

    @staticmethod
    def done(watch: Watch, error: BaseException | None) -> None:
        """The request of ``watch`` was answered (``error``: None) or failed with ``error``."""
        counters, span = watch.counters, watch.span
        if counters is not None:
            if error is None:
                counters.success += 1
            else:
                counters.failure += 1
                reason = rejection(error)
                if reason is not None:
                    counters.rejected[reason] = counters.rejected.get(reason, 0) + 1
            counters.pending -= 1
            counters.duration.observe(time.perf_counter() - watch.start)
        if span is not None:
            if error is not None:
                span.fail(error)
            span.end()

    def stream(self, name: str, version: str | None) -> StreamObservation | None:
        counters = self.recorder.model(name, version) if self.recorder is not None else None
        return StreamObservation(counters) if counters is not None else None


class Watch:
    """One inference request being counted (and traced): its model's counters, its span, its start."""

    __slots__ = ("counters", "span", "start")

    def __init__(self, counters: ModelCounters | None, span: Any) -> None:
        self.counters = counters
        self.span = span
        self.start = time.perf_counter()


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
