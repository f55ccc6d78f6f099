"""TorchServe's stateful example (sequence continuous batching), unchanged, through TorchServe's REST
headers: the archive is built with torch-model-archiver as its README says and served by a real
server; the client calls are the README's curl commands, written with httpx."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ts", reason="the torchserve extra (pip install -e '.[torchserve]') is not installed")

from tests.servers import RunningServer, start_server
from tests.torchserve.archiver import run_model_archiver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchserve" / "stateful"
SEQ_ID = "ts_request_sequence_id"
SEQ_END = "ts_request_sequence_end"


def build_archive(store: Path) -> None:
    """The README's archiver line (the handler needs no model file; see the example's README)."""
    run_model_archiver(
        "--model-name", "stateful", "--version", "1.0",
        "--handler", str(EXAMPLE / "stateful_handler.py"),
        "-r", str(EXAMPLE / "requirements.txt"), "--config-file", str(EXAMPLE / "model-config.yaml"),
        "--export-path", str(store),
    )  # fmt: skip


@pytest.fixture(scope="module")
def stateful(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("model_store")
    build_archive(store)
    server = start_server(store)
    yield server
    server.stop()


def test_readme_curl_with_a_sequence_id(stateful: RunningServer) -> None:
    """``curl -H "ts_request_sequence_id: seq_0" .../predictions/stateful -T sample1.txt``: a PUT of
    the file, no Content-Type, Expect: 100-continue. The id opens the sequence; 1 is odd, so the
    answer streams the running sum until the sequence's -1 cancels it."""
    url = f"{stateful.http_url}/predictions/stateful"
    headers = {SEQ_ID: "seq_0", "Expect": "100-continue"}
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "PUT", url, content=(EXAMPLE / "sample/sample1.txt").read_bytes(), headers=headers
        ) as r:
            assert r.status_code == 200
            assert r.headers[SEQ_ID] == "seq_0" and r.headers["ts_stream_next"] == "true"
            chunks = r.iter_bytes()
            assert next(chunks) == b"1"
            cancel = client.put(url, content=b"-1", headers={SEQ_ID: "seq_0"})
            assert cancel.status_code == 200 and cancel.text == "-1"
            rest = b"".join(chunks)
        assert set(rest.decode()) <= {"1"}  # the stream ended at the cancel, within a few steps
        two = client.put(
            url, content=(EXAMPLE / "sample/sample2.txt").read_bytes(), headers={SEQ_ID: "seq_0"}
        )
        assert two.text == "3"


def test_sequence_protocol(stateful: RunningServer) -> None:
    """No id: a new sequence (the id comes back); even numbers answer the running sum; an odd one
    streams it until -1 (from another client) cancels; 0 ends the sequence with the end header."""
    url = f"{stateful.http_url}/predictions/stateful"
    with httpx.Client(timeout=30) as client:
        first = client.post(url, content=b"2")
        assert first.status_code == 200 and first.text == "2"
        seq = first.headers[SEQ_ID]
        assert client.post(url, content=b"4", headers={SEQ_ID: seq}).text == "6"
        assert client.post(url, content=b"6", headers={SEQ_ID: seq}).text == "12"
        chunks: list[bytes] = []
        streaming = threading.Event()

        def stream() -> None:
            with client.stream("POST", url, json={"input": 3}, headers={SEQ_ID: seq}) as r:
                assert r.headers["ts_stream_next"] == "true"
                for chunk in r.iter_bytes():
                    chunks.append(chunk)
                    streaming.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert streaming.wait(30)
        with httpx.Client(timeout=30) as other:
            cancel = other.post(url, content=b"-1", headers={SEQ_ID: seq})
        assert cancel.text == "-1"
        reader.join(30)
        assert not reader.is_alive()
        assert chunks[0] == b"15" and len(chunks) <= 12
        end = client.post(url, content=b"0", headers={SEQ_ID: seq})
        assert end.text == "15" and end.headers[SEQ_END] == seq
        after = client.post(url, content=b"2", headers={SEQ_ID: seq})
        assert after.status_code == 400  # an ended sequence is never silently reopened
        assert after.json()["type"] == "BadRequestException"


def cancelled(client: httpx.Client, server: RunningServer) -> int:
    """Sequences of the model ended by a cancellation so far (model metadata's live counters)."""
    meta = client.get(f"{server.http_url}/v2/models/stateful").json()
    return int(meta["parameters"]["sequence_stats"]["ended"]["cancel"])


def test_a_client_that_goes_away_cancels_its_stream(stateful: RunningServer) -> None:
    """Race: the client closes the connection while its answer streams; the server must stop the
    stream (and, as for any request of a sequence its caller gave up on, cancel the sequence),
    not run it to the end for nobody."""
    url = f"{stateful.http_url}/predictions/stateful"
    with httpx.Client(timeout=30) as client:
        seq = client.post(url, content=b"2").headers[SEQ_ID]
        with client.stream("POST", url, json={"input": 3}, headers={SEQ_ID: seq}) as r:
            assert next(r.iter_bytes()) == b"5"
        # the connection is closed; the server counts the sequence as cancelled once it noticed
        deadline = time.monotonic() + 20
        while cancelled(client, stateful) < 1:
            assert time.monotonic() < deadline, "the stream was not cancelled"
        after = client.post(url, content=b"2", headers={SEQ_ID: seq})
        assert after.status_code == 400 and "cancel" in after.json()["message"]
