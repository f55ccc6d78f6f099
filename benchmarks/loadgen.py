"""A small closed-loop HTTP/1.1 load generator (asyncio + uvloop, keep-alive connections).

It sends one pre-built request per connection at a time and reads each response by its
Content-Length, so that the client costs far less than the server it measures.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


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
