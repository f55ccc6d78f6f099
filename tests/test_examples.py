"""The bundled examples run as the README says."""

from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT
from .servers import RunningServer


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
