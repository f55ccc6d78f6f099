"""Triton's ``nv_inference_*`` families, family by family, as Triton's core counts them.

Triton (core: ``InferenceStatsAggregator::UpdateSuccess`` / ``UpdateFailure`` /
``UpdateInferBatchStats``, ``MetricModelReporter``) counts a request that succeeded in
``nv_inference_request_success``, adds its batch items to ``nv_inference_count`` and its request,
queue and compute times to the duration counters; a batch execution that served at least one
request adds 1 to ``nv_inference_exec_count``. A failed request adds 1 to
``nv_inference_request_failure`` under its ``reason`` (REJECTED, CANCELED, BACKEND, OTHER, every
one present from the start) and to nothing else. Each family is checked with batching off (the
direct scheduler: one request, one inference, one execution) and on (adaptive batching: a batch's
inferences are its rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
import pytest

from runtime.settings import ModelSettings
from tests.adaptive_helpers import body, row_settings
from tests.frontends.telemetry.test_metrics import Samples, scrape, value
from tests.models import zoo
from tests.servers import serving

pytestmark = pytest.mark.anyio

REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
BAD = -1.0
"""A value the row model fails on (``fail_on``): the model raises, a BACKEND failure."""

MODELS = (
    row_settings("plain", max_batch_size=1, extra={"fail_on": BAD}),  # batching off
    row_settings("batched", max_batch_size=4, max_batch_time=30, extra={"fail_on": BAD}),
    ModelSettings(name="raising", implementation=zoo.Raising),
    row_settings("slow", max_batch_size=2, max_batch_time=30, max_queue_size=4, queue_timeout=0.2),
)


def nv(samples: Samples, family: str, model: str) -> float:
    return value(samples, family, model=model, version="")


def failures(samples: Samples, model: str) -> dict[str, float]:
    return {
        reason: value(samples, "nv_inference_request_failure", model=model, version="", reason=reason)
        for reason in REASONS
    }


@pytest.fixture(scope="module")
async def samples() -> Samples:
    """One server, a known mix of requests, one scrape."""
    async with serving(*MODELS) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as client:

            async def infer(model: str, rows: Sequence[Sequence[float]]) -> int:
                doc = body([list(row) for row in rows])
                return (await client.post(f"/v2/models/{model}/infer", json=doc)).status_code

            # batching off: 3 requests of 2 rows succeed, 2 make the model fail, 1 is refused (400)
            assert [await infer("plain", [[1, 1], [2, 2]]) for _ in range(3)] == [200] * 3
            assert [await infer("plain", [[BAD, 1], [2, 2]]) for _ in range(2)] == [500] * 2
            bad_shape = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}
            assert (await client.post("/v2/models/plain/infer", json=bad_shape)).status_code == 400
            # batching on: a batch of 4 requests holding 1 + 2 + 3 + 2 rows succeeds;
            # then a batch of 4 requests (5 rows) fails, the model raising on one of them
            good: list[list[list[float]]] = [
                [[1, 1]],
                [[1, 1], [2, 2]],
                [[1, 1], [2, 2], [3, 3]],
                [[4, 4], [5, 5]],
            ]
            assert await asyncio.gather(*(infer("batched", rows) for rows in good)) == [200] * 4
            bad: list[list[list[float]]] = [[[1, 1]], [[BAD, 1], [2, 2]], [[1, 1]], [[1, 1]]]
            assert await asyncio.gather(*(infer("batched", rows) for rows in bad)) == [500] * 4
            # a model that always fails
            assert (await infer("raising", [[1, 1]])) == 500
            # a request that times out in the adaptive queue (REJECTED), then two that form a batch
            assert (await infer("slow", [[1, 1]])) == 503
            assert list(await asyncio.gather(infer("slow", [[1, 1]]), infer("slow", [[2, 2]]))) == [200, 200]
        assert server.metrics_port is not None
        return await scrape(server.metrics_port)


async def test_success_counts_requests_that_succeeded(samples: Samples) -> None:
    assert nv(samples, "nv_inference_request_success", "plain") == 3
    assert nv(samples, "nv_inference_request_success", "batched") == 4
    assert nv(samples, "nv_inference_request_success", "raising") == 0
    assert nv(samples, "nv_inference_request_success", "slow") == 2


async def test_failure_counts_failed_requests_by_reason(samples: Samples) -> None:
    assert failures(samples, "plain") == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 2, "OTHER": 1}
    assert failures(samples, "batched") == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 4, "OTHER": 0}
    assert failures(samples, "raising") == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert failures(samples, "slow") == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}


async def test_inference_count_counts_the_batch_items_of_successful_requests(samples: Samples) -> None:
    # without batching a request is one inference (Triton: request, inference and execution
    # counts are equal); with batching, the rows each request held
    assert nv(samples, "nv_inference_count", "plain") == 3
    assert nv(samples, "nv_inference_count", "batched") == 1 + 2 + 3 + 2
    assert nv(samples, "nv_inference_count", "raising") == 0
    assert nv(samples, "nv_inference_count", "slow") == 2


async def test_exec_count_counts_executions_that_served_requests(samples: Samples) -> None:
    assert nv(samples, "nv_inference_exec_count", "plain") == 3
    assert nv(samples, "nv_inference_exec_count", "batched") == 1
    assert nv(samples, "nv_inference_exec_count", "raising") == 0
    assert nv(samples, "nv_inference_exec_count", "slow") == 1


@pytest.mark.parametrize(
    "family",
    [
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
    ],
)
async def test_durations_add_up_successful_requests_only(samples: Samples, family: str) -> None:
    assert nv(samples, family, "raising") == 0  # only failures: nothing timed
    assert nv(samples, family, "batched") > 0
    if family != "nv_inference_queue_duration_us":  # the direct scheduler does not queue
        assert nv(samples, family, "plain") > 0
    assert nv(samples, "nv_inference_queue_duration_us", "plain") == 0


async def test_the_request_duration_is_at_least_its_queue_and_compute_time(samples: Samples) -> None:
    for model in ("plain", "batched", "slow"):
        request = nv(samples, "nv_inference_request_duration_us", model)
        queue = nv(samples, "nv_inference_queue_duration_us", model)
        compute = nv(samples, "nv_inference_compute_infer_duration_us", model)
        assert request >= queue + compute - 2, model  # each rounded to microseconds
