"""Adaptive batching in a real server process, over REST on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.adaptive_helpers import body
from tests.conftest import TEST_MODELS
from tests.servers import RunningServer, start_server

pytestmark = pytest.mark.anyio

MODEL = "/v2/models/adaptive-rows"


@pytest.fixture(scope="module")
def batching_server() -> Iterator[RunningServer]:
    server = start_server(TEST_MODELS / "adaptive")  # max_batch_size 4, max_batch_time 3 s
    yield server
    assert server.stop() == 0


async def test_a_real_server_batches_callers_and_survives_one_that_disconnects(
    batching_server: RunningServer,
) -> None:
    """Guards: a client that hangs up while its batch forms must not fail or strand the callers
    that share its batch, nor take the server down."""
    async with httpx.AsyncClient(base_url=batching_server.http_url, timeout=30.0) as client:
        responses = await asyncio.gather(
            *(client.post(f"{MODEL}/infer", json=body([[i, -i]], id=f"r{i}")) for i in range(4))
        )
        for i, response in enumerate(responses):
            assert response.status_code == 200, response.text
            doc = response.json()
            assert doc["id"] == f"r{i}"
            assert doc["outputs"][0]["data"] == [i, -i]
            assert doc["parameters"]["batch_size"] == 4
        assert len({r.json()["parameters"]["batch_id"] for r in responses}) == 1

        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{MODEL}/infer", json=body([[99, 99]]), timeout=0.3)
        stayed = await asyncio.gather(
            *(client.post(f"{MODEL}/infer", json=body([[i, i]], id=f"s{i}")) for i in range(3))
        )
        for i, response in enumerate(stayed):
            assert response.status_code == 200, response.text
            assert response.json()["id"] == f"s{i}"
            assert response.json()["outputs"][0]["data"] == [i, i]
        assert (await client.get("/v2/health/ready")).status_code == 200
        meta = (await client.get(MODEL)).json()
        assert meta["parameters"]["scheduler"] == "adaptive"
    assert "Traceback" not in batching_server.read_log()


def test_grpc_callers_share_a_batch_and_get_their_own_rows(batching_server: RunningServer) -> None:
    """The same batching over gRPC (tritonclient's client): four concurrent callers, one batch."""
    client = grpcclient.InferenceServerClient(batching_server.grpc_address)
    results: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: grpcclient.InferResult, error: InferenceServerException | None) -> None:
        results.append((result, error))
        if len(results) == 4:
            done.set()

    for i in range(4):
        inp = grpcclient.InferInput("x", [1, 2], "FP32")
        inp.set_data_from_numpy(np.array([[i, -i]], dtype=np.float32))
        client.async_infer("adaptive-rows", [inp], callback, request_id=f"g{i}")
    assert done.wait(60)
    seen = {}
    for result, error in results:
        assert error is None, error
        response = result.get_response()
        seen[response.id] = result.as_numpy("y").tolist()
        assert response.parameters["batch_size"].int64_param == 4
    assert seen == {f"g{i}": [[float(i), float(-i)]] for i in range(4)}
    client.close()
