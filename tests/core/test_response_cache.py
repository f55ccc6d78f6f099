"""The response cache: keys, the memory LRU, hits through REST and gRPC that never reach the
model, and a hit on a second replica through a real redis-server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from runtime.core.management_key import ManagementKey
from runtime.core.response_cache import MemoryCache, answer_from, make_cache, request_digest
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.server.serving import Server
from runtime.tensors import input_array
from runtime.types import InferenceRequest, InferenceResponse
from tests.many_models import answer, body, metric, serving_repository, write_model
from tests.models.ballast import Ballast


def prepared(**request: object) -> InferenceRequest:
    """A request as the DataPlane's checks leave it: its inputs numpy arrays."""
    parsed = InferenceRequest.model_validate(request)
    for inp in parsed.inputs:
        inp.data = input_array(inp)
    return parsed


X = {"name": "x", "shape": [2], "datatype": "FP64", "data": [1.0, 2.0]}


def test_the_key_is_the_request_without_its_id() -> None:
    base = request_digest(prepared(id="a", inputs=[X]))
    assert base is not None
    assert request_digest(prepared(id="b", inputs=[X])) == base
    assert request_digest(prepared(inputs=[{**X, "data": [1.0, 3.0]}])) != base
    assert request_digest(prepared(inputs=[{**X, "shape": [2, 1]}])) != base
    assert request_digest(prepared(inputs=[{**X, "datatype": "FP32"}])) != base
    assert request_digest(prepared(inputs=[{**X, "name": "z"}])) != base
    assert request_digest(prepared(inputs=[X], outputs=[{"name": "y"}])) != base
    assert request_digest(prepared(inputs=[X], parameters={"temperature": 1})) != base
    words = {"name": "t", "shape": [2], "datatype": "BYTES", "data": ["ab", "c"]}
    assert request_digest(prepared(inputs=[words])) != request_digest(
        prepared(inputs=[{**words, "data": ["a", "bc"]}])
    )


def test_sequence_steps_are_never_cached() -> None:
    assert request_digest(prepared(inputs=[X], parameters={"sequence_id": 7})) is None
    assert request_digest(prepared(inputs=[X], parameters={"sequence_start": True})) is None


async def test_the_memory_cache_is_an_lru_and_drops_a_model() -> None:
    cache = make_cache("memory", 2, 60)
    assert isinstance(cache, MemoryCache)
    answer_ = InferenceResponse(model_name="m", id="first", outputs=[])
    await cache.put("m", None, "k1", answer_)
    await cache.put("m", None, "k2", answer_)
    assert await cache.get("m", None, "k1") is answer_  # k1 used last: k2 goes first
    await cache.put("n", "1", "k3", answer_)
    assert await cache.get("m", None, "k2") is None
    assert cache.hits == {("m", ""): 1} and cache.misses == {("m", ""): 1}
    await cache.drop("m", None)
    assert len(cache) == 1 and await cache.get("n", "1", "k3") is answer_
    copy = answer_from(answer_)
    assert copy.id is None and copy.outputs is not answer_.outputs
    assert make_cache("", 1, 1) is None


def model(server: Server, name: str) -> Ballast:
    instance = server.registry.find(name).model
    assert isinstance(instance, Ballast)
    return instance


def grpc_infer(server: Server, name: str, x: float, request_id: str) -> tuple[str, float]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(
            pb.ModelInferRequest(
                model_name=name,
                id=request_id,
                inputs=[
                    pb.ModelInferRequest.InferInputTensor(
                        name="x",
                        datatype="FP64",
                        shape=[1],
                        contents=pb.InferTensorContents(fp64_contents=[x]),
                    )
                ],
            )
        )
    out = reply.outputs[0]
    values = (
        list(out.contents.fp64_contents) or np.frombuffer(reply.raw_output_contents[0], np.float64).tolist()
    )
    return reply.id, float(values[0])


async def test_a_hit_answers_with_its_own_id_without_calling_the_model(tmp_path: Path) -> None:
    import asyncio

    write_model(tmp_path, "cached", k=10, extra={"mib": 1}, response_cache=True)
    write_model(tmp_path, "plain", k=20, extra={"mib": 1})
    async with serving_repository(tmp_path, response_cache="memory") as server:
        key = server.dataplane.repository_key
        assert isinstance(key, ManagementKey)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{server.http_port}", headers={"Authorization": f"Bearer {key.key}"}
        ) as http:
            first = await http.post("/v2/models/cached/infer", json=body(1, id="one"))
            second = await http.post("/v2/models/cached/infer", json=body(1, id="two"))
            assert answer(first) == answer(second) == 11
            assert (first.json()["id"], second.json()["id"]) == ("one", "two")
            assert model(server, "cached").calls == 1
            # gRPC shares the entries (a blocking client, off the loop)
            got = await asyncio.to_thread(grpc_infer, server, "cached", 1.0, "three")
            assert got == ("three", 11.0)
            assert model(server, "cached").calls == 1
            # an error is never cached; a model without response_cache is never cached
            for _ in range(2):  # the model fails on it both times: its error was not kept
                assert (await http.post("/v2/models/cached/infer", json={"inputs": []})).status_code == 500
            assert model(server, "cached").calls == 3
            for _ in range(2):
                assert answer(await http.post("/v2/models/plain/infer", json=body(1))) == 21
            assert model(server, "plain").calls == 2
            # a reload drops the model's entries
            assert (await http.post("/v2/repository/models/cached/load")).status_code == 200
            assert answer(await http.post("/v2/models/cached/infer", json=body(1))) == 11
            assert model(server, "cached").calls == 1  # the new copy's first call
            scrape = (await http.get(f"http://127.0.0.1:{server.metrics_port}/metrics")).text
            assert metric(scrape, "response_cache_hits_total", model_name="cached") == 2
            assert metric(scrape, "response_cache_misses_total", model_name="cached") == 4


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    from tests.external import redis_server

    with redis_server() as url:
        yield url


async def test_a_hit_on_a_second_replica_through_redis(tmp_path: Path, redis_url: str) -> None:
    pytest.importorskip("redis", reason="the Redis response cache needs the redis client (the redis extra)")
    write_model(tmp_path, "cached", k=10, extra={"mib": 1}, response_cache=True)
    settings = {"response_cache": redis_url, "response_cache_ttl": 30}
    async with (
        serving_repository(tmp_path, **settings) as one,
        serving_repository(tmp_path, **settings) as two,
    ):
        async with httpx.AsyncClient() as http:
            first = await http.post(
                f"http://127.0.0.1:{one.http_port}/v2/models/cached/infer", json=body(4, id="a")
            )
            second = await http.post(
                f"http://127.0.0.1:{two.http_port}/v2/models/cached/infer", json=body(4, id="b")
            )
        assert answer(first) == answer(second) == 14
        assert second.json()["id"] == "b"
        assert model(one, "cached").calls == 1
        assert model(two, "cached").calls == 0  # the second replica answered from Redis
        assert two.registry.cache is not None and two.registry.cache.hits == {("cached", ""): 1}
        await one.registry.load(one.registry.find("cached").settings)  # a reload drops them, for all
        async with httpx.AsyncClient() as http:
            third = await http.post(f"http://127.0.0.1:{two.http_port}/v2/models/cached/infer", json=body(4))
        assert answer(third) == 14 and model(two, "cached").calls == 1
