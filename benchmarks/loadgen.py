"""A small closed-loop HTTP/1.1 load generator (asyncio + uvloop, keep-alive connections).

It sends one pre-built request per connection at a time and reads each response by its
Content-Length, so that the client costs far less than the server it measures. The benchmarks
that compare REST echo servers share :func:`echo_options`, :func:`echo_body` and
:func:`compare` (servers loaded in alternating rounds, each round with the server's CPU time per
request read from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass
class Result:
    requests: int
    seconds: float
    latencies: list[float]
    errors: int

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def build_request(
    host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _connection(host: str, port: int, request: bytes, stop_at: float, result: Result) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            result.latencies.append(time.perf_counter() - start)
            result.requests += 1
            if status != 200:
                result.errors += 1
    finally:
        writer.close()


async def run_load(
    host: str, port: int, request: bytes, connections: int, seconds: float, warmup: float = 1.0
) -> Result:
    if warmup:
        await run_load(host, port, request, connections, warmup, warmup=0)
    result = Result(0, 0.0, [], 0)
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(_connection(host, port, request, stop_at, result) for _ in range(connections)))
    result.seconds = time.perf_counter() - start
    return result


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(port: int, pid: int, body: bytes, connections: int, seconds: float) -> tuple[Result, float]:
    """One round of POST /v2/models/echo/infer: the load result and the server's CPU seconds per request."""
    import uvloop

    request = build_request("127.0.0.1", port, "/v2/models/echo/infer", body)
    before = cpu_seconds(pid)
    result = uvloop.run(run_load("127.0.0.1", port, request, connections, seconds, warmup=0.2))
    return result, (cpu_seconds(pid) - before) / max(result.requests, 1)


def echo_options(parser: argparse.ArgumentParser) -> None:
    """The options of an echo comparison: round length, rounds, connections, tensor size."""
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements in the echoed tensor")


def echo_body(elements: int) -> bytes:
    """An infer request of one FP32 tensor ``x`` of shape [1, elements]."""
    return orjson.dumps(
        {"inputs": [{"name": "x", "shape": [1, elements], "datatype": "FP32", "data": [0.5] * elements}]}
    )


@dataclass
class Compared:
    """One server's rounds in a comparison."""

    rounds: list[tuple[Result, float]]

    @property
    def throughput(self) -> float:
        return sum(r.requests for r, _ in self.rounds) / sum(r.seconds for r, _ in self.rounds)

    @property
    def cpu(self) -> float:
        """Median over the rounds of the server's CPU seconds per request."""
        return statistics.median(c for _, c in self.rounds)

    def line(self, label: str, width: int) -> str:
        latencies = sorted(x for r, _ in self.rounds for x in r.latencies)
        p50 = latencies[len(latencies) // 2] * 1e3 if latencies else float("nan")
        p99 = latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else float("nan")
        return (
            f"{label:>{width}}: {self.throughput:8.0f} req/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
            f"CPU {self.cpu * 1e6:5.0f} us/request  errors {sum(r.errors for r, _ in self.rounds)}"
        )


def compare(
    servers: dict[str, tuple[int, int]], body: bytes, args: argparse.Namespace
) -> dict[str, Compared]:
    """Load each server (label: (port, pid)) in alternating rounds, so that a change in the machine's
    load falls on all alike, and print a line per server."""
    rounds: dict[str, list[tuple[Result, float]]] = {label: [] for label in servers}
    for _ in range(args.rounds):
        for label, (port, pid) in servers.items():
            rounds[label].append(measure(port, pid, body, args.connections, args.seconds))
    width = max(len(label) for label in servers)
    compared = {label: Compared(results) for label, results in rounds.items()}
    for label, result in compared.items():
        print(result.line(label, width))
    return compared


def median_ratio(a: Compared, b: Compared) -> float:
    """The median over the rounds of a's throughput over b's."""
    return statistics.median(
        x.throughput / y.throughput for (x, _), (y, _) in zip(a.rounds, b.rounds, strict=True)
    )
