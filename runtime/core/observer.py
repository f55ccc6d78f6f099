"""What the DataPlane tells the metrics and traces: two calls per request, one object per stream.

The DataPlane holds an :class:`Observer` only when metrics or tracing are on; with both off it
holds None and pays nothing. Nothing here changes what a request gets.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from time import perf_counter
from typing import TYPE_CHECKING, Any

from runtime.errors import (
    Cancelled,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    QueueTimeout,
    RequestTimeout,
    ShuttingDown,
    WorkerLost,
)
from runtime.telemetry.counts import DURATION_BUCKETS, ModelCounters, Recorder

if TYPE_CHECKING:
    from runtime.core.model_table import ModelEntry
    from runtime.core.registry import Registry
    from runtime.telemetry.tracing import Tracing

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


def triton_reason(exc: BaseException) -> str:
    """Triton's reason for a failed request: REJECTED (timed out in the scheduler), CANCELED (the
    client went away or cancelled), BACKEND (the model failed, or its worker died), OTHER (bad
    input, not ready, overloaded, shutting down...)."""
    if isinstance(exc, (asyncio.CancelledError, Cancelled)):
        return "CANCELED"
    if isinstance(exc, RequestTimeout):
        return "REJECTED"
    if isinstance(exc, (ModelFailed, WorkerLost)):
        return "BACKEND"
    return "OTHER"


Watch = tuple[ModelCounters | None, Any, float]
"""One inference request being counted (and traced): its model's counters, its span, its start."""


class Observer:
    """Counts inference requests and streams per model version, and traces them when asked."""

    def __init__(self, registry: Registry, recorder: Recorder | None, tracing: Tracing | None) -> None:
        self.registry = registry
        self.recorder = recorder
        self.tracing = tracing
        self._entry: ModelEntry | None = None
        self._entry_counters: ModelCounters | None = None
        """The counters of the version last served (most requests go to the one before them)."""

    def _counters(self, entry: ModelEntry) -> ModelCounters | None:
        """The counters of ``entry``, the version served."""
        if entry is self._entry:  # a version's name and version never change: its counters neither
            return self._entry_counters
        if self.recorder is None:
            return None
        counters = self.recorder.model(entry.name, entry.version)
        self._entry, self._entry_counters = entry, counters
        return counters

    def begin(self, entry: ModelEntry, name: str, version: str | None) -> Watch | None:
        """What :meth:`done` needs to count and trace one inference request for ``entry`` (asked
        for as ``name`` and ``version``), which starts now; None when there is nothing to do."""
        counters = self._entry_counters if entry is self._entry else self._counters(entry)
        tracing = self.tracing
        if counters is None and tracing is None:
            return None
        return counters, tracing.infer_span(name, version) if tracing is not None else None, perf_counter()

    def refused(self, name: str, version: str | None, error: BaseException) -> None:
        """A request refused before its model took it (``error``: not ready, shutting down, not
        found): a failure of the version it named, if that exists (unknown names are not labels: a
        client could invent any number of them), and a failed span when tracing."""
        try:
            counters = self._counters(self.registry.find(name, version))
        except ModelNotFound:
            counters = None
        if counters is None and self.tracing is None:
            return
        span = self.tracing.infer_span(name, version) if self.tracing is not None else None
        Observer.done((counters, span, perf_counter()), error)

    @staticmethod
    def done(watch: Watch, error: BaseException | None) -> None:
        """The request of ``watch`` was answered (``error``: None) or failed with ``error``."""
        counters, span, start = watch
        if counters is not None:
            seconds = perf_counter() - start
            if error is None:
                counters.success += 1
                counters.success_seconds += seconds
            else:
                counters.failure += 1
                failed = counters.failed
                why = triton_reason(error)
                failed[why] = failed.get(why, 0) + 1
                reason = rejection(error)
                if reason is not None:
                    counters.rejected[reason] = counters.rejected.get(reason, 0) + 1
            duration = counters.duration
            duration.counts[bisect_left(DURATION_BUCKETS, seconds)] += 1
            duration.sum += seconds
        if span is not None:
            if error is not None:
                span.fail(error)
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
