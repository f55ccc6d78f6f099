"""The real server process: CLI, repository loading, settings sources and clean shutdown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.settings import Settings
from runtime.version import __version__
from tests.conftest import TEST_MODELS
from tests.servers import RunningServer, start_server

REPO = TEST_MODELS / "repo"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args], capture_output=True, text=True, timeout=60
    )


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"mlserver-like {__version__}"


def test_help_documents_every_flag() -> None:
    result = run_cli("start", "--help")
    assert result.returncode == 0
    for name in ("http_port", "grpc_port", "host", "max_request_size", "shutdown_grace_period"):
        flag = "--" + name.replace("_", "-")
        assert flag in result.stdout
        first_words = " ".join((Settings.model_fields[name].description or "").split()[:3])
        assert first_words in " ".join(result.stdout.split())


def test_missing_folder_is_a_clear_error() -> None:
    result = run_cli("start", "/nonexistent/models")
    assert result.returncode == 2 and "does not exist" in result.stderr


@pytest.fixture(scope="module")
def repo_server() -> Iterator[RunningServer]:
    server = start_server(REPO)
    yield server
    server.stop()


def test_repository_is_searched_recursively_and_failures_are_isolated(repo_server: RunningServer) -> None:
    url = repo_server.http_url
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    response = httpx.post(f"{url}/v2/models/summer/infer", json=body)
    assert response.status_code == 200 and response.json()["outputs"][0]["data"] == [6.0]
    assert httpx.get(f"{url}/v2/models/typed/ready").status_code == 200
    failing = httpx.get(f"{url}/v2/models/failing/ready")
    assert failing.status_code == 503 and "weights file is corrupt" in failing.json()["error"]
    # strict readiness: a model asked for failed, so the server as a whole is not ready
    assert httpx.get(f"{url}/v2/health/ready").status_code == 503
    log = repo_server.read_log()
    assert "failing" in log and "weights file is corrupt" in log
    assert "not-json" in log and "cannot read" in log


def test_versions_from_folders(repo_server: RunningServer) -> None:
    meta = httpx.get(f"{repo_server.http_url}/v2/models/versioned").json()
    assert meta["versions"] == ["1", "2"]


def test_sigterm_drains_in_flight_requests_then_exits_zero() -> None:
    server = start_server(REPO)
    results: list[httpx.Response] = []
    body = {"inputs": [{"name": "s", "shape": [1], "datatype": "FP64", "data": [1.0]}]}

    def call() -> None:
        results.append(httpx.post(f"{server.http_url}/v2/models/slow/infer", json=body, timeout=30))

    thread = threading.Thread(target=call)
    thread.start()
    server.wait_for_log("slow model holds a request")
    code = server.stop(signal.SIGTERM)
    thread.join(30)
    assert code == 0
    assert results and results[0].status_code == 200
    log = "\n".join(server.log)
    assert "Model 'slow' unloaded" in log and "Server stopped" in log


def test_sigint_exits_zero() -> None:
    server = start_server(REPO)
    assert server.stop(signal.SIGINT) == 0


def test_settings_json_and_env(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "model-settings.json").write_text(json.dumps({"implementation": "tests.models.zoo.Echo"}))
    (tmp_path / "settings.json").write_text(json.dumps({"server_name": "from-file"}))
    server = start_server(tmp_path, env={"MLSERVER_SERVER_VERSION": "9.9-env"})
    try:
        meta = httpx.get(f"{server.http_url}/v2").json()
        assert meta["name"] == "from-file" and meta["version"] == "9.9-env"
        assert httpx.get(f"{server.http_url}/v2/models/m/ready").status_code == 200
    finally:
        assert server.stop() == 0


def test_single_model_from_environment(tmp_path: Path) -> None:
    env = {"MLSERVER_MODEL_NAME": "envmodel", "MLSERVER_MODEL_IMPLEMENTATION": "tests.models.zoo.Echo"}
    server = start_server(tmp_path, env=env)
    try:
        assert httpx.get(f"{server.http_url}/v2/models/envmodel/ready").status_code == 200
    finally:
        server.stop()


def test_a_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_cli(
            "start",
            str(tmp_path),
            "--http-port",
            "0",
            "--grpc-port",
            str(port),
            "--metrics-port",
            "0",
            "--management-port",
            "0",
        )
    assert result.returncode == 1
    assert "Cannot start serving" in result.stderr and "Traceback" not in result.stderr
