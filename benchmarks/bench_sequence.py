"""Sequence batching of the LSTM example: steps per second, batched against each request alone.

    python3 benchmarks/bench_sequence.py [--seconds 5] [--frames 10] [--sequences 1 16 128] [--transports rest grpc]

One server serves two copies of ``examples/sequences/lstm`` at its full size (80 features per frame,
2 LSTM layers of 512, 32 classes): ``lstm`` with sequence batching (up to 128 sequences per
batch) and ``lstm-alone`` with ``max_batch_size: 1``, the same model serving each request alone.
For N concurrent sequences, N clients each run one sequence closed-loop: START, then one chunk of
``--frames`` frames per request, the next chunk sent when the previous answer arrives. Over REST
each sequence has its own keep-alive connection (binary tensors both ways); over gRPC each has its
own ``ModelStreamInfer`` stream on one shared channel (raw tensors both ways). Throughput is steps (requests) per second of all
sequences together; the ratio is batched / alone, measured in the same run. Client and server
share the machine, so absolute figures depend on what else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.frontends.grpc.generated import dataplane_pb2 as pb  # noqa: E402
from runtime.frontends.grpc.generated import dataplane_pb2_grpc  # noqa: E402
from tests.servers import RunningServer, start_server  # noqa: E402

EXAMPLE = ROOT / "examples" / "sequences" / "lstm"


def write_models(
    folder: Path, variants: dict[str, dict[str, Any]], threads: int, sizes: dict[str, int] | None = None
) -> None:
    """One copy of the LSTM example per variant: its name, and the settings it changes (``sizes``:
    the LSTM's ``hidden`` and ``layers``, when not the example's)."""
    base = json.loads((EXAMPLE / "model-settings.json").read_text())
    for name, changes in variants.items():
        target = folder / name
        target.mkdir()
        shutil.copy(EXAMPLE / "model.py", target / "model.py")
        settings = {**base, "name": name, **changes}
        extra = {**base["parameters"]["extra"], **(sizes or {}), "torch_threads": threads}
        settings["parameters"] = {"extra": extra}
        (target / "model-settings.json").write_text(json.dumps(settings))


def request(
    host: str, model: str, sequence: str, chunk: np.ndarray, start: bool = False, end: bool = False
) -> bytes:
    parameters = {
        "sequence_id": sequence,
        "binary_data_output": True,
        "sequence_start": start,
        "sequence_end": end,
    }
    tensor = {
        "name": "frames",
        "shape": list(chunk.shape),
        "datatype": "FP32",
        "parameters": {"binary_data_size": chunk.nbytes},
    }
    header = orjson.dumps({"inputs": [tensor], "parameters": parameters})
    body = header + chunk.tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
    )
    return head.encode() + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    if head[9:12] != b"200":
        raise RuntimeError(f"server answered {head[:12]!r}: {await reader.read(500)!r}")
    length = next(int(line[15:]) for line in head.split(b"\r\n") if line[:15].lower() == b"content-length:")
    await reader.readexactly(length)


async def sequence(
    address: str, model: str, n: int, tag: str, frames: int, stop_at: float, counts: list[int]
) -> None:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    chunk = np.random.default_rng(n).standard_normal((frames, 80), dtype=np.float32)
    name = f"{tag}-{n}"
    try:
        await exchange(reader, writer, request(address, model, name, chunk, start=True))
        step = request(address, model, name, chunk)
        while time.perf_counter() < stop_at:
            await exchange(reader, writer, step)
            counts[n] += 1
        await exchange(reader, writer, request(address, model, name, chunk, end=True))
    finally:
        writer.close()


def grpc_request(
    model: str, sequence: str, chunk: np.ndarray, start: bool = False, end: bool = False
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.parameters["sequence_id"].string_param = sequence
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    request.inputs.add(name="frames", datatype="FP32", shape=list(chunk.shape))
    request.raw_input_contents.append(chunk.tobytes())
    return request


async def grpc_sequence(
    stub: dataplane_pb2_grpc.GRPCInferenceServiceStub,
    model: str,
    n: int,
    tag: str,
    frames: int,
    stop_at: float,
    counts: list[int],
) -> None:
    chunk = np.random.default_rng(n).standard_normal((frames, 80), dtype=np.float32)
    name = f"{tag}-{n}"
    call = stub.ModelStreamInfer()

    async def exchange(request: pb.ModelInferRequest) -> None:
        await call.write(request)
        response = await call.read()
        if "error" in response.parameters:
            raise RuntimeError(response.parameters["error"].string_param)

    await exchange(grpc_request(model, name, chunk, start=True))
    step = grpc_request(model, name, chunk)
    while time.perf_counter() < stop_at:
        await exchange(step)
        counts[n] += 1
    await exchange(grpc_request(model, name, chunk, end=True))
    await call.done_writing()


async def measure(
    target: Any, transport: str, model: str, sequences: int, frames: int, seconds: float, tag: str
) -> float:
    """Steps per second of ``sequences`` closed-loop sequences, counted over ``seconds`` after a warm-up."""
    counts = [0] * sequences
    warm = 0.2 * seconds + 0.3
    began = time.perf_counter()
    stop_at = began + warm + seconds
    one = sequence if transport == "rest" else grpc_sequence
    runs = [
        asyncio.create_task(one(target, model, n, tag, frames, stop_at, counts)) for n in range(sequences)
    ]
    await asyncio.sleep(warm)
    at_start, t0 = sum(counts), time.perf_counter()
    await asyncio.sleep(seconds)
    done, t1 = sum(counts), time.perf_counter()
    await asyncio.gather(*runs)
    return (done - at_start) / (t1 - t0)


Line = Callable[[str, int, float, float], str]
"""The report of one configuration: (transport, sequences, first's steps/s, second's steps/s)."""


async def compare(
    server: RunningServer, args: argparse.Namespace, first: str, second: str, line: Line
) -> None:
    """Steps per second of two models, for each transport and number of sequences. The two
    alternate in ``args.rounds`` short slices, so that a change of load on a shared machine weighs
    on both alike."""
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        targets = {"rest": server.http_address, "grpc": dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)}
        for transport in args.transports:
            for n in args.sequences:
                slices = max(1, args.rounds)
                a = b = 0.0
                for r in range(slices):
                    seconds, tag = args.seconds / slices, f"{transport}{n}-{r}"
                    target = targets[transport]
                    a += await measure(target, transport, first, n, args.frames, seconds, "a" + tag) / slices
                    b += await measure(target, transport, second, n, args.frames, seconds, "b" + tag) / slices
                print(line(transport, n, a, b), flush=True)


def arguments(
    doc: str | None, *, seconds: float, sequences: list[int], transports: list[str], rounds: int
) -> argparse.Namespace:
    """The command line of a benchmark of two LSTM variants (defaults per benchmark)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=seconds, help="measured seconds per configuration")
    parser.add_argument("--frames", type=int, default=10, help="frames (of 80 features) per request")
    parser.add_argument("--sequences", type=int, nargs="+", default=sequences)
    parser.add_argument(
        "--max-batch-time", type=float, default=0.005, help="batch window of the batched models (s)"
    )
    parser.add_argument("--transports", nargs="+", choices=["rest", "grpc"], default=transports)
    parser.add_argument("--rounds", type=int, default=rounds, help="alternating slices per configuration")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads of the server")
    parser.add_argument("--hidden", type=int, default=512, help="the LSTM's hidden size (512: the example's)")
    parser.add_argument("--layers", type=int, default=2, help="the LSTM's layers (2: the example's)")
    return parser.parse_args()


