"""One request over REST or gRPC (``runtime.client.transport``), against a real server: the same V2
JSON answer either way, every datatype over gRPC's raw contents, refusals and "try later"."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from runtime.client.transport import GrpcTransport, Refused, RestTransport, Transport, TryLater, retry_after
from runtime.settings import ModelSettings
from tests.models import zoo
from tests.servers import serving

pytestmark = pytest.mark.anyio

ECHO = ModelSettings(name="echo", implementation=zoo.Echo, parameters={"version": "2"})
TENSORS = [
    {"name": "f", "datatype": "FP32", "shape": [2, 2], "data": [[1.5, 2.0], [3.0, 4.0]]},
    {"name": "i", "datatype": "INT64", "shape": [3], "data": [-(2**40), 0, 7]},
    {"name": "b", "datatype": "BOOL", "shape": [2], "data": [True, False]},
    {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["héllo", ""]},
    {"name": "h", "datatype": "FP16", "shape": [1], "data": [0.5]},
    {"name": "u", "datatype": "UINT8", "shape": [2], "data": [0, 255]},
]


def _transports(server: Any, model: str = "echo", version: str | None = None) -> list[Transport]:
    rest = RestTransport(f"127.0.0.1:{server.http_port}", model, version, 2, 10.0, {"x-test": "1"})
    grpc = GrpcTransport(f"127.0.0.1:{server.grpc_port}", model, version, 10.0, {"x-test": "1"}, 2**24)
    return [rest, grpc]


async def test_both_transports_give_the_same_answer() -> None:
    async with serving(ECHO) as server:
        answers = []
        for transport in _transports(server, version="2"):
            answers.append(
                await transport.infer({"id": "r1", "inputs": TENSORS[:1], "parameters": {"k": "v"}})
            )
            await transport.close()
    rest, grpc = answers
    assert rest["outputs"] == grpc["outputs"] == [{**TENSORS[0], "data": [1.5, 2.0, 3.0, 4.0]}]
    assert rest["id"] == grpc["id"] == "r1" and rest["model_version"] == grpc["model_version"] == "2"
    assert rest["parameters"]["k"] == grpc["parameters"]["k"] == "v"


async def test_every_datatype_goes_through_grpc_and_back_as_json() -> None:
    async with serving(ECHO) as server:
        _, transport = _transports(server)
        answer = await transport.infer({"inputs": TENSORS, "parameters": {"n": 3, "on": True, "x": 0.5}})
        await transport.close()
    by_name = {o["name"]: o for o in answer["outputs"]}
    assert by_name["f"]["data"] == [1.5, 2.0, 3.0, 4.0] and by_name["f"]["shape"] == [2, 2]
    assert by_name["i"]["data"] == [-(2**40), 0, 7]
    assert by_name["b"]["data"] == [True, False]
    assert by_name["s"]["data"] == ["héllo", ""]
    assert by_name["h"]["data"] == [0.5] and by_name["u"]["data"] == [0, 255]
    assert answer["parameters"] == {"n": 3, "on": True, "x": 0.5}


async def test_a_refusal_is_refused_on_both_transports() -> None:
    async with serving(ECHO) as server:
        for transport in _transports(server, model="nope"):
            with pytest.raises(Refused, match=r"404|NOT_FOUND"):
                await transport.infer({"inputs": TENSORS[:1]})
            await transport.close()
        _, grpc = _transports(server)
        with pytest.raises(Refused, match="cannot be sent over gRPC"):
            await grpc.infer({"inputs": [{"name": "x", "datatype": "BF16", "shape": [1], "data": [1]}]})
        await grpc.close()


async def test_a_server_that_cannot_be_reached_is_tried_later() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed below: nothing listens there
    rest = RestTransport(f"127.0.0.1:{port}", "echo", None, 1, 5.0, {})
    grpc = GrpcTransport(f"127.0.0.1:{port}", "echo", None, 5.0, {}, 2**24)
    for transport in (rest, grpc):
        with pytest.raises(TryLater):
            await transport.infer({"inputs": TENSORS[:1]})
        await transport.close()


def test_retry_after_reads_seconds() -> None:
    assert retry_after("2") == 2.0 and retry_after("0.5") == 0.5
    assert retry_after(None) is None and retry_after("-1") is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
