"""``mlserver-like infer`` (``runtime.client.batch``) against real servers: 10 000 lines answered in
order with errors in their place, a run killed half-way and resumed (nothing answered twice,
nothing lost), gRPC, merged lines, retries after 503 with Retry-After."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from runtime.client.batch import BatchRun, InferOptions, answered_lines, run
from runtime.settings import ModelSettings
from tests.models import zoo
from tests.servers import ROOT, RunningServer, serving, start_server

LINES = 10_000
GARBAGE = {1000 * k + 3 for k in range(10)}  # lines that are not JSON
REFUSED = {777, 5555}  # lines the server refuses (an input the model does not declare)


def _line(i: int) -> bytes:
    if i in GARBAGE:
        return b"{not json"
    name = "nope" if i in REFUSED else "x"
    return orjson.dumps({"inputs": [{"name": name, "datatype": "INT64", "shape": [1, 2], "data": [i, -i]}]})


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("infer") / "requests.jsonl"
    path.write_bytes(b"\n".join(_line(i) for i in range(LINES)) + b"\n")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """An echo model that declares its input (a request with another input is refused, 400)."""
    folder = tmp_path_factory.mktemp("models")
    (folder / "echo").mkdir()
    settings = {
        "implementation": "tests.models.zoo.Echo",
        "inputs": [{"name": "x", "datatype": "INT64", "shape": [-1, 2]}],
        "require_declared_inputs": True,
    }
    (folder / "echo" / "model-settings.json").write_text(json.dumps(settings))
    running = start_server(folder)
    yield running
    running.stop()


def _infer(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", "infer", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )


def _check_output(path: Path, lines: int = LINES) -> None:
    """Line n answers input line n: its echo, or an error where the input was bad."""
    answers = path.read_bytes().splitlines()
    assert len(answers) == lines
    for i, raw in enumerate(answers):
        answer = orjson.loads(raw)
        assert answer["parameters"]["batch_index"] == i
        if i in GARBAGE:
            assert answer["error"].startswith(f"line {i + 1} is not a V2 request")
        elif i in REFUSED:
            assert answer["error"].startswith(("400: ", "INVALID_ARGUMENT: ")) and "nope" in answer["error"]
        else:
            assert answer["outputs"][0]["data"] == [i, -i], answer


def test_ten_thousand_lines_are_answered_in_order_with_errors_in_place(
    server: RunningServer, requests_file: Path, tmp_path: Path
) -> None:
    """Over REST, lines merged ten by ten (a merged request a bad line spoils is sent again line by
    line, so only that line fails)."""
    output = tmp_path / "answers.jsonl"
    infer = _infer(
        "-u", server.http_address, "-m", "echo", "-i", str(requests_file), "-o", str(output),
        "--workers", "16", "--batch-size", "10",
    )  # fmt: skip
    _, err = infer.communicate(timeout=600)
    assert infer.returncode == 1, err  # some lines failed
    _check_output(output)
    summary = err.decode().strip().splitlines()[-1]
    failed = len(GARBAGE) + len(REFUSED)
    assert re.match(
        rf"sent {LINES} lines in \d+ requests .*{LINES - failed} answered, {failed} failed", summary
    )
    assert "req/s" in summary and "\r" not in err.decode()  # no progress bar: stderr is not a terminal


def test_a_run_killed_half_way_and_resumed_answers_every_line_once(
    server: RunningServer, requests_file: Path, tmp_path: Path
) -> None:
    """Over gRPC, one line per request. The run is killed (SIGKILL) once its progress bar shows half
    the lines written; the resumed run keeps what was written, drops a line the kill cut, and sends
    the rest: every line answered exactly once, in order."""
    output = tmp_path / "answers.jsonl"
    args = [
        "-u",
        server.grpc_address,
        "-t",
        "grpc",
        "-m",
        "echo",
        "-i",
        str(requests_file),
        "-o",
        str(output),
    ]
    first = _infer(*args, "--workers", "8", "--progress")
    assert isinstance(first.stderr, io.BufferedReader)
    shown = b""
    while True:  # the progress bar's updates, as they come
        chunk = first.stderr.read1(4096)
        assert chunk, f"the run ended before half the lines were written: {shown[-500:]!r}"
        shown += chunk
        counts = re.findall(rb"\] (\d+)/%d" % LINES, shown)
        if counts and int(counts[-1]) >= LINES // 2:
            break
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    first.stderr.close()
    kept = answered_lines(output)
    assert LINES // 2 <= kept < LINES
    second = _infer(*args, "--resume")
    _, err = second.communicate(timeout=600)
    _check_output(output)
    assert f"{kept} already answered" in err.decode()
    assert re.search(rf"sent {LINES - kept} lines", err.decode())


def test_resume_drops_a_line_cut_by_a_kill(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert answered_lines(path) == 2 and path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert answered_lines(tmp_path / "absent.jsonl") == 0


def test_bad_options_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    err = io.StringIO()
    base = {"model_name": "m", "output_data_path": str(tmp_path / "o")}
    assert run({**base, "input_data_path": str(tmp_path / "missing")}, err) == 2
    (tmp_path / "in").write_text("{}\n")
    assert run({**base, "input_data_path": str(tmp_path / "in"), "request_headers": ["no colon"]}, err) == 2
    assert run({**base, "input_data_path": str(tmp_path / "in"), "workers": 0}, err) == 2
    assert "not found" in err.getvalue() and "is not 'Name: value'" in err.getvalue()


SLOW = ModelSettings(
    name="slow", implementation=zoo.Slow, max_batch_size=2, max_batch_time=0.01, max_queue_size=1
)


@pytest.mark.anyio
async def test_a_request_refused_for_now_is_retried_after_retry_after(tmp_path: Path) -> None:
    """Eight lines at once on a model whose queue holds one: most are answered 503 with
    ``Retry-After: 1`` at first, tried again, and answered."""
    source = tmp_path / "in.jsonl"
    body = {"inputs": [{"name": "seconds", "datatype": "FP64", "shape": [1], "data": [0.05]}]}
    source.write_bytes(b"\n".join(orjson.dumps(body) for _ in range(8)) + b"\n")
    output = tmp_path / "out.jsonl"
    async with serving(SLOW) as server:
        options = InferOptions(
            url=f"127.0.0.1:{server.http_port}",
            model_name="slow",
            input_data_path=str(source),
            output_data_path=str(output),
            workers=8,
            retries=20,
        )
        err = io.StringIO()
        with source.open("rb") as inputs, output.open("wb") as out:
            summary = await BatchRun(options).run(inputs, out, stderr=err)
    assert summary.lines == 8 and summary.failed == 0 and summary.retried > 0
    answers: list[dict[str, Any]] = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    assert [a["outputs"][0]["data"] for a in answers] == [[0.05]] * 8
    assert err.getvalue() == ""  # no progress bar off a terminal


@pytest.mark.anyio
async def test_retries_run_out_into_an_error_in_place(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}\n')
    output = tmp_path / "out.jsonl"
    options = InferOptions(
        url=f"127.0.0.1:{free_port()}",
        model_name="m",
        input_data_path=str(source),
        output_data_path=str(output),
        retries=2,
    )
    with source.open("rb") as inputs, output.open("wb") as out:
        summary = await BatchRun(options).run(inputs, out, stderr=io.StringIO())
    assert summary.failed == 1 and summary.retried == 2
    assert "(after 3 tries)" in orjson.loads(output.read_bytes())["error"]


def free_port() -> int:
    """A local port that nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
