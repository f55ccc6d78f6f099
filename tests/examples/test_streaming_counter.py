"""TorchServe's sequence continuous batching example (examples/sequences/streaming-counter) over REST and gRPC.

The server runs on a copy of the example whose streams are long (200 steps of 100 ms), so that a
stream that stops at the cancel could not have stopped by itself in the time the test takes.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.conftest import ROOT
from tests.servers import RunningServer, start_server

EXAMPLE = ROOT / "examples" / "sequences" / "streaming-counter"
CLIENT = ROOT / "examples" / "clients" / "streaming_counter_client.py"
CHUNKS = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("streaming-counter") / "streaming-counter"
    shutil.copytree(EXAMPLE, folder)
    settings = json.loads((folder / "model-settings.json").read_text())
    settings["parameters"]["extra"]["stream_chunks"] = CHUNKS
    (folder / "model-settings.json").write_text(json.dumps(settings))
    running = start_server(folder)
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def client() -> ModuleType:
    spec = importlib.util.spec_from_file_location("streaming_counter_client", CLIENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(log: list[tuple[str, int, str | None]]) -> None:
    """The update shows in the running stream, and the cancel stops it long before its end."""
    assert log[0] == ("start x=2", 2, "length")
    stream = [(total, finish) for label, total, finish in log if label == "stream x=5"]
    assert stream[0] == (7, None)  # 2 + 5
    assert ("update x=4", 11, "length") in log and ("cancel x=-1", -1, "cancel") in log
    assert (11, None) in stream  # the update reached the model while the stream was running
    assert stream[-1][1] == "cancelled" and len(stream) < CHUNKS  # the cancel did too, and stopped it
    assert stream.index((11, None)) > 0 and all(finish is None for _, finish in stream[:-1])
    label, total, finish = log[-1]
    assert label.startswith("end x=0") and (total, finish) == (11, "end")


def test_the_cancel_stops_a_running_stream_over_rest(server: RunningServer, client: ModuleType) -> None:
    log = client.over_rest(server.http_url)
    check(log)
    assert log[-1][0] == "end x=0 (sequence_end=true)"


def test_the_cancel_stops_a_running_stream_over_grpc(server: RunningServer, client: ModuleType) -> None:
    """Every request of the sequence on one ModelStreamInfer call: the call is read ahead, so the
    update and the cancel join the batch while the stream they act on still runs."""
    check(client.over_grpc(server.grpc_address))


def test_the_client_script(server: RunningServer) -> None:
    run = subprocess.run(
        [sys.executable, str(CLIENT), "--url", server.http_url, "--grpc", server.grpc_address],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert run.stdout.count("(cancelled)") == 2 and run.stdout.count("(end)") == 2, run.stdout


def test_requests_outside_a_sequence_are_refused(server: RunningServer, client: ModuleType) -> None:
    import httpx

    response = httpx.post(
        f"{server.http_url}/v2/models/streaming-counter/infer", json=client.body(3), timeout=30
    )
    assert response.status_code == 400 and "serves only sequences" in response.json()["error"]
