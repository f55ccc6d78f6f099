"""A scheduler's counts of its model executions (``runtime.telemetry.stats``)."""

from __future__ import annotations

from runtime.telemetry.stats import ExecutionStats


def test_each_execution_counts_its_requests_waits_and_model_time_per_request() -> None:
    stats = ExecutionStats()
    stats.executed(4, queued=0.5, compute=1.0)
    stats.executed(1, queued=0.25, compute=0.5)
    stats.executed(4)
    assert (stats.executions, stats.inferences) == (3, 9)
    assert stats.batch_sizes == {4: 2, 1: 1}
    assert stats.queue_seconds == 0.75
    assert stats.compute_seconds == 4.5  # a batch of 4 taking 1 s counts 4 s


def test_a_snapshot_reads_back_and_a_missing_count_is_zero() -> None:
    stats = ExecutionStats()
    stats.executed(2, queued=0.1, compute=0.2)
    snapshot = stats.snapshot()
    back = ExecutionStats.of(snapshot)
    assert back.snapshot() == snapshot
    assert ExecutionStats.of({"batch_sizes": {"8": "3"}}).snapshot() == {
        "executions": 0,
        "inferences": 0,
        "batch_sizes": {8: 3},
        "queue_seconds": 0.0,
        "compute_seconds": 0.0,
    }
    snapshot["batch_sizes"][2] = 99
    assert stats.batch_sizes == {2: 1}  # a snapshot is a copy


def test_the_inferences_of_an_execution_are_its_batch_items_when_given() -> None:
    stats = ExecutionStats()
    stats.executed(2, compute=1.0, items=5)  # two requests holding 5 rows between them
    assert (stats.executions, stats.inferences, stats.batch_sizes) == (1, 5, {2: 1})
    assert stats.compute_seconds == 2.0  # model time is per request
