"""Instructions per request, counted with valgrind's callgrind: figures that hardly move with the
machine's load, for differences of a few percent that timings on a shared machine blur.

Each side is a server (a checkout of this project and extra command-line arguments) started under
callgrind on a model folder, with its instrumentation switched on only around the counted requests:
N REST echo requests over keep-alive connections, then N gRPC ModelInfer echo calls, each after a
warm-up. Only the event loop's thread is counted (grpc's poller threads wake on their own clock).
What runs on a clock (uvicorn's tick, 10 a second per HTTP server; the loop watchdog's heartbeat,
``loop_block_warning / 4``) is inflated by callgrind's slowness: a request that takes half a
millisecond takes some fifty under callgrind, so every timer fires a hundred times more often per
request than it does at full speed. Each count is therefore printed twice: ``raw`` (everything the
event loop's thread ran while the requests were served) and ``net`` (the same, less what that
thread runs in as much idle time right after, with no request: the clock's share). ``net`` is the
per-request figure; both are printed so that either can be compared. Two server processes still
differ by a percent or so (memory layout), so compare ratios of a few percent with care.
``PYTHONHASHSEED=0`` gives both sides the same dict layouts.

Used by ``python3 -m benchmarks --instructions N [--baseline DIR]`` (this checkout against another)
and ``python3 benchmarks/bench_metrics.py --instructions N`` (metrics on against off).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.loadgen import build_request, read_response  # noqa: E402
from tests.servers import RunningServer  # noqa: E402

TRANSPORTS = ("REST", "gRPC")
WARM_UP = 200


def available() -> bool:
    """Whether valgrind's callgrind can be run here (else say so and count nothing)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("counting instructions needs valgrind's callgrind (valgrind, callgrind_control)")
        return False
    return True


def server_command(checkout: Path, folder: Path) -> list[str]:
    """``mlserver-like start FOLDER`` of ``checkout`` on free loopback ports (the ports an older
    checkout does not know are left out)."""
    command = [sys.executable, "-m", "runtime", "start", str(folder), "--host", "127.0.0.1"]
    command += ["--http-port", "0", "--grpc-port", "0"]
    settings = (checkout / "runtime" / "settings.py").read_text()
    if "metrics_port" in settings:
        command += ["--metrics-port", "0"]  # a checkout that serves metrics, on a port of their own
    if "management_port" in settings:
        command += ["--management-port", "0"]  # and its management API, likewise
    return command


def count(
    sides: dict[str, tuple[Path, list[str]]],
    folder: Path,
    requests: int,
    body: bytes,
    connections: int,
    starts: int = 1,
) -> dict[str, dict[str, float]]:
    """Instructions per request of each side (label -> (checkout, extra arguments)), by transport
    (net, and raw under "<transport> raw"); printed as they come. With ``starts`` > 1 each side's
    server is started that many times, the sides in turn, and each figure is the median of its
    starts: two processes of the same checkout differ by about a percent (memory layout)."""
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for start in range(starts):
            for index, (label, (checkout, extra)) in enumerate(sides.items()):
                runs[label].append(
                    _count_one(tmp, f"{start}-{index}", checkout, extra, folder, requests, body, connections)
                )
                figures = runs[label][-1]
                for transport in TRANSPORTS:
                    print(
                        f"{label:>13}, {transport}: {figures[transport]:9.0f} instructions per request net "
                        f"({figures[transport + ' raw']:.0f} raw, "
                        f"{figures[transport + ' raw'] - figures[transport]:.0f} of them the clock's)"
                        + (f", start {start + 1} of {starts}" if starts > 1 else ""),
                        flush=True,
                    )
    counts = {
        label: {key: statistics.median(run[key] for run in figures) for key in figures[0]}
        for label, figures in runs.items()
    }
    if starts > 1:
        for label, figures in counts.items():
            for transport in TRANSPORTS:
                print(
                    f"{label:>13}, {transport}: {figures[transport]:9.0f} net, "
                    f"{figures[transport + ' raw']:.0f} raw: the medians of {starts} starts"
                )
    return counts


