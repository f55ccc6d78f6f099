"""Server readiness (REST, gRPC ServerReady, grpc.health.v1) is strict, as Triton's: every model
asked for at startup must be ready; and it turns to "not ready" first when the server drains."""

from __future__ import annotations

import json
import shutil
import signal
import threading
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.conftest import TEST_MODELS
from tests.servers import RunningServer, launch_server, start_server, start_servers

REPO = TEST_MODELS / "repo"


def _readiness(server: RunningServer) -> tuple[int, bool, int]:
    """(REST status, gRPC ServerReady, grpc.health status) of a running server."""
    rest = httpx.get(f"{server.http_url}/v2/health/ready", timeout=30).status_code
    with grpc.insecure_channel(server.grpc_address) as channel:
        ready = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel).ServerReady(
            pb.ServerReadyRequest(), timeout=30
        )
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    return rest, ready.ready, health.status


NOT_READY = (503, False, health_pb2.HealthCheckResponse.NOT_SERVING)
READY = (200, True, health_pb2.HealthCheckResponse.SERVING)


def _folder(tmp_path: Path, *models: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for model in models:
        shutil.copytree(REPO / model, repo / model)
    return repo


@pytest.mark.parametrize(
    "models",
    [("typed", "failing"), ("failing",), (), ("typed", "not-json")],
    ids=["one-failed", "all-failed", "empty", "unreadable-settings"],
)
def test_the_server_is_not_ready_unless_every_model_asked_for_is(tmp_path: Path, models: tuple[str]) -> None:
    repo = _folder(tmp_path, *models)
    # the strict and the relaxed server start side by side
    server, relaxed = start_servers(launch_server(repo), launch_server(repo, "--no-strict-readiness"))
    try:
        assert _readiness(server) == NOT_READY
        assert httpx.get(f"{server.http_url}/v2/health/live").status_code == 200
        assert _readiness(relaxed) == READY
        # the answer and the log say why (the model that failed, or the folder that is unreadable)
        why = httpx.get(f"{server.http_url}/v2/health/ready").json()["error"]
        expected = "'failing'" if "failing" in models else "not-json" if models else "no model is loaded"
        assert why.startswith("The server is not ready: ") and expected in why, why
        server.wait_for_log("Serving, but not ready: ")
    finally:
        relaxed.stop()
        assert server.stop() == 0


def test_readiness_follows_the_repository_api(tmp_path: Path) -> None:
    repo = _folder(tmp_path, "typed", "failing")
    server = start_server(repo)
    try:
        assert _readiness(server) == NOT_READY
        unload = httpx.post(
            f"{server.http_url}/v2/repository/models/failing/unload",
            headers=server.authorization(),
            timeout=30,
        )
        assert unload.status_code == 200
        assert _readiness(server) == READY
    finally:
        server.stop()


def test_an_empty_repository_is_ready_when_models_come_through_the_api(tmp_path: Path) -> None:
    repo = _folder(tmp_path)
    server = start_server(repo, "--no-load-models-at-startup")
    try:
        assert _readiness(server) == READY
    finally:
        server.stop()


def test_all_models_ready_is_ready(tmp_path: Path) -> None:
    repo = _folder(tmp_path, "typed")
    (repo / "settings.json").write_text(json.dumps({"strict_readiness": True}))
    server = start_server(repo)
    try:
        assert _readiness(server) == READY
    finally:
        server.stop()


def test_readiness_says_no_while_draining_and_in_flight_work_completes(tmp_path: Path) -> None:
    repo = _folder(tmp_path, "slow")
    server = start_server(repo, "--drain-delay", "30", "--shutdown-grace-period", "30")
    results: list[httpx.Response] = []
    body = {"inputs": [{"name": "s", "shape": [1], "datatype": "FP64", "data": [4.0]}]}

    def call() -> None:
        results.append(httpx.post(f"{server.http_url}/v2/models/slow/infer", json=body, timeout=60))

    thread = threading.Thread(target=call)
    try:
        assert _readiness(server) == READY
        thread.start()
        server.wait_for_log("slow model holds a request")
        server.process.send_signal(signal.SIGTERM)
        server.wait_for_log("Not ready; closing the listeners")
        # the listeners still take connections: readiness says no, the request in flight goes on
        assert _readiness(server) == NOT_READY
        assert thread.is_alive()  # the request is still in flight (it takes 4 s)
        refused = httpx.post(f"{server.http_url}/v2/models/slow/infer", json=body, timeout=30)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
        thread.join(60)
        assert results and results[0].status_code == 200
        assert _readiness(server) == NOT_READY
    finally:
        assert server.stop(signal.SIGINT, timeout=60) == 0  # a second signal ends the delay


def test_without_a_drain_delay_the_listeners_stay_open_while_work_is_in_flight(tmp_path: Path) -> None:
    """Triton's drain: readiness says no at once, and connections are still taken (refused work
    gets 503) until what is in flight ends; then the server exits without waiting longer."""
    repo = _folder(tmp_path, "slow")
    server = start_server(repo, "--shutdown-grace-period", "30")
    results: list[httpx.Response] = []
    body = {"inputs": [{"name": "s", "shape": [1], "datatype": "FP64", "data": [3.0]}]}

    def call() -> None:
        results.append(httpx.post(f"{server.http_url}/v2/models/slow/infer", json=body, timeout=60))

    thread = threading.Thread(target=call)
    try:
        thread.start()
        server.wait_for_log("slow model holds a request")
        server.process.send_signal(signal.SIGTERM)
        server.wait_for_log("the listeners stay open until they end")
        assert _readiness(server) == NOT_READY
        refused = httpx.post(f"{server.http_url}/v2/models/slow/infer", json=body, timeout=30)
        assert refused.status_code == 503 and "Retry-After" in refused.headers
        assert "shutting down" in refused.json()["error"]
        thread.join(60)
        assert results and results[0].status_code == 200
        assert server.process.wait(30) == 0  # nothing in flight any more: it goes on to exit
    finally:
        server.stop(timeout=30)
