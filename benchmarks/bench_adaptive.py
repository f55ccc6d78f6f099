"""Adaptive batching against none, at 64 concurrent REST clients, for two torch MLPs.

    python3 benchmarks/bench_adaptive.py [--clients 64] [--rounds 2] [--duration 2]
        [--max-batch-size 32] [--max-batch-time 0.02] [--max-concurrent-batches 2]
        [--torch-threads N] [--no-gc-freeze]

One real server process (``mlserver-like start``, on 127.0.0.1 with a free port) serves four
models: each MLP (256→1024→256 and 1024→4096→1024, weights from a fixed seed) once with adaptive
batching and once without (``benchmarks/mlp_model.py``; the same code, so the same function). For
each MLP, ``--clients`` closed-loop clients send one-row requests (binary tensor extension, as
tritonclient does) for ``--rounds`` alternating rounds of batched and unbatched load of
``--duration`` seconds each (after a warm-up), so that drift in the machine's load hits both. It
prints throughput, p50/p99 latency, the mean batch size, the median time of one forward pass (the
model reports it) and the server's CPU time per request, then the ratios and the targets:
batched throughput >= 2x (256) and >= 5x (1024) the unbatched one, batched p99 <= max_batch_time
+ 2 x one batch's forward pass.

The clients run in this process on asyncio streams with a minimal keep-alive HTTP/1.1 client, so
that the load generator takes as little CPU as possible from the server; the server is a separate
process, as in production. Before the load, one request to each pair checks that the batched and
unbatched models return the same rows.

Defaults suit a 2-core machine: torch gets half the cores (the event loop needs the other), two
batches of 32 may be in flight (one computing while the next is merged and handed to the model's
thread), and the models call ``gc.freeze()`` once loaded (with torch loaded, a full collection of
Python's cyclic GC walks some 250 000 objects and stalls every request for tens of milliseconds;
``--no-gc-freeze`` shows the difference).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, start_server  # noqa: E402

MLPS = {"mlp-256": (256, 1024), "mlp-1024": (1024, 4096)}
TARGETS = {"mlp-256": 2.0, "mlp-1024": 5.0}


def write_repository(folder: Path, args: argparse.Namespace) -> None:
    for name, (width, hidden) in MLPS.items():
        for mode in ("batched", "direct"):
            model = folder / f"{name}-{mode}"
            model.mkdir()
            settings: dict[str, Any] = {
                "name": f"{name}-{mode}",
                "implementation": "mlp_model.TorchMLP",
                "platform": "pytorch",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, width]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, width]}],
                "parameters": {"extra": {"in": width, "hidden": hidden, "seed": 0}},
            }
            if args.torch_threads:
                settings["parameters"]["extra"]["threads"] = args.torch_threads
            if args.gc_freeze:
                settings["parameters"]["extra"]["gc_freeze"] = True
            if mode == "batched":
                settings.update(
                    max_batch_size=args.max_batch_size,
                    max_batch_time=args.max_batch_time,
                    max_concurrent_batches=args.max_concurrent_batches,
                )
            (model / "model-settings.json").write_text(json.dumps(settings, indent=2))


def infer_request(host: str, model: str, rows: np.ndarray) -> bytes:
    """The bytes of one HTTP request: a binary-extension infer asking for binary outputs."""
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": rows.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    body = header + rows.astype("<f4").tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Reply:
    status: int
    header: dict[str, Any]
    binary: bytes


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers["content-length"]))
    size = int(headers.get("inference-header-content-length", len(body)))
    return Reply(status, orjson.loads(body[:size]), body[size:])


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    compute_ms: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    server_cpu: float = 0.0

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(np.array(self.latencies), q)) * 1000

    @property
    def cpu_per_request_us(self) -> float:
        return self.server_cpu / max(1, len(self.latencies)) * 1e6


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def client(address: str, request: bytes, run: Run, measure_from: float, until: float) -> None:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        while True:
            start = time.perf_counter()
            if start >= until:
                return
            writer.write(request)
            reply = await read_reply(reader)
            end = time.perf_counter()
            if start < measure_from:
                continue
            if reply.status != 200:
                run.errors.append(f"{reply.status}: {reply.header}")
                continue
            run.latencies.append(end - start)
            params = reply.header.get("parameters", {})
            key = params.get("batch_id", -len(run.compute_ms) - 1)  # unbatched: each call its own
            run.batch_sizes.append(params.get("batch_size", 1))
            run.compute_ms[key] = params["compute_ms"]
    finally:
        writer.close()


async def load(server: RunningServer, model: str, width: int, args: argparse.Namespace, run: Run) -> None:
    """``args.clients`` closed-loop clients on ``model`` for warm-up + duration seconds, into ``run``."""
    rng = np.random.default_rng(1)
    address = server.http_address
    requests = [
        infer_request(address, model, rng.standard_normal((1, width), dtype=np.float32))
        for _ in range(args.clients)
    ]
    begin = time.perf_counter()
    measure_from, until = begin + args.warmup, begin + args.warmup + args.duration
    cpu: list[float] = []  # the server's CPU time when measuring starts
    cpu_at = asyncio.get_running_loop().call_later(
        args.warmup, lambda: cpu.append(process_cpu(server.process.pid))
    )
    await asyncio.gather(*(client(address, r, run, measure_from, until) for r in requests))
    cpu_at.cancel()
    if cpu:
        run.server_cpu += process_cpu(server.process.pid) - cpu[0]
    run.seconds += args.duration


async def same_rows(address: str, name: str, width: int) -> float:
    """Largest difference between the batched and unbatched model on the same rows."""
    rows = np.random.default_rng(2).standard_normal((3, width), dtype=np.float32)
    outputs = []
    for mode in ("batched", "direct"):
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(infer_request(address, f"{name}-{mode}", rows))
        reply = await read_reply(reader)
        writer.close()
        if reply.status != 200:
            raise SystemExit(f"{name}-{mode} failed: {reply.header}")
        outputs.append(np.frombuffer(reply.binary, dtype="<f4").reshape(3, width))
    return float(np.abs(outputs[0] - outputs[1]).max())


def report(name: str, batched: Run, direct: Run, max_batch_time: float) -> bool:
    ratio = batched.throughput / direct.throughput
    compute = statistics.median(batched.compute_ms.values())
    bound = max_batch_time * 1000 + 2 * compute
    p99 = batched.percentile(99)
    for mode, run in (("batched", batched), ("direct", direct)):
        print(
            f"  {name:9} {mode:8} {run.throughput:7.0f} req/s  p50 {run.percentile(50):6.1f} ms  "
            f"p99 {run.percentile(99):6.1f} ms  mean batch {statistics.fmean(run.batch_sizes):4.1f}  "
            f"forward {statistics.median(run.compute_ms.values()):5.2f} ms  "
            f"server CPU {run.cpu_per_request_us:4.0f} us/req  errors {len(run.errors)}"
        )
    met = ratio >= TARGETS[name] and p99 <= bound
    print(
        f"  {name:9} throughput ratio {ratio:.2f}x (target >= {TARGETS[name]:.0f}x); batched p99 {p99:.1f} ms, "
        f"bound {bound:.1f} ms (max_batch_time + 2 x one batch's forward): {'MET' if met else 'NOT MET'}"
    )
    return met


async def main_async(args: argparse.Namespace, server: RunningServer) -> bool:
    all_met = True
    for name, (width, _) in MLPS.items():
        diff = await same_rows(server.http_address, name, width)
        print(f"{name}: batched and unbatched rows differ by at most {diff:.2e}")
        runs = {"batched": Run(), "direct": Run()}
        for round in range(args.rounds):  # alternate, so that drift in the machine's load hits both
            for mode in ("batched", "direct") if round % 2 == 0 else ("direct", "batched"):
                await load(server, f"{name}-{mode}", width, args, runs[mode])
        for mode, run in runs.items():
            for error in run.errors[:3]:
                print(f"  error from {name}-{mode}: {error}")
        all_met &= report(name, runs["batched"], runs["direct"], args.max_batch_time)
    return all_met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of batched and direct load")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds measured per model and round")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of load before each measurement")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-batch-time", type=float, default=0.02, help="seconds")
    parser.add_argument("--max-concurrent-batches", type=int, default=2)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="torch intra-op threads (default: half the CPUs; the other half serves HTTP)",
    )
    parser.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the models call gc.freeze() once loaded (what the server could do after loading models)",
    )
    args = parser.parse_args()
    print(
        f"{args.clients} clients, {args.rounds} x {args.duration:g} s per model after {args.warmup:g} s warm-ups; "
        "batching: "
        f"max_batch_size {args.max_batch_size}, max_batch_time {args.max_batch_time * 1000:g} ms, "
        f"max_concurrent_batches {args.max_concurrent_batches}; torch threads {args.torch_threads}; "
        f"gc.freeze() {'on' if args.gc_freeze else 'off'}; "
        f"{os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as folder:
        write_repository(Path(folder), args)
        env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
        server = start_server(folder, timeout=120.0, env=env)
        try:
            met = asyncio.run(main_async(args, server))
        finally:
            server.stop()
    print("all targets met" if met else "some targets not met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
