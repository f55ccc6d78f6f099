#!/usr/bin/env python3
"""Fairness between the transports: gRPC alone, REST alone, and both together, in one run.

    python3 benchmarks/bench_mixed.py [--seconds 3] [--connections 16] [--elements 16]

One server (examples/models/echo) serves REST and gRPC in one event loop. Each load runs in a
client process of its own (so that neither client starves the other): ``--connections`` REST
keep-alive connections (benchmarks/loadgen.py) and ``--connections`` gRPC calls in flight on one
channel. It measures gRPC alone, REST alone, then both at once, and prints requests per second and
latency percentiles of each, and the share each transport keeps beside the other (its throughput
together / alone). Neither should fall far below the other's share.

What it has shown so far (2 shared cores, clients on the same machine): beside REST, gRPC keeps
its median latency but has stalls of 200-500 ms (p99) and keeps 0.2-0.7 of its rate alone, while
the event loop is never blocked that long (``MLSERVER_LOOP_BLOCK_WARNING=0.05`` stays quiet): the
stalls lie outside the loop (gRPC core's threads or the clients getting no CPU), not yet explained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ECHO = ROOT / "examples" / "models" / "echo"


def _body(elements: int) -> bytes:
    data = list(range(elements))
    doc = {"inputs": [{"name": "x", "shape": [1, elements], "datatype": "FP32", "data": data}]}
    return json.dumps(doc).encode()


async def _rest(address: str, args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.loadgen import build_request, run_load

    host, port = address.rsplit(":", 1)
    request = build_request(
        host, int(port), "/v2/models/echo/infer", _body(args.elements), {"Content-Type": "application/json"}
    )
    result = await run_load(host, int(port), request, args.connections, args.seconds, warmup=args.warmup)
    return _summary(result.requests, result.seconds, result.latencies, result.errors)


async def _grpc(address: str, args: argparse.Namespace) -> dict[str, Any]:
    import grpc
    import numpy as np

    from runtime.grpc.generated import dataplane_pb2 as pb
    from runtime.grpc.generated import dataplane_pb2_grpc

    request = pb.ModelInferRequest(model_name="echo", id="bench")
    request.inputs.add(name="x", datatype="FP32", shape=[1, args.elements])
    request.raw_input_contents.append(np.arange(args.elements, dtype=np.float32).tobytes())
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def worker(until: float, record: bool) -> None:
            nonlocal errors
            while time.perf_counter() < until:
                start = time.perf_counter()
                try:
                    await stub.ModelInfer(request)
                except grpc.aio.AioRpcError:
                    errors += 1
                if record:
                    latencies.append(time.perf_counter() - start)

        warm = time.perf_counter() + args.warmup
        await asyncio.gather(*(worker(warm, False) for _ in range(args.connections)))
        start = time.perf_counter()
        await asyncio.gather(*(worker(start + args.seconds, True) for _ in range(args.connections)))
        seconds = time.perf_counter() - start
    return _summary(len(latencies), seconds, latencies, errors)


def _summary(requests: int, seconds: float, latencies: list[float], errors: int) -> dict[str, Any]:
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")

    return {"rps": requests / seconds, "p50_ms": pct(0.5), "p99_ms": pct(0.99), "errors": errors}


def _client(kind: str, address: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    cmd = [sys.executable, __file__, "--client", kind, "--address", address]
    cmd += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    cmd += ["--connections", str(args.connections), "--elements", str(args.elements)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"a client failed (exit {process.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before measuring")
    parser.add_argument("--connections", type=int, default=16, help="REST connections / gRPC calls in flight")
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements of the input tensor")
    parser.add_argument("--client", choices=["rest", "grpc"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run = _rest if args.client == "rest" else _grpc
        try:
            import uvloop

            result = uvloop.run(run(args.address, args))
        except ImportError:
            result = asyncio.run(run(args.address, args))
        print(json.dumps(result))
        return 0

    from tests.servers import start_server

    server = start_server(ECHO)
    try:
        addresses = {"rest": server.http_address, "grpc": server.grpc_address}
        alone = {kind: _result(_client(kind, addresses[kind], args)) for kind in ("grpc", "rest")}
        together_clients = {kind: _client(kind, addresses[kind], args) for kind in ("grpc", "rest")}
        together = {kind: _result(process) for kind, process in together_clients.items()}
    finally:
        server.stop()
    print(
        f"echo model, {args.connections} REST connections / {args.connections} gRPC calls in flight, "
        f"{args.seconds:g}s each"
    )
    print(f"{'':18} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for label, figures in (
        ("gRPC alone", alone["grpc"]),
        ("REST alone", alone["rest"]),
        ("gRPC beside REST", together["grpc"]),
        ("REST beside gRPC", together["rest"]),
    ):
        print(
            f"{label:18} {figures['rps']:9.0f} {figures['p50_ms']:8.2f} {figures['p99_ms']:8.2f} "
            f"{figures['errors']:7d}"
        )
    shares = {kind: together[kind]["rps"] / alone[kind]["rps"] for kind in ("grpc", "rest")}
    print(f"share kept beside the other: gRPC {shares['grpc']:.2f}, REST {shares['rest']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
