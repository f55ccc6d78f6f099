#!/usr/bin/env python3
"""Fairness between the transports: gRPC alone, REST alone, and both together, in one run.

    python3 benchmarks/bench_mixed.py [--rounds 3] [--seconds 3] [--connections 16] [--compare]

One server (examples/models/echo) serves REST and gRPC in one event loop. Each load runs in a
client process of its own (so that neither client starves the other): ``--connections`` REST
keep-alive connections (benchmarks/loadgen.py) and ``--connections`` gRPC calls in flight on one
channel. Each round measures gRPC alone, REST alone, then both at once; rounds repeat
(``--rounds``) and the figures are medians over rounds, the shares medians of each round's ratio,
so that a machine shared with other work moves alone and together alike. ``--compare`` runs a
second server with ``transport_fairness`` off in the same rounds (interleaved), to show what
runtime/core/fairness.py changes.

Fair share, as checked here: beside the other, each transport keeps at least half of what its
share of the clients would give it (throughput together / alone >= 0.5 x its clients / all
clients: 0.25 with as many REST connections as gRPC calls), and neither transport's p99 latency
beside the other is more than ``P99_RATIO`` times the other's. The last line says whether it holds.

What it has shown (2 cores shared with other work, load average 9-13, so rates move a lot from
round to round; ``--compare --rounds 5``, medians):

                          fairness on            fairness off
                        req/s  p50   p99       req/s  p50   p99 (ms)
    gRPC alone           1285  11.7  36.7       1161   8.0  39.2
    REST alone           2320   4.8  24.5       1807   4.9  51.8
    gRPC beside REST     1207   9.1  35.3        920  12.1 211.2
    REST beside gRPC     1931   8.0  16.1       1858   5.9  37.9
    kept beside other    gRPC 0.94, REST 0.85   gRPC 0.79, REST 0.81

Five runs of ``--compare`` (2, 3, 5, 3 rounds, and 3 with ``--pin``): gRPC's p99 beside REST was
438, 84, 211, 54 ms without the turns and 126, 48, 35, 36 ms with them; gRPC kept 0.29, 1.07,
0.79, 0.90 of its rate alone without them and 0.52, 1.39, 0.94, 0.81 with them, REST 1.44, 0.57,
0.81, 0.79 without and 1.03, 0.63, 0.85, 0.61 with. The verdict failed twice without the turns
(gRPC's p99), never with them. On this loaded machine the REST client cannot always saturate the
server, and then gRPC is not starved either way: the rates scatter with the load, the tail shows
the effect. With ``--pin`` (both clients on one core) REST alone fell to 800-1100 req/s and gRPC
kept its rate either way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
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

    from runtime.frontends.grpc.generated import dataplane_pb2 as pb
    from runtime.frontends.grpc.generated import dataplane_pb2_grpc

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


FAIR_FRACTION = 0.5
"""Each transport keeps at least this fraction of its client share of its rate alone."""

P99_RATIO = 4.0
"""Neither transport's p99 beside the other may exceed this multiple of the other's p99."""


def _client(kind: str, address: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    cmd = [sys.executable, __file__, "--client", kind, "--address", address]
    cmd += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    cmd += ["--connections", str(args.connections), "--elements", str(args.elements)]
    cpus = args.client_cpus

    def pin() -> None:  # runs in the child, before it starts
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=pin)


def _pin_process(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a running process (gRPC core's included) to ``cpus``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task), cpus)


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"a client failed (exit {process.returncode})")
    return dict(json.loads(out.strip().splitlines()[-1]))


def _round(addresses: dict[str, str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """One round: gRPC alone, REST alone, both together."""
    figures = {f"{kind} alone": _result(_client(kind, addresses[kind], args)) for kind in ("grpc", "rest")}
    together = {kind: _client(kind, addresses[kind], args) for kind in ("grpc", "rest")}
    for kind, process in together.items():
        figures[f"{kind} together"] = _result(process)
    return figures


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


LABELS = {
    "grpc alone": "gRPC alone",
    "rest alone": "REST alone",
    "grpc together": "gRPC beside REST",
    "rest together": "REST beside gRPC",
}


def _report(name: str, rounds: list[dict[str, dict[str, Any]]]) -> bool:
    """Print one server's table and verdict; return whether the fair share held."""
    print(f"\n{name}")
    print(f"{'':18} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    median: dict[str, dict[str, float]] = {}
    for key, label in LABELS.items():
        median[key] = {
            field: _median([r[key][field] for r in rounds]) for field in ("rps", "p50_ms", "p99_ms")
        }
        errors = sum(r[key]["errors"] for r in rounds)
        m = median[key]
        print(f"{label:18} {m['rps']:9.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} {errors:7d}")
    client_share = 0.5  # as many REST connections as gRPC calls in flight
    floor = FAIR_FRACTION * client_share
    shares = {
        kind: _median([r[f"{kind} together"]["rps"] / r[f"{kind} alone"]["rps"] for r in rounds])
        for kind in ("grpc", "rest")
    }
    p99 = {kind: median[f"{kind} together"]["p99_ms"] for kind in ("grpc", "rest")}
    print(
        f"rate kept beside the other (together / alone, median of {len(rounds)} rounds): "
        f"gRPC {shares['grpc']:.2f}, REST {shares['rest']:.2f} (fair: >= {floor:.2f})"
    )
    print(
        f"p99 beside the other: gRPC {p99['grpc']:.1f} ms, REST {p99['rest']:.1f} ms "
        f"(fair: neither over {P99_RATIO:g}x the other)"
    )
    problems = [
        f"{kind} keeps {shares[kind]:.2f} < {floor:.2f}" for kind in ("grpc", "rest") if shares[kind] < floor
    ]
    for kind, other in (("grpc", "rest"), ("rest", "grpc")):
        if p99[kind] > P99_RATIO * p99[other]:
            problems.append(f"{kind} p99 {p99[kind]:.1f} ms > {P99_RATIO:g} x {other}'s {p99[other]:.1f} ms")
    errors = sum(r[key]["errors"] for r in rounds for key in LABELS)
    if errors:
        problems.append(f"{errors} errors")
    verdict = "HOLDS" if not problems else "DOES NOT HOLD: " + "; ".join(problems)
    print(f"fair share: {verdict}")
    return not problems


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (alone, alone, together)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before measuring")
    parser.add_argument("--connections", type=int, default=16, help="REST connections / gRPC calls in flight")
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements of the input tensor")
    parser.add_argument(
        "--compare", action="store_true", help="also run a server with transport_fairness off, interleaved"
    )
    parser.add_argument(
        "--pin", action="store_true", help="run the servers on CPU 0 and the clients on the other CPUs"
    )
    parser.add_argument("--client", choices=["rest", "grpc"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.client_cpus = None
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

    configs: dict[str, dict[str, str]] = {"default settings (transport_fairness on)": {}}
    if args.compare:
        configs["transport_fairness off"] = {"MLSERVER_TRANSPORT_FAIRNESS": "false"}
    servers = {name: start_server(ECHO, env=env) for name, env in configs.items()}
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error("--pin needs at least 2 CPUs")
        for server in servers.values():
            _pin_process(server.process.pid, {cpus[0]})
        args.client_cpus = set(cpus[1:])
    rounds: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in configs}
    try:
        for _ in range(args.rounds):
            for name, server in servers.items():
                addresses = {"rest": server.http_address, "grpc": server.grpc_address}
                rounds[name].append(_round(addresses, args))
    finally:
        for server in servers.values():
            server.stop()
    print(
        f"echo model, {args.connections} REST connections / {args.connections} gRPC calls in flight, "
        f"{args.seconds:g}s each, {args.rounds} rounds, {os.cpu_count()} CPUs"
        + (", servers pinned to one CPU and clients to the others" if args.pin else "")
    )
    fair = [_report(name, server_rounds) for name, server_rounds in rounds.items()]
    return 0 if fair[0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