def bench(args: argparse.Namespace, variants: dict[str, dict[str, Any]], headline: str, line: Line) -> None:
    """Serve the two variants (the first two of ``variants``) from one server and compare them."""
    first, second = list(variants)[:2]
    with tempfile.TemporaryDirectory() as folder:
        write_models(
            Path(folder), variants, args.torch_threads, {"hidden": args.hidden, "layers": args.layers}
        )
        server = start_server(folder, timeout=120)
        try:
            import uvloop

            print(headline, flush=True)
            uvloop.run(compare(server, args, first, second, line))
        finally:
            server.stop()


def main() -> None:
    args = arguments(__doc__, seconds=5.0, sequences=[1, 16, 128], transports=["rest", "grpc"], rounds=2)
    variants = {
        "lstm": {"max_batch_size": 128, "max_batch_time": args.max_batch_time},
        "lstm-alone": {"max_batch_size": 1, "max_batch_time": 0},
    }
    bench(
        args,
        variants,
        f"LSTM 80 -> 2 x 512 -> 32, {args.frames} frames per step, {args.seconds:g} s per configuration",
        lambda transport, n, batched, alone: (
            f"{transport:4s} N={n:4d}  batched {batched:8.1f} steps/s   alone {alone:8.1f} steps/s   "
            f"ratio {batched / alone:5.2f}x"
        ),
    )


if __name__ == "__main__":
    main()
