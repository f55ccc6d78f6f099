"""Streaming throughput and added latency over Server-Sent Events.

    python3 benchmarks/bench_stream.py [--events N] [--streams S]

Serves ``benchmarks/models/firehose`` (a model that yields ``n`` small responses as fast as it
can, each stamped with ``time.monotonic()`` when it is made) and reads ``/infer_stream`` with a
minimal HTTP/1.1 client (so that the client costs little next to the server), then prints:

- streamed responses per second with 1 stream and with S concurrent streams (default 64), the
  model yielding as fast as it can;
- the server's added latency per event: from the model making the response to the client
  receiving its bytes (server and client share the machine's monotonic clock), median and p99,
  with the model paced below saturation (1 stream at 1000 events/s, S streams at 20 events/s
  each), so that the figure is the server's path and not a queue in front of a busy client;
- the same figures for a bare sse-starlette app on uvicorn that streams the same JSON events
  without any of the server (no model, no DataPlane), and the ratios server / bare.

Both servers are separate processes on 127.0.0.1 with free ports; everything runs in one go.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_server  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
PATH = "/v2/models/firehose/infer_stream"


@dataclass
class Run:
    events: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    def latency(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


async def read_stream(
    host: str, port: int, n: int, latencies: list[float], interval_us: int = 0, phase: float = 0.0
) -> int:
    """One SSE stream of ``n`` events; the latency of each event is appended to ``latencies``.

    A paced stream starts ``phase`` of an interval late, so that concurrent paced streams do not
    all tick at the same moment.
    """
    if interval_us:
        await asyncio.sleep(phase * interval_us / 1e6)
    reader, writer = await asyncio.open_connection(host, port)
    body = orjson.dumps(
        {
            "parameters": {"interval_us": interval_us},
            "inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [n]}],
        }
    )
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Accept: text/event-stream\r\nConnection: close\r\n\r\n%s"
        % (PATH.encode(), host.encode(), len(body), body)
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(head.decode(errors="replace"))
    events, buffer = 0, b""
    while True:
        size = int(await reader.readuntil(b"\r\n"), 16)  # chunked transfer encoding
        if size == 0:
            break
        chunk = await reader.readexactly(size + 2)
        now = time.monotonic()
        buffer += chunk[:-2]
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            event, buffer = buffer[:end], buffer[end + 4 :]
            if event.startswith(b"data: "):
                latencies.append(now - orjson.loads(event[6:])["parameters"]["t"])
                events += 1
            elif event.startswith(b"event: error"):
                raise RuntimeError(event.decode())
    writer.close()
    return events


async def measure(host: str, port: int, streams: int, per_stream: int, interval_us: int = 0) -> Run:
    latencies: list[float] = []
    start = time.monotonic()
    counts = await asyncio.gather(
        *(read_stream(host, port, per_stream, latencies, interval_us, k / streams) for k in range(streams))
    )
    seconds = time.monotonic() - start
    assert all(count == per_stream for count in counts), counts
    return Run(sum(counts), seconds, latencies)


# ---------------------------------------------------------------------- the bare baseline


def bare_app() -> object:
    """sse-starlette on Starlette streaming the same events, with nothing of the server in between."""
    from sse_starlette import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.routing import Route

    async def infer_stream(request: Request) -> EventSourceResponse:
        body = orjson.loads(await request.body())
        n = body["inputs"][0]["data"][0]
        interval = body["parameters"]["interval_us"] / 1e6

        async def events():  # type: ignore[no-untyped-def]
            for i in range(n):
                if interval:
                    await asyncio.sleep(interval)
                doc = {
                    "model_name": "firehose",
                    "id": "x",
                    "parameters": {"t": time.monotonic()},
                    "outputs": [{"name": "i", "datatype": "INT32", "shape": [1], "data": [i]}],
                }
                yield b"data: " + orjson.dumps(doc) + b"\r\n\r\n"

        return EventSourceResponse(events(), ping=15)

    return Starlette(routes=[Route(PATH, infer_stream, methods=["POST"])])


def serve_bare() -> None:
    import uvicorn
    import uvloop

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    config = uvicorn.Config(bare_app(), http="httptools", loop="none", log_level="warning", lifespan="off")  # type: ignore[arg-type]
    print(f"ready {sock.getsockname()[1]}", flush=True)
    uvloop.run(uvicorn.Server(config).serve(sockets=[sock]))


def start_bare() -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-bare"],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if not line.startswith("ready "):
        process.kill()
        raise RuntimeError("the bare server did not start")
    return process, int(line.split()[1])


# ---------------------------------------------------------------------- main


@dataclass
class Results:
    single: Run
    many: Run
    single_paced: Run
    many_paced: Run


async def bench(port: int, events: int, streams: int) -> Results:
    host = "127.0.0.1"
    await measure(host, port, 4, 200)  # warm up
    single = await measure(host, port, 1, events)
    many = await measure(host, port, streams, max(1, events // streams))
    single_paced = await measure(host, port, 1, 2000, interval_us=1000)
    many_paced = await measure(host, port, streams, 40, interval_us=50000)
    return Results(single, many, single_paced, many_paced)


def report(name: str, results: Results, streams: int) -> None:
    print(
        f"  {name:<14} 1 stream {results.single.rate:>8.0f} events/s   "
        f"{streams} streams {results.many.rate:>8.0f} events/s"
    )


def report_latency(name: str, results: Results, streams: int) -> None:
    one, many = results.single_paced, results.many_paced
    print(
        f"  {name:<14} 1 stream p50 {one.latency(0.5):>6.0f} us  p99 {one.latency(0.99):>6.0f} us   "
        f"{streams} streams p50 {many.latency(0.5):>6.0f} us  p99 {many.latency(0.99):>6.0f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=20000, help="events per measurement (default 20000)")
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare()
        return

    server = start_server(MODELS)
    try:
        port = int(server.http_address.rsplit(":", 1)[1])
        ours = asyncio.run(bench(port, args.events, args.streams))
    finally:
        server.stop()
    bare, bare_port = start_bare()
    try:
        baseline = asyncio.run(bench(bare_port, args.events, args.streams))
    finally:
        bare.terminate()
        bare.wait()

    print(f"SSE streaming on {os.cpu_count()} CPUs, server and client on one machine")
    print("streamed responses per second (the model yields as fast as it can):")
    report("mlserver-like", ours, args.streams)
    report("bare sse", baseline, args.streams)
    print(
        f"  ratio          1 stream {ours.single.rate / baseline.single.rate:>8.2f}            "
        f"{args.streams} streams {ours.many.rate / baseline.many.rate:>8.2f}"
    )
    print("added latency per event, model yield -> client receive (paced below saturation):")
    report_latency("mlserver-like", ours, args.streams)
    report_latency("bare sse", baseline, args.streams)
    print(
        f"  (saturated, for reference: mlserver-like p50 {ours.single.latency(0.5):.0f} us with 1 stream, "
        f"{ours.many.latency(0.5):.0f} us with {args.streams}; the client's queue dominates)"
    )


if __name__ == "__main__":
    main()
