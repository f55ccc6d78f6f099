"""Exact counts of one process, in plain Python: the serving path only adds to integers and floats.

A :class:`Recorder`'s :meth:`~Recorder.snapshot` is plain, picklable data, and snapshots of
several processes add up (:func:`merge`); ``runtime.frontends.telemetry.metrics`` turns them into
Prometheus families at scrape time. Nothing here imports a metrics library.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

# seconds, for request durations (MLServer's and the transports')
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

ModelKey = tuple[str, str]

TRITON_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
"""The ``reason`` label of Triton's ``nv_inference_request_failure`` (its core's FailureReason;
``observer.triton_reason`` sorts the errors)."""


class Histogram:
    """Counts per bucket (the last one is +Inf) and the sum of what was observed."""

    __slots__ = ("counts", "sum")

    def __init__(self, buckets: int = len(DURATION_BUCKETS)) -> None:
        self.counts = [0] * (buckets + 1)
        self.sum = 0.0

    def observe(self, value: float, bounds: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.sum += value


class ModelCounters:
    """What the DataPlane counts for one model version."""

    __slots__ = (
        "duration",
        "failed",
        "failure",
        "rejected",
        "stream_events",
        "streams_cancelled",
        "streams_open",
        "streams_opened",
        "success",
        "success_seconds",
    )

    def __init__(self) -> None:
        self.success = 0
        self.success_seconds = 0.0
        """The summed durations of the requests that succeeded (Triton's request duration)."""
        self.failure = 0
        self.failed: dict[str, int] = {}
        """Failures by Triton's reason (REJECTED, CANCELED, BACKEND, OTHER)."""
        self.duration = Histogram()
        self.rejected: dict[str, int] = {}
        self.streams_open = 0
        self.streams_opened = 0
        self.stream_events = 0
        self.streams_cancelled = 0


class MethodCounters:
    """What the gRPC transport counts for one method: calls started, ended by status code, and
    their durations."""

    __slots__ = ("handled", "seconds", "started")

    def __init__(self) -> None:
        self.started = 0
        self.handled: dict[str, int] = {}
        self.seconds = Histogram()

    def done(self, code: str, seconds: float) -> None:
        self.handled[code] = self.handled.get(code, 0) + 1
        self.seconds.observe(seconds)


class Recorder:
    """The counts of one process. Only the event loop's thread writes them."""

    def __init__(self) -> None:
        self.models: dict[ModelKey, ModelCounters] = {}
        self.rest: dict[tuple[str, str, str], Histogram] = {}
        self.grpc: dict[tuple[str, str, str], MethodCounters] = {}

    def model(self, name: str, version: str | None) -> ModelCounters:
        key = (name, version or "")
        counters = self.models.get(key)
        if counters is None:
            counters = self.models[key] = ModelCounters()
        return counters

    def rest_request(self, method: str, path: str, status: int, seconds: float) -> None:
        self.rest_histogram(method, path, status).observe(seconds)

    def rest_histogram(self, method: str, path: str, status: int) -> Histogram:
        """The durations of the REST requests of a method, route and status, to keep and add to."""
        key = (method, path, str(status))
        histogram = self.rest.get(key)
        if histogram is None:
            histogram = self.rest[key] = Histogram()
        return histogram

    def grpc_method(self, kind: str, service: str, method: str) -> MethodCounters:
        """The counters of one gRPC method (``kind``: unary, bidi_stream), to keep and add to."""
        key = (kind, service, method)
        counters = self.grpc.get(key)
        if counters is None:
            counters = self.grpc[key] = MethodCounters()
        return counters

    def snapshot(self) -> dict[str, Any]:
        """Every count, as plain data that pickles and adds up (see :func:`merge`)."""
        return {
            "models": {
                key: {
                    "success": c.success,
                    "success_seconds": c.success_seconds,
                    "failure": c.failure,
                    "failed": dict(c.failed),
                    "duration": _histogram(c.duration),
                    "rejected": dict(c.rejected),
                    "streams_open": c.streams_open,
                    "streams_opened": c.streams_opened,
                    "stream_events": c.stream_events,
                    "streams_cancelled": c.streams_cancelled,
                }
                for key, c in self.models.items()
            },
            "rest": {key: _histogram(h) for key, h in self.rest.items()},
            "grpc_started": {key: c.started for key, c in self.grpc.items()},
            "grpc_handled": {
                (*key, code): n for key, c in self.grpc.items() for code, n in c.handled.items()
            },
            "grpc_seconds": {key: _histogram(c.seconds) for key, c in self.grpc.items() if c.handled},
        }


def _histogram(histogram: Histogram) -> dict[str, Any]:
    return {"counts": list(histogram.counts), "sum": histogram.sum}


def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The sum of several processes' snapshots."""
    total: dict[str, Any] = {}
    for snapshot in snapshots:
        _add(total, snapshot)
    return total


def _add(into: dict[Any, Any], other: dict[Any, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        elif isinstance(value, list):
            mine = into.setdefault(key, [0] * len(value))
            for i, v in enumerate(value):
                mine[i] += v
        else:
            into[key] = into.get(key, 0) + value
