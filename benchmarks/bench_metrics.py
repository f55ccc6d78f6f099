"""What the metrics cost: REST echo throughput with metrics on and off, in one run.

    python3 benchmarks/bench_metrics.py [--seconds 1.5] [--rounds 6] [--connections 16] [--no-grpc]
    python3 benchmarks/bench_metrics.py --instructions 1000

Two servers of the example models run as separate processes on 127.0.0.1: one with the defaults
(metrics on: every request counted per model and per route, /metrics served) and one started
with ``--metrics-endpoint ''`` (metrics off: nothing counted). Where the machine has two cores or
more, both are pinned to the first core and the load generator to the others (as in
``python -m benchmarks``). The same client loads them in alternating rounds, so that a change in
the machine's load falls on both alike: REST echo, then gRPC ModelInfer echo (16 calls in flight).
Printed: each server's throughput over all rounds and its CPU time per request (read from /proc,
the steadier figure on a shared machine), and the ratios (target: metrics on at most 5 % lower).

On a busy machine even CPU time per request swings by more than the 5 % it should resolve.
``--instructions N`` counts instead, with valgrind's callgrind, the instructions each server's
event loop thread executes for N requests (REST, then gRPC) after a warm-up: the two servers run
one after the other under callgrind, its instrumentation switched on only around the counted
requests. The count hardly depends on the machine's load; what runs on a clock (uvicorn's tick,
10 a second per HTTP server) is inflated by callgrind's slowness, and two server processes differ
by a percent or two (memory layout), so compare ratios of a few percent with care.

Then, since a busy machine blurs a difference of a few percent, the time the metrics add to one
REST infer request is measured alone, in this process, on the server's own code with the work in
between left out: the REST app with a handler that answers at once, and ``DataPlane.infer`` with a
request answered at once, each with metrics on and off (CPU time, best of 5 runs of 100 000
calls), as a share of the server's CPU time per request above.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import instructions as counting  # noqa: E402
from benchmarks.loadgen import (  # noqa: E402
    Compared,
    Result,
    compare,
    echo_body,
    echo_options,
    median_ratio,
    run_grpc_load,
)
from runtime.core.dataplane import DataPlane  # noqa: E402
from runtime.core.registry import Registry  # noqa: E402
from runtime.server.observability import Observability  # noqa: E402
from runtime.server.rest_app import create_app  # noqa: E402
from runtime.settings import ModelSettings, Settings  # noqa: E402
from runtime.types import InferenceRequest, InferenceResponse  # noqa: E402
from tests.servers import start_server  # noqa: E402


async def added_cost(calls: int = 100_000) -> float:
    """Microseconds of CPU the metrics add to one REST infer request, measured on the server's own
    code with the work between left out: the REST app answering at once (its counting on and off),
    and ``DataPlane.infer`` around a request answered at once (its observer on and off)."""
    registry = Registry()
    await registry.load(ModelSettings(name="echo", implementation="tests.models.zoo.Echo"))
    planes = {
        on: DataPlane(Settings(metrics_endpoint="/metrics" if on else ""), registry) for on in (True, False)
    }
    start = {"type": "http.response.start", "status": 200, "headers": []}
    body = {"type": "http.response.body", "body": b""}
    response = InferenceResponse(model_name="echo", outputs=[])

    class Answered:  # the REST handler, answering at once
        async def answer(self, scope: Any, receive: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            return start, body

    async def answered(request: Any, entry: Any) -> InferenceResponse:
        return response

    apps = {}
    for on, plane in planes.items():
        app = Observability(plane.settings, plane).wrap_rest(create_app(plane))
        app._api = Answered()
        plane._serve = answered  # type: ignore[method-assign]
        apps[on] = app

    async def send(message: Any) -> None:
        pass

    def scope() -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": "/v2/models/echo/infer", "headers": []}

    request = InferenceRequest(inputs=[])
    cases: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare app": lambda: apps[False](scope(), None, send),
        "observed app": lambda: apps[True](scope(), None, send),
        "bare infer": lambda: planes[False].infer(request, "echo"),
        "observed infer": lambda: planes[True].infer(request, "echo"),
    }
    assert planes[True].observer is not None and planes[False].observer is None
    best: dict[str, float] = {}
    for _ in range(5):
        for label, call in cases.items():
            began = time.process_time()
            for _ in range(calls):
                await call()
            best[label] = min(best.get(label, math.inf), (time.process_time() - began) / calls)
    recorder = planes[True].observer.recorder  # type: ignore[union-attr]
    assert recorder is not None and recorder.model("echo", None).success == 5 * calls  # all counted
    await registry.unload_all()
    return (best["observed app"] - best["bare app"] + best["observed infer"] - best["bare infer"]) * 1e6


def pin(pid: int, cpu: int) -> None:
    """Pin every thread of process ``pid`` to ``cpu`` (threads it starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(int(tid), {cpu})


def report(compared: dict[str, Compared]) -> Compared:
    """Print the ratios of metrics on to off; return the metrics-off side."""
    on, off = compared["metrics on"], compared["metrics off"]
    print(
        f"metrics on / off: throughput {on.throughput / off.throughput:.3f} over all rounds, "
        f"{median_ratio(on, off):.3f} median of rounds; "
        f"CPU per request {on.cpu / off.cpu:.3f}  (target: throughput >= 0.95)"
    )
    return off


async def compare_grpc(servers: dict[str, tuple[str, int]], args: argparse.Namespace) -> dict[str, Compared]:
    """gRPC ModelInfer of the echo model (raw FP32), ``args.connections`` calls in flight, each
    server (label: (address, pid)) in alternating rounds."""
    import grpc

    from runtime.frontends.grpc.generated import dataplane_pb2_grpc

    request = counting.grpc_echo(args.elements)
    channels = {label: grpc.aio.insecure_channel(address) for label, (address, _) in servers.items()}
    rounds: dict[str, list[tuple[Result, float]]] = {label: [] for label in servers}
    try:
        for _ in range(args.rounds):
            for label, (_, pid) in servers.items():
                stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channels[label])
                result = await run_grpc_load(stub, request, args.connections, args.seconds, 0.2, pid)
                rounds[label].append((result, result.cpu_per_request))
    finally:
        for channel in channels.values():
            await channel.close()
    compared = {label: Compared(results) for label, results in rounds.items()}
    width = max(len(label) for label in servers)
    for label, side in compared.items():
        print(side.line(label, width))
    return compared