def _count_one(
    tmp: str,
    tag: str,
    checkout: Path,
    extra: list[str],
    folder: Path,
    requests: int,
    body: bytes,
    connections: int,
) -> dict[str, float]:
    """One start of one side's server under callgrind: its figures by transport."""
    command = [
        *("valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"),
        f"--callgrind-out-file={tmp}/side{tag}.%p",
        *server_command(checkout, folder),
        *extra,
    ]
    server = _started(command, checkout, {"PYTHONHASHSEED": "0"})
    figures: dict[str, float] = {}
    try:
        pid = str(server.process.pid)
        for transport in TRANSPORTS:
            send = rest_requests if transport == "REST" else grpc_requests
            asyncio.run(send(server, WARM_UP, body, connections))  # not counted
            subprocess.run(["callgrind_control", "-i", "on", pid], capture_output=True, check=True)
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
            began = time.monotonic()
            asyncio.run(send(server, requests, body, connections))
            seconds = time.monotonic() - began
            served = _dumped(tmp, tag, pid)
            time.sleep(seconds)  # as long again with no request: the clock's share
            idle = _dumped(tmp, tag, pid)
            subprocess.run(["callgrind_control", "-i", "off", pid], capture_output=True, check=True)
            figures[transport] = (served - idle) / requests
            figures[f"{transport} raw"] = served / requests
    finally:
        server.stop(timeout=120)
    return figures


def to_ready(sides: dict[str, Path], folder: Path) -> dict[str, float]:
    """Instructions each side's server (label -> checkout) executes from its start to its ready
    line, every thread counted (imports, settings, loading the models, the listeners); printed as
    they come. The bytecode of each checkout is compiled first, as an installed package has it."""
    counts: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for index, (label, checkout) in enumerate(sides.items()):
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "runtime")], check=True)
            out = f"{tmp}/start{index}"
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"]
            command += server_command(checkout, folder)
            server = _started(command, checkout, {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"})
            try:
                pid = str(server.process.pid)
                subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True)
                dumps = sorted(Path(tmp).glob(f"start{index}.{pid}.*"), key=_dump_number)
                counts[label] = float(_total(dumps[-1]))
                print(f"{label:>13}: {counts[label] / 1e6:9.1f} M instructions to ready", flush=True)
            finally:
                server.stop(timeout=120)
    return counts


def _started(command: list[str], checkout: Path, env: dict[str, str]) -> RunningServer:
    """A server started by ``command`` (under callgrind) in ``checkout``, once it listens."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=checkout,
        env={**os.environ, **env},
    )
    server = RunningServer(process)
    if not server._wait(lambda s=server: bool(s.endpoints), 900):  # type: ignore[misc]
        server.stop(timeout=120)
        raise RuntimeError(f"the server under callgrind did not start:\n{server.read_log()}")
    return server


def print_ratios(counts: dict[str, dict[str, float]], first: str, second: str) -> None:
    for transport in TRANSPORTS:
        ratio = counts[first][transport] / counts[second][transport]
        raw = counts[first][f"{transport} raw"] / counts[second][f"{transport} raw"]
        print(f"{transport}: instructions per request, {first} / {second}: {ratio:.3f} net, {raw:.3f} raw")


def _dumped(tmp: str, tag: str, pid: str) -> int:
    """The instructions the event loop's thread (callgrind's ``-01``) ran since the last dump (or
    zeroing): a dump now, read back."""
    subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True)
    dumps = sorted(Path(tmp).glob(f"side{tag}.{pid}.*-01"), key=_dump_number)
    return _total(dumps[-1])


def _dump_number(dump: Path) -> int:
    return int(dump.name.rsplit(".", 1)[1].split("-")[0])


def _total(dump: Path) -> int:
    """The instructions a callgrind dump counted (its ``totals:`` or ``summary:`` line)."""
    total = 0
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            total = max(total, int(line.split()[1]))
    return total


async def rest_requests(server: RunningServer, n: int, body: bytes, connections: int) -> None:
    """Exactly ``n`` REST echo requests over ``connections`` keep-alive connections."""
    port = int(server.http_address.rsplit(":", 1)[1])
    request = build_request("127.0.0.1", port, "/v2/models/echo/infer", body)
    left = [n]

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            writer.write(request)
            status, _, _ = await read_response(reader)
            assert status == 200, status
        writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))


async def grpc_requests(server: RunningServer, n: int, body: bytes, connections: int) -> None:
    """Exactly ``n`` gRPC ModelInfer echo calls, ``connections`` in flight."""
    import grpc

    from runtime.frontends.grpc.generated import dataplane_pb2_grpc

    request = grpc_echo(len(orjson.loads(body)["inputs"][0]["data"]))
    left = [n]
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def caller() -> None:
            while left[0] > 0:
                left[0] -= 1
                await stub.ModelInfer(request)

        await asyncio.gather(*(caller() for _ in range(connections)))


def grpc_echo(elements: int) -> Any:
    """A ModelInfer request for the echo model: one raw FP32 ``[1, elements]`` tensor."""
    import numpy as np

    from runtime.frontends.grpc.generated import dataplane_pb2 as pb

    request = pb.ModelInferRequest(model_name="echo", id="bench")
    request.inputs.add(name="x", datatype="FP32", shape=[1, elements])
    request.raw_input_contents.append(np.arange(elements, dtype=np.float32).tobytes())
    return request
