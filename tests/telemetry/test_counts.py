"""A process's exact counts (``runtime.telemetry.counts``): histograms, snapshots, and the sum
of several processes' snapshots."""

from __future__ import annotations

import pickle

import pytest

from runtime.telemetry.counts import DURATION_BUCKETS, Histogram, Recorder, merge


def test_a_histogram_counts_a_value_in_the_first_bucket_it_does_not_exceed() -> None:
    histogram = Histogram()
    for value in (0.0, DURATION_BUCKETS[0], 0.0007, DURATION_BUCKETS[-1] + 1):
        histogram.observe(value)
    assert histogram.counts[:2] == [2, 1] and histogram.counts[-1] == 1
    assert sum(histogram.counts) == 4 and len(histogram.counts) == len(DURATION_BUCKETS) + 1
    assert histogram.sum == pytest.approx(DURATION_BUCKETS[0] + 0.0007 + DURATION_BUCKETS[-1] + 1)
    sizes = Histogram(buckets=3)
    sizes.observe(3, bounds=(1, 2, 4))
    assert sizes.counts == [0, 0, 1, 0]


def _recorder(successes: int) -> Recorder:
    recorder = Recorder()
    counters = recorder.model("m", None)
    counters.success += successes
    counters.rejected["queue_full"] = 1
    counters.duration.observe(0.002)
    recorder.rest_request("POST", "/v2/models/{name}/infer", 200, 0.003)
    method = recorder.grpc_method("unary", "inference.GRPCInferenceService", "ModelInfer")
    method.started += 1
    method.done("OK", 0.004)
    return recorder


def test_counters_are_kept_per_model_version_route_and_method() -> None:
    recorder = _recorder(1)
    assert recorder.model("m", None) is recorder.model("m", "")
    assert recorder.model("m", "2") is not recorder.model("m", None)
    rest = recorder.rest_histogram("POST", "/v2/models/{name}/infer", 200)
    assert rest is recorder.rest[("POST", "/v2/models/{name}/infer", "200")] and sum(rest.counts) == 1


def test_a_snapshot_is_plain_data_and_snapshots_add_up() -> None:
    first, second = _recorder(2).snapshot(), _recorder(3).snapshot()
    assert pickle.loads(pickle.dumps(first)) == first
    total = merge([first, second])
    model = total["models"][("m", "")]
    assert (model["success"], model["rejected"]) == (5, {"queue_full": 2})
    assert sum(model["duration"]["counts"]) == 2 and model["duration"]["sum"] == 0.004
    key = ("unary", "inference.GRPCInferenceService", "ModelInfer")
    assert total["grpc_started"][key] == 2 and total["grpc_handled"][(*key, "OK")] == 2
    assert first["models"][("m", "")]["success"] == 2  # the snapshots themselves are left as they were
    assert merge([]) == {}


def test_a_method_with_no_call_ended_has_no_durations() -> None:
    recorder = Recorder()
    recorder.grpc_method("bidi_stream", "s", "ModelStreamInfer").started += 1
    snapshot = recorder.snapshot()
    assert snapshot["grpc_started"] == {("bidi_stream", "s", "ModelStreamInfer"): 1}
    assert snapshot["grpc_seconds"] == {} and snapshot["grpc_handled"] == {}
