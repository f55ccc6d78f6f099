#!/usr/bin/env python3
"""ModelInfer throughput of the echo model against a bare grpc.aio servicer, as a ratio.

    python3 benchmarks/bench_grpc.py [--seconds 1] [--rounds 8] [--concurrency 16] [--elements 16] [--typed]

Two servers run as separate processes, each on uvloop: mlserver-like serving
examples/models/echo, and a bare grpc.aio servicer (built on the same generated stubs) that
answers every ModelInfer with the message the echo model's response becomes: the inputs as
outputs, the raw contents as raw output contents, the request's id and the model's name and
version. One client process drives both with the same load: ``--concurrency`` calls in flight on
one channel per server, for ``--seconds`` per measurement, alternating between the servers for
``--rounds`` rounds so that drift in the machine's load hits both alike. It prints requests per second, the
servers' CPU time per request, and the ratios (mlserver-like / bare): the throughput ratio of the
averages and the median of the per-round ratios. On a busy machine the CPU time per request is
the steadier figure: the client shares the machine with the server it drives.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from runtime.grpc.generated import dataplane_pb2 as pb  # noqa: E402
from runtime.grpc.generated import dataplane_pb2_grpc  # noqa: E402

ECHO = ROOT / "examples" / "models" / "echo"
OPTIONS = [("grpc.max_send_message_length", 100 << 20), ("grpc.max_receive_message_length", 100 << 20)]


# ---------------------------------------------------------------------- the bare servicer


class BareEcho(dataplane_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request: pb.ModelInferRequest, context: object) -> pb.ModelInferResponse:
        response = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        for tensor in request.inputs:
            out = response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            if not request.raw_input_contents:
                out.contents.CopyFrom(tensor.contents)
        response.raw_output_contents.extend(request.raw_input_contents)
        return response


async def serve_bare() -> None:
    server = grpc.aio.server(options=OPTIONS)
    dataplane_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(BareEcho(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"bare ready: {port}", flush=True)
    await server.wait_for_termination()


# ---------------------------------------------------------------------- the client


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_request(elements: int, typed: bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="echo", id="bench")
    data = np.arange(elements, dtype=np.float32)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, elements])
    if typed:
        tensor.contents.fp32_contents.extend(data.tolist())
    else:
        request.raw_input_contents.append(data.tobytes())
    return request


async def load(
    stub: dataplane_pb2_grpc.GRPCInferenceServiceStub,
    request: pb.ModelInferRequest,
    concurrency: int,
    seconds: float,
) -> int:
    """Keep ``concurrency`` calls in flight for ``seconds``; return how many completed."""
    deadline = time.monotonic() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await stub.ModelInfer(request)
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def compare(
    targets: dict[str, tuple[str, int]], request: pb.ModelInferRequest, args: argparse.Namespace
) -> dict[str, list[tuple[float, float]]]:
    """(requests per second, server CPU seconds per request) of each slice, by server."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    channels = {
        name: grpc.aio.insecure_channel(address, options=OPTIONS) for name, (address, _) in targets.items()
    }
    try:
        stubs = {name: dataplane_pb2_grpc.GRPCInferenceServiceStub(ch) for name, ch in channels.items()}
        for name, stub in stubs.items():
            response = await stub.ModelInfer(request)  # a correct answer before anything is counted
            assert response.id == request.id and len(response.outputs) == len(request.inputs), (
                name,
                response,
            )
            await load(stub, request, args.concurrency, args.warmup)
        for round_ in range(args.rounds):
            order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
            for name in order:
                pid = targets[name][1]
                cpu, start = cpu_seconds(pid), time.monotonic()
                count = await load(stubs[name], request, args.concurrency, args.seconds)
                elapsed, cpu = time.monotonic() - start, cpu_seconds(pid) - cpu
                results[name].append((count / elapsed, cpu / max(count, 1)))
    finally:
        for channel in channels.values():
            await channel.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one measurement")
    parser.add_argument("--rounds", type=int, default=8, help="measurements of each server")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight")
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements of the input tensor")
    parser.add_argument("--typed", action="store_true", help="send typed contents instead of raw")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import uvloop

    if args.serve_bare:
        uvloop.run(serve_bare())
        return 0

    from tests.servers import start_server

    bare = subprocess.Popen(
        [sys.executable, __file__, "--serve-bare"], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    ours = None
    try:
        ours = start_server(ECHO)
        assert bare.stdout is not None
        line = bare.stdout.readline()
        if not line.startswith("bare ready:"):
            raise RuntimeError(f"the bare servicer did not start: {line!r}")
        targets = {
            "bare": (f"127.0.0.1:{line.split(':')[1].strip()}", bare.pid),
            "mlserver-like": (ours.grpc_address, ours.process.pid),
        }
        results = uvloop.run(compare(targets, make_request(args.elements, args.typed), args))
    finally:
        if ours is not None:
            ours.stop()
        bare.terminate()
        bare.wait()
    form = "typed" if args.typed else "raw"
    print(
        f"ModelInfer, echo, 1 FP32 input of {args.elements} elements ({form}), "
        f"{args.concurrency} in flight, {args.rounds} x {args.seconds:g} s each"
    )
    summary = {}
    for name, runs in results.items():
        rps = sum(r for r, _ in runs) / len(runs)
        cpu = sum(c for _, c in runs) / len(runs)
        summary[name] = (rps, cpu)
        low, high = min(r for r, _ in runs), max(r for r, _ in runs)
        print(
            f"  {name:14s} {rps:8.0f} req/s  (runs {low:.0f}..{high:.0f})  server CPU {cpu * 1e6:6.1f} us/req"
        )
    (ours_rps, ours_cpu), (bare_rps, bare_cpu) = summary["mlserver-like"], summary["bare"]
    per_round = sorted(o[0] / b[0] for o, b in zip(results["mlserver-like"], results["bare"], strict=True))
    print(
        f"throughput ratio mlserver-like / bare: {ours_rps / bare_rps:.2f} "
        f"(median of rounds {per_round[len(per_round) // 2]:.2f})"
    )
    print(f"server CPU per request, bare / mlserver-like: {bare_cpu / ours_cpu:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
