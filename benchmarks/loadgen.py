"""Small closed-loop load generators: HTTP/1.1 over asyncio streams, and gRPC ModelInfer.

The HTTP client sends one pre-built request per keep-alive connection at a time and reads each
response by its Content-Length, so that the client costs far less than the server it measures.
Each connection may send a first request before its loop and a last one after it (neither
counted): a sequence's START and END, say. Connections warm up for ``warmup`` seconds and then
count for ``seconds``; the server's CPU time over the counted window is read from /proc when its
pid is given. The benchmarks that compare REST echo servers round by round share
:func:`echo_options`, :func:`echo_body` and :func:`compare`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass
class Result:
    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    cpu_seconds: float = float("nan")
    """The server's CPU time over the counted window (NaN when not measured)."""

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_request(self) -> float:
        return self.cpu_seconds / self.requests if self.requests else float("nan")

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def error(self, message: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or message


@dataclass
class Script:
    """What one connection sends: ``request`` over and over, between an optional first and last one."""

    request: bytes
    first: bytes | None = None
    last: bytes | None = None


def build_request(
    host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc (NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response: status, headers (lower-case names), body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return int(lines[0][9:12]), headers, body


async def exchange(host: str, port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request on a fresh connection and read its response."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        return await read_response(reader)
    finally:
        writer.close()


async def _connection(
    host: str, port: int, script: Script, measure_from: float, stop_at: float, result: Result
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if script.first is not None:
            writer.write(script.first)
            status, _, body = await read_response(reader)
            if status != 200:
                result.error(f"{status} {body[:300]!r}")
                return
        request = script.request
        while True:
            start = time.perf_counter()
            if start >= stop_at:
                break
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            if start < measure_from:
                continue
            result.latencies.append(time.perf_counter() - start)
            result.requests += 1
            if status != 200:
                result.error(f"{status} {body[:300]!r}")
        if script.last is not None:
            writer.write(script.last)
            status, _, body = await read_response(reader)
            if status != 200:
                result.error(f"{status} {body[:300]!r}")
    finally:
        writer.close()


async def _counted(
    clients: Sequence[Any], warmup: float, seconds: float, pid: int | None, result: Result
) -> Result:
    """Run ``clients`` (coroutine functions of (measure_from, stop_at)); time the counted window."""
    begin = time.perf_counter()
    measure_from, stop_at = begin + warmup, begin + warmup + seconds
    cpu: list[float] = []
    if pid is not None:
        loop = asyncio.get_running_loop()
        handle = loop.call_at(loop.time() + warmup, lambda: cpu.append(process_cpu(pid)))
    await asyncio.gather(*(client(measure_from, stop_at) for client in clients))
    if pid is not None:
        handle.cancel()
        if cpu:
            result.cpu_seconds = process_cpu(pid) - cpu[0]
    result.seconds = min(seconds, max(time.perf_counter() - measure_from, 1e-9))
    return result


async def run_load(
    host: str,
    port: int,
    request: bytes | Sequence[Script],
    connections: int,
    seconds: float,
    warmup: float = 1.0,
    pid: int | None = None,
) -> Result:
    """``connections`` closed-loop keep-alive connections for ``warmup`` + ``seconds``; the last counted.

    ``request``: the bytes every connection sends, or one ``Script`` per connection.
    """
    scripts = [Script(request)] * connections if isinstance(request, bytes) else list(request)
    result = Result()
    clients = [
        lambda m, s, script=script: _connection(host, port, script, m, s, result) for script in scripts
    ]
    return await _counted(clients, warmup, seconds, pid, result)


async def run_grpc_load(
    stub: Any, request: Any, concurrency: int, seconds: float, warmup: float = 1.0, pid: int | None = None
) -> Result:
    """``concurrency`` ModelInfer calls in flight on ``stub`` (a grpc.aio stub), closed loop."""
    result = Result()

    async def caller(measure_from: float, stop_at: float) -> None:
        while True:
            start = time.perf_counter()
            if start >= stop_at:
                return
            try:
                await stub.ModelInfer(request)
            except Exception as exc:  # an RpcError: counted, the load goes on
                if start >= measure_from:
                    result.requests += 1
                    result.error(repr(exc)[:300])
                continue
            if start >= measure_from:
                result.latencies.append(time.perf_counter() - start)
                result.requests += 1

    return await _counted([caller] * concurrency, warmup, seconds, pid, result)


def measure(port: int, pid: int, body: bytes, connections: int, seconds: float) -> tuple[Result, float]:
    """One round of POST /v2/models/echo/infer: the load result and the server's CPU seconds per request."""
    import uvloop

    request = build_request("127.0.0.1", port, "/v2/models/echo/infer", body)
    result = uvloop.run(run_load("127.0.0.1", port, request, connections, seconds, warmup=0.2, pid=pid))
    return result, result.cpu_per_request


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
