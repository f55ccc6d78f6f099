"""What the DataPlane tells the metrics (``runtime.core.observer``): requests counted per
model version, 503s by reason, streams and their cancellations (tracing off)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from runtime import errors
from runtime.core.model_table import ModelEntry
from runtime.core.observer import Observer, rejection, triton_reason
from runtime.core.registry import Registry
from runtime.settings import ModelParameters, ModelSettings
from runtime.telemetry.counts import Recorder


class Known:
    """A registry that knows one model version."""

    def __init__(self, entry: ModelEntry) -> None:
        self.entry = entry

    def find(self, name: str, version: str | None = None) -> ModelEntry:
        if name != self.entry.name:
            raise errors.ModelNotFound(name, version)
        return self.entry


def _observer() -> tuple[Observer, Recorder, ModelEntry]:
    entry = ModelEntry(settings=ModelSettings(name="m", parameters=ModelParameters(version="1")))
    recorder = Recorder()
    return Observer(cast(Registry, Known(entry)), recorder, None), recorder, entry


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (errors.Overloaded("full"), "overloaded"),
        (errors.QueueTimeout("late"), "queue_timeout"),
        (errors.ModelNotReady("loading"), "not_ready"),
        (errors.ShuttingDown("draining"), "shutting_down"),
        (errors.WorkerLost("died"), "worker_lost"),
        (errors.ModelFailed("raised"), None),
        (errors.InvalidInput("bad"), None),
    ],
)
def test_a_503_is_counted_by_why(error: errors.ServerError, reason: str | None) -> None:
    assert rejection(error) == reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (asyncio.CancelledError(), "CANCELED"),
        (errors.Cancelled("gone"), "CANCELED"),
        (errors.QueueTimeout("waited"), "REJECTED"),
        (errors.RequestTimeout("took"), "REJECTED"),
        (errors.ModelFailed("raised"), "BACKEND"),
        (errors.WorkerLost("died"), "BACKEND"),
        (errors.InvalidInput("bad"), "OTHER"),
        (errors.Overloaded("full"), "OTHER"),
        (errors.ModelNotReady("loading"), "OTHER"),
    ],
)
def test_a_failure_has_tritons_reason(error: BaseException, reason: str) -> None:
    assert triton_reason(error) == reason


def test_requests_are_counted_per_version_with_their_outcome_and_duration() -> None:
    observer, recorder, entry = _observer()
    first = observer.begin(entry, "m", None)
    second = observer.begin(entry, "m", "1")
    assert first is not None and second is not None
    counters = recorder.model("m", "1")
    Observer.done(first, None)
    Observer.done(second, errors.Overloaded("full"))
    assert (counters.success, counters.failure, counters.failed) == (1, 1, {"OTHER": 1})
    assert counters.rejected == {"overloaded": 1} and sum(counters.duration.counts) == 2
    assert 0 < counters.success_seconds < counters.duration.sum  # the failure's time is not in it


def test_a_refused_request_counts_for_a_known_version_only() -> None:
    observer, recorder, _ = _observer()
    observer.refused("m", None, errors.ModelNotReady("loading"))
    observer.refused("invented", None, errors.ModelNotFound("invented"))
    assert list(recorder.models) == [("m", "1")]
    counters = recorder.model("m", "1")
    assert (counters.failure, counters.failed, counters.rejected) == (1, {"OTHER": 1}, {"not_ready": 1})


def test_with_nothing_to_record_nothing_is_watched() -> None:
    entry = ModelEntry(settings=ModelSettings(name="m"))
    observer = Observer(cast(Registry, Known(entry)), None, None)
    assert observer.begin(entry, "m", None) is None and observer.stream("m", None) is None
    observer.refused("m", None, errors.ShuttingDown("draining"))  # nothing to count it in


def test_a_stream_counts_its_events_and_a_cancellation() -> None:
    observer, recorder, _ = _observer()
    kept, left = observer.stream("m", "1"), observer.stream("m", "1")
    assert kept is not None and left is not None
    counters = recorder.model("m", "1")
    assert (counters.streams_open, counters.streams_opened) == (2, 2)
    kept.event()
    kept.event()
    kept.close(cancelled=False)
    left.close(cancelled=True)
    assert (counters.streams_open, counters.stream_events, counters.streams_cancelled) == (0, 2, 1)