def instructions(requests: int, body: bytes, connections: int) -> None:
    """Instructions per request of each server (``--instructions``), metrics on against off."""
    if not counting.available():
        return
    sides = {"metrics on": (ROOT, []), "metrics off": (ROOT, ["--metrics-endpoint", ""])}
    counts = counting.count(sides, ROOT / "examples" / "models", requests, body, connections)
    counting.print_ratios(counts, "metrics on", "metrics off")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    echo_options(parser)
    parser.add_argument("--no-grpc", action="store_true", help="compare REST only")
    parser.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="count instructions per request over N requests (callgrind)",
    )
    args = parser.parse_args()
    body = echo_body(args.elements)
    if args.instructions:
        instructions(args.instructions, body, args.connections)
        return
    examples = ROOT / "examples" / "models"
    servers = {
        "metrics on": start_server(examples),
        "metrics off": start_server(examples, "--metrics-endpoint", ""),
    }
    try:
        assert (
            "metrics" in servers["metrics on"].endpoints and "metrics" not in servers["metrics off"].endpoints
        )
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:  # the servers on the first core, the client on the others
            for server in servers.values():
                pin(server.process.pid, cpus[0])
            os.sched_setaffinity(0, set(cpus[1:]))
        targets = {
            label: (int(server.http_address.rsplit(":", 1)[1]), server.process.pid)
            for label, server in servers.items()
        }
        print("REST infer echo")
        off = report(compare(targets, body, args))
        if not args.no_grpc:
            print("gRPC ModelInfer echo")
            addresses = {
                label: (server.grpc_address, server.process.pid) for label, server in servers.items()
            }
            report(asyncio.run(compare_grpc(addresses, args)))
        added = asyncio.run(added_cost())
        print(
            f"CPU the metrics add to one REST infer request, measured alone: {added:.1f} us, "
            f"{added / (off.cpu * 1e6):.1%} of the CPU per request with metrics off"
        )
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
