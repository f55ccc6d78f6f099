"""Streaming throughput and added latency over Server-Sent Events, and throughput over gRPC.

    python3 benchmarks/bench_stream.py [--events N] [--streams S] [--only sse|grpc] [--grpc-events N]

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

Then gRPC ``ModelStreamInfer`` (one request of ``n`` per stream, read with grpc.aio): streamed
responses per second with 1 and with S concurrent streams, for the server in each of its two
stream formats (MLServer's, the default, and Triton's) and for a bare grpc.aio servicer that
streams the same messages (raw INT32 output, a ``t`` parameter) with nothing of the server in
between; plus each server process's CPU time per streamed response (read from /proc), the steadier
figure on a shared machine, since the client competes with the server for the CPUs.

All servers are separate processes on 127.0.0.1 with free ports; everything runs in one go.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, start_server  # noqa: E402

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

        async def events() -> AsyncIterator[bytes]:
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


def start_bare(flag: str = "--serve-bare") -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen(
        [sys.executable, __file__, flag],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if not line.startswith("ready "):
        process.kill()
        raise RuntimeError("the bare server did not start")
    return process, int(line.split()[1])


# ---------------------------------------------------------------------- gRPC ModelStreamInfer

GRPC_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class GrpcRun:
    events: int
    seconds: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu / max(self.events, 1) * 1e6


async def measure_grpc(address: str, pid: int, triton: bool, streams: int, per_stream: int) -> GrpcRun:
    """``streams`` concurrent ModelStreamInfer calls of one request each, read to the end."""
    import grpc
    import numpy as np

    from runtime.frontends.grpc.generated import dataplane_pb2 as pb

    response_type = pb.ModelStreamInferResponse if triton else pb.ModelInferResponse

    def request(n: int) -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name="firehose", id="bench")
        message.inputs.add(name="n", datatype="INT32", shape=[1])
        message.raw_input_contents.append(np.array([n], np.int32).tobytes())
        return message

    async def one(call: grpc.aio.StreamStreamMultiCallable, n: int) -> int:
        count = 0
        async for message in call(iter([request(n)])):
            response = message.infer_response if triton else message
            if (triton and message.error_message) or "error" in response.parameters:
                raise RuntimeError(f"the server answered with an error: {message}")
            count += bool(response.outputs)  # Triton's empty final responses do not count
        return count

    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(
            GRPC_METHOD,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        await asyncio.gather(*(one(call, 200) for _ in range(4)))  # warm up
        cpu, start = cpu_seconds(pid), time.monotonic()
        counts = await asyncio.gather(*(one(call, per_stream) for _ in range(streams)))
        seconds, cpu = time.monotonic() - start, cpu_seconds(pid) - cpu
    assert all(count == per_stream for count in counts), counts
    return GrpcRun(sum(counts), seconds, cpu)


async def bench_grpc(
    address: str, pid: int, triton: bool, events: int, streams: int
) -> tuple[GrpcRun, GrpcRun]:
    single = await measure_grpc(address, pid, triton, 1, events)
    many = await measure_grpc(address, pid, triton, streams, max(1, events // streams))
    return single, many


async def serve_bare_grpc() -> None:
    """A grpc.aio servicer streaming what the firehose model's responses become on the wire."""
    import grpc
    import numpy as np

    from runtime.frontends.grpc.generated import dataplane_pb2 as pb

    async def stream(request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        while (request := await context.read()) is not grpc.aio.EOF:
            n = int(np.frombuffer(request.raw_input_contents[0], np.int32)[0])
            for i in range(n):
                response = pb.ModelInferResponse(model_name="firehose", id=request.id)
                response.parameters["t"].double_param = time.monotonic()
                response.outputs.add(name="i", datatype="INT32", shape=[1])
                response.raw_output_contents.append(i.to_bytes(4, "little"))
                await context.write(response)

    handler = grpc.stream_stream_rpc_method_handler(
        stream,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService", {"ModelStreamInfer": handler}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"ready {port}", flush=True)
    await server.wait_for_termination()


def run_grpc(args: argparse.Namespace) -> None:
    import uvloop

    figures: dict[str, tuple[GrpcRun, GrpcRun]] = {}
    for name, flags in (("mlserver-like", ()), ("  (triton fmt)", ("--grpc-stream-format", "triton"))):
        server: RunningServer = start_server(MODELS, *flags)
        try:
            figures[name] = uvloop.run(
                bench_grpc(
                    server.grpc_address, server.process.pid, bool(flags), args.grpc_events, args.streams
                )
            )
        finally:
            server.stop()
    bare, port = start_bare("--serve-bare-grpc")
    try:
        figures["bare grpc.aio"] = uvloop.run(
            bench_grpc(f"127.0.0.1:{port}", bare.pid, False, args.grpc_events, args.streams)
        )
    finally:
        bare.terminate()
        bare.wait()

    print("gRPC ModelStreamInfer, streamed responses per second (server CPU per response):")
    for name, (single, many) in figures.items():
        print(
            f"  {name:<14} 1 stream {single.rate:>8.0f} /s ({single.cpu_us:>4.0f} us)   "
            f"{args.streams} streams {many.rate:>8.0f} /s ({many.cpu_us:>4.0f} us)"
        )
    (ours_1, ours_n), (bare_1, bare_n) = figures["mlserver-like"], figures["bare grpc.aio"]
    print(
        f"  ratio          1 stream {ours_1.rate / bare_1.rate:>8.2f}            "
        f"{args.streams} streams {ours_n.rate / bare_n.rate:>8.2f}   "
        f"(CPU per response, bare / ours: {bare_1.cpu_us / ours_1.cpu_us:.2f} and "
        f"{bare_n.cpu_us / ours_n.cpu_us:.2f})"
    )


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
    parser.add_argument("--grpc-events", type=int, default=10000, help="gRPC responses per measurement")
    parser.add_argument("--only", choices=("sse", "grpc"), help="measure one transport only")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare-grpc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare()
        return
    if args.serve_bare_grpc:
        import uvloop

        uvloop.run(serve_bare_grpc())
        return
    if args.only != "grpc":
        run_sse(args)
    if args.only != "sse":
        run_grpc(args)


def run_sse(args: argparse.Namespace) -> None:
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
