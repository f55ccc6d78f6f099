"""Worker processes against the server process, through a real server over REST.

    python3 benchmarks/bench_workers.py [--duration 4] [--warmup 1] [--burn-ms 20] [--clients 8]

One server process (``mlserver-like start``, 127.0.0.1, free ports) serves the same models in
the server process (``workers: 0``) and in worker processes:

1. **CPU-bound**: a model that spins ~``--burn-ms`` of pure Python per request (holding the GIL),
   in 1 and in 2 worker processes (and in the server process, for reference); ``--clients``
   closed-loop clients. Target: 2 workers >= 1.7x the throughput of 1 worker (2 cores).
2. **Echo**: a small request (one FP32 tensor of 4, JSON) answered at once, in one worker against
   the server process; ``--clients`` closed-loop clients. Target: >= 0.75 of in-process.
3. **4 MiB**: one FP32 tensor of 1 048 576 elements echoed back (binary tensor extension both
   ways), one client, in one worker against the server process: latency of the round trip.

Rounds alternate between the variants so that drift in the machine's load hits all of them.
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
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_server  # noqa: E402

MODELS: dict[str, tuple[str, int]] = {
    "burn-server": ("Burn", 0),
    "burn-w1": ("Burn", 1),
    "burn-w2": ("Burn", 2),
    "echo-server": ("Echo", 0),
    "echo-w1": ("Echo", 1),
}


def write_repository(folder: Path, burn_ms: float) -> None:
    for name, (cls, workers) in MODELS.items():
        model = folder / name
        model.mkdir()
        settings: dict[str, Any] = {
            "name": name,
            "implementation": f"benchmarks.cpu_models.{cls}",
            "workers": workers,
            "parameters": {"extra": {"burn_ms": burn_ms}},
        }
        (model / "model-settings.json").write_text(json.dumps(settings))


def json_request(host: str, model: str) -> bytes:
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def binary_request(host: str, model: str, tensor: np.ndarray) -> bytes:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(tensor.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": tensor.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    body = header + tensor.astype("<f4").tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The server's worker processes (its children)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Cpu:
    """CPU seconds used by the server process and by its workers since the last ``take``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.last = self._now()

    def _now(self) -> tuple[float, float]:
        return process_cpu(self.pid), sum(process_cpu(c) for c in children(self.pid))

    def take(self) -> tuple[float, float]:
        now = self._now()
        used = (now[0] - self.last[0], now[1] - self.last[1])
        self.last = now
        return used


async def closed_loop(
    address: str, request: bytes, clients: int, seconds: float
) -> tuple[float, list[float]]:
    """Requests per second and latencies of ``clients`` closed-loop clients for ``seconds``."""
    host, port = address.rsplit(":", 1)
    latencies: list[float] = []
    errors: list[str] = []

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                status, body = await exchange(reader, writer, request)
                if status != 200:
                    errors.append(f"{status} {body[:200]!r}")
                    continue
                latencies.append(time.perf_counter() - start)
        finally:
            writer.close()

    begin = time.perf_counter()
    stop_at = begin + seconds
    await asyncio.gather(*(one() for _ in range(clients)))
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]}")
    return len(latencies) / (time.perf_counter() - begin), latencies


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write_repository(repo, args.burn_ms)
        server = start_server(repo, timeout=180)
        try:
            await run(server.http_address, server.process.pid, args)
        finally:
            server.stop()


async def run(address: str, pid: int, args: argparse.Namespace) -> None:
    burn = {m: json_request(address, m) for m in ("burn-server", "burn-w1", "burn-w2")}
    echo = {m: json_request(address, m) for m in ("echo-server", "echo-w1")}
    big_tensor = np.random.default_rng(0).random(1024 * 1024, dtype=np.float32)
    big = {m: binary_request(address, m, big_tensor) for m in ("echo-server", "echo-w1")}
    # warm up every model, and check the 4 MiB answer
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    for request in [*burn.values(), *echo.values()]:
        await closed_loop(address, request, 2, args.warmup)
    for model, request in big.items():
        status, body = await exchange(reader, writer, request)
        assert status == 200, body[:300]
        assert body.endswith(big_tensor.tobytes()), f"{model}: the 4 MiB tensor came back changed"

    throughput: dict[str, list[float]] = {m: [] for m in [*burn, *echo]}
    cpu_us: dict[str, list[tuple[float, float]]] = {m: [] for m in echo}
    round_trip: dict[str, list[float]] = {m: [] for m in big}
    cpu = Cpu(pid)
    for _ in range(args.rounds):
        for model, request in [*burn.items(), *echo.items()]:
            cpu.take()
            rate, latencies = await closed_loop(address, request, args.clients, args.duration)
            server_s, workers_s = cpu.take()
            throughput[model].append(rate)
            if model in cpu_us:
                cpu_us[model].append((server_s / len(latencies) * 1e6, workers_s / len(latencies) * 1e6))
        for model, request in big.items():
            for _ in range(args.big_requests):
                start = time.perf_counter()
                await exchange(reader, writer, request)
                round_trip[model].append(time.perf_counter() - start)
    writer.close()

    def best(model: str) -> float:
        return statistics.median(throughput[model])

    print(f"CPU-bound model ({args.burn_ms:g} ms of pure Python per request), {args.clients} clients:")
    for model in burn:
        print(f"  {model:12} {best(model):8.1f} req/s")
    scale = best("burn-w2") / best("burn-w1")
    print(f"  2 workers / 1 worker: {scale:.2f}x (target >= 1.7x)")
    print(f"Echo (one FP32 tensor of 4, JSON), {args.clients} clients:")
    for model in echo:
        print(f"  {model:12} {best(model):8.1f} req/s")
    ratio = best("echo-w1") / best("echo-server")
    print(f"  1 worker / server process: {ratio:.2f} (target >= 0.75)")
    for model in echo:
        server_us = statistics.median(c[0] for c in cpu_us[model])
        worker_us = statistics.median(c[1] for c in cpu_us[model])
        print(
            f"  {model:12} CPU per request: server process {server_us:6.0f} us, workers {worker_us:6.0f} us"
        )
    print("4 MiB FP32 tensor echoed (binary extension), one client, median round trip:")
    for model, times in round_trip.items():
        print(f"  {model:12} {statistics.median(times) * 1000:8.2f} ms")
    extra = statistics.median(round_trip["echo-w1"]) - statistics.median(round_trip["echo-server"])
    print(f"  through a worker: {extra * 1000:+.2f} ms")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of load per variant and round")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--burn-ms", type=float, default=20.0)
    parser.add_argument(
        "--big-requests", type=int, default=20, help="4 MiB round trips per variant and round"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
