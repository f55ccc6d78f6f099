"""Sequences on a real server: HTTP/1.1 pipelining on one connection, and a client that disconnects."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import httpx
import orjson
import pytest

from tests.conftest import TEST_MODELS
from tests.servers import RunningServer, start_server


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(TEST_MODELS / "sequences")
    yield running
    running.stop()


def raw_request(address: str, x: int, **params: Any) -> bytes:
    body = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [x]}], "parameters": params}
    )
    head = (
        f"POST /v2/models/recorder/infer HTTP/1.1\r\nHost: {address}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def read_response(stream: Any) -> tuple[int, dict[str, Any]]:
    status = int(stream.readline().split()[1])
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, orjson.loads(stream.read(length))


def connect(server: RunningServer) -> socket.socket:
    host, port = server.http_address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def stats(server: RunningServer) -> dict[str, Any]:
    meta = httpx.get(f"{server.http_url}/v2/models/recorder", timeout=10).json()
    return cast("dict[str, Any]", meta["parameters"]["stats"])


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_pipelined_requests_on_one_connection_keep_their_order(server: RunningServer) -> None:
    """Race: twenty requests of one sequence written at once on one keep-alive connection; each
    must be served after the previous one, in the order written."""
    with connect(server) as conn, conn.makefile("rb") as stream:
        payload = raw_request(server.http_address, 1, sequence_id=7, sequence_start=True)
        payload += b"".join(raw_request(server.http_address, v, sequence_id=7) for v in range(2, 21))
        conn.sendall(payload)
        answers = [read_response(stream) for _ in range(20)]
    assert [status for status, _ in answers] == [200] * 20
    assert [doc["outputs"][0]["data"][0] for _, doc in answers] == [v * (v + 1) // 2 for v in range(1, 21)]
    assert all(doc["parameters"]["sequence_id"] == 7 for _, doc in answers)


def test_a_client_that_disconnects_while_queued_cancels_its_sequence(server: RunningServer) -> None:
    """Race: the HTTP client of a queued request disconnects while an earlier request of the same
    sequence runs. The server must notice the disconnect, drop the queued request before it reaches
    the model, cancel the sequence (later requests get 400 'cancel'), and still answer the running one."""
    url = f"{server.http_url}/v2/models/recorder/infer"
    start = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]}
    assert (
        httpx.post(
            url, json={**start, "parameters": {"sequence_id": "gone", "sequence_start": True}}
        ).status_code
        == 200
    )
    before = stats(server)["ended"]["cancel"]
    with connect(server) as running, running.makefile("rb") as running_stream:
        running.sendall(raw_request(server.http_address, 1, sequence_id="gone", hold_s=1.5))
        wait_for(lambda: stats(server)["running_requests"] == 1)
        queued = connect(server)
        queued.sendall(raw_request(server.http_address, 50, sequence_id="gone"))
        wait_for(lambda: stats(server)["queued_requests"] == 1)
        queued.close()
        wait_for(lambda: stats(server)["queued_requests"] == 0)
        refused = httpx.post(url, json={**start, "parameters": {"sequence_id": "gone"}})
        assert refused.status_code == 400 and "reason: cancel" in refused.json()["error"]
        status, doc = read_response(running_stream)
    assert status == 200 and doc["outputs"][1]["data"] == [1, 1]
    wait_for(lambda: stats(server)["ended"]["cancel"] == before + 1)
    assert httpx.get(f"{server.http_url}/v2/health/ready").status_code == 200
