"""The bundled examples run as the README says."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from tests.servers import RunningServer


def test_rest_client_example(example_server: RunningServer) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "clients" / "rest_client.py"), example_server.http_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "ready: True" in result.stdout
    assert "scaled:" in result.stdout and "echo:" in result.stdout


def test_counter_client_example(example_server: RunningServer) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "clients" / "counter_client.py"), example_server.http_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "alpha: [1, 2, 3, 0] -> [1, 3, 6, 6] ended=True" in result.stdout
    assert "delta: [7, 0] -> [7, 7] ended=True" in result.stdout  # the one sent with TorchServe headers
    assert "afterwards: 400" in result.stdout and "reason: end" in result.stdout


def test_counter_grpc_client_example(example_server: RunningServer) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "clients" / "counter_grpc.py"), example_server.grpc_address],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "1: [1, 2, 3, 0] -> [1, 3, 6, 6] ended=True" in result.stdout
    assert "'three': [5, 5, 5, 5, 0] -> [5, 10, 15, 20, 20] ended=True" in result.stdout
    assert "INVALID_ARGUMENT" in result.stdout and "reason: end" in result.stdout
