"""The compatibility tax: a TorchServe sequence model through TorchServe's front ends and through OIP.

    python3 benchmarks/bench_torchserve.py [--seconds 4] [--sequences 1 16 64] [--rounds 2]

One server serves ``examples/torchserve/stateful-sequence`` (TorchServe's stateful handler, run
unchanged from a .mar built by torch-model-archiver) with sequence batching (batchSize 32,
maxBatchDelay 5 ms), in the server's process (no ``minWorkers``: the hop to a worker process
would weigh on both paths alike and hide the translation's cost). N clients each run one sequence
closed-loop (START, then one number per request, the next sent when the previous answer arrived),
through four paths to the same model:

- ``ts-rest``:  ``POST /predictions/stateful`` with the ``ts_request_sequence_id`` header;
- ``oip-rest``: ``POST /v2/models/stateful/infer`` with ``sequence_id`` parameters (a BYTES input);
- ``ts-grpc``:  TorchServe's ``StreamPredictions2``, one stream per sequence;
- ``oip-grpc``: OIP ``ModelStreamInfer``, one stream per sequence.

Both REST paths use one keep-alive connection per sequence; both gRPC paths one stream per
sequence on one shared channel. The figures are requests per second of all sequences together and
the server's CPU time per request, and their ratios TorchServe / OIP per transport, measured in the
same run with the paths alternating in short slices (so that a change of load on a shared machine
weighs on both alike). On a busy machine throughput swings with the neighbours' load; CPU per
request much less. The handler only adds numbers, so the ratios show the cost of the translation
itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.frontends.grpc.generated import dataplane_pb2 as pb  # noqa: E402
from runtime.frontends.grpc.generated import dataplane_pb2_grpc  # noqa: E402
from runtime.frontends.grpc.generated import ts_inference_pb2 as ts_pb  # noqa: E402
from runtime.frontends.grpc.generated import ts_inference_pb2_grpc as ts_grpc  # noqa: E402
from tests.servers import RunningServer, start_server  # noqa: E402

EXAMPLE = ROOT / "examples" / "torchserve" / "stateful-sequence"
CONFIG = """\
batchSize: 32
maxBatchDelay: 5
sequenceMaxIdleMSec: 60000
maxNumSequence: 1024
maxSequenceJobQueueSize: 10
sequenceBatching: true
handler:
  cache:
    capacity: 4096
"""

Sequence = Callable[[Any, int, str, float, list[int]], Coroutine[Any, Any, None]]


def build_store(folder: Path) -> None:
    config = folder / "model-config.yaml"
    config.write_text(CONFIG)
    subprocess.run(
        [
            sys.executable, "-m", "model_archiver.model_packaging", "--model-name", "stateful",
            "--version", "1.0", "--handler", str(EXAMPLE / "stateful_handler.py"),
            "--config-file", str(config), "--export-path", str(folder),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    config.unlink()


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    if head[9:12] != b"200":
        raise RuntimeError(f"server answered {head[:12]!r}: {await reader.read(500)!r}")
    length = next(int(line[15:]) for line in head.split(b"\r\n") if line[:15].lower() == b"content-length:")
    await reader.readexactly(length)


def ts_request(host: str, sequence: str, start: bool, end: bool = False) -> bytes:
    extra = "ts_request_sequence_start: true\r\n" if start else ""
    extra += "ts_request_sequence_end: true\r\n" if end else ""
    return (
        f"POST /predictions/stateful HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1\r\n"
        f"ts_request_sequence_id: {sequence}\r\n{extra}\r\n1"
    ).encode()


def oip_request(host: str, sequence: str, start: bool, end: bool = False) -> bytes:
    body = orjson.dumps(
        {
            "inputs": [{"name": "body", "shape": [1], "datatype": "BYTES", "data": ["1"]}],
            "parameters": {"sequence_id": sequence, "sequence_start": start, "sequence_end": end},
        }
    )
    head = (
        f"POST /v2/models/stateful/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def rest_sequence(make: Callable[[str, str, bool, bool], bytes]) -> Sequence:
    async def run(address: Any, n: int, tag: str, stop_at: float, counts: list[int]) -> None:
        host, port = str(address).rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        name = f"{tag}-{n}"
        try:
            await exchange(reader, writer, make(address, name, True, False))
            step = make(address, name, False, False)
            while time.perf_counter() < stop_at:
                await exchange(reader, writer, step)
                counts[n] += 1
            await exchange(reader, writer, make(address, name, False, True))  # an open one delays batches
        finally:
            writer.close()

    return run


async def ts_grpc_sequence(stub: Any, n: int, tag: str, stop_at: float, counts: list[int]) -> None:
    call = stub.StreamPredictions2()
    first = ts_pb.PredictionsRequest(
        model_name="stateful",
        sequence_id=f"{tag}-{n}",
        input={"data": b"1", "ts_request_sequence_start": b"true"},
    )
    step = ts_pb.PredictionsRequest(model_name="stateful", sequence_id=f"{tag}-{n}", input={"data": b"1"})

    async def one(request: Any) -> None:
        await call.write(request)
        answer = await call.read()
        if answer.HasField("status"):
            raise RuntimeError(answer.status.message)

    await one(first)
    while time.perf_counter() < stop_at:
        await one(step)
        counts[n] += 1
    end = {"data": b"1", "ts_request_sequence_end": b"true"}
    await one(ts_pb.PredictionsRequest(model_name="stateful", sequence_id=f"{tag}-{n}", input=end))
    await call.done_writing()


def oip_grpc_request(sequence: str, start: bool, end: bool = False) -> Any:
    request = pb.ModelInferRequest(model_name="stateful")
    request.parameters["sequence_id"].string_param = sequence
    request.parameters["sequence_start"].bool_param = start
    request.parameters["sequence_end"].bool_param = end
    tensor = request.inputs.add(name="body", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"1")
    return request


async def oip_grpc_sequence(stub: Any, n: int, tag: str, stop_at: float, counts: list[int]) -> None:
    call = stub.ModelStreamInfer()

    async def one(request: Any) -> None:
        await call.write(request)
        answer = await call.read()
        if "error" in answer.parameters:
            raise RuntimeError(answer.parameters["error"].string_param)

    await one(oip_grpc_request(f"{tag}-{n}", True))
    step = oip_grpc_request(f"{tag}-{n}", False)
    while time.perf_counter() < stop_at:
        await one(step)
        counts[n] += 1
    await one(oip_grpc_request(f"{tag}-{n}", False, True))
    await call.done_writing()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    one: Sequence, target: Any, sequences: int, seconds: float, tag: str, pid: int
) -> tuple[float, float]:
    """Requests per second of ``sequences`` closed-loop sequences, over ``seconds`` after a warm-up,
    and the server's CPU time per request (less sensitive than throughput to a busy machine)."""
    counts = [0] * sequences
    warm = 0.2 * seconds + 0.3
    stop_at = time.perf_counter() + warm + seconds
    runs = [asyncio.create_task(one(target, n, tag, stop_at, counts)) for n in range(sequences)]
    await asyncio.sleep(warm)
    at_start, t0, cpu0 = sum(counts), time.perf_counter(), cpu_seconds(pid)
    await asyncio.sleep(seconds)
    done, t1, cpu1 = sum(counts), time.perf_counter(), cpu_seconds(pid)
    await asyncio.gather(*runs)
    served = max(done - at_start, 1)
    return served / (t1 - t0), (cpu1 - cpu0) / served


async def run(server: RunningServer, args: argparse.Namespace) -> list[float]:
    ratios = []
    pid = server.process.pid
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        paths: dict[str, tuple[tuple[Sequence, Any], tuple[Sequence, Any]]] = {
            "rest": (
                (rest_sequence(ts_request), server.http_address),
                (rest_sequence(oip_request), server.http_address),
            ),
            "grpc": (
                (ts_grpc_sequence, ts_grpc.InferenceAPIsServiceStub(channel)),
                (oip_grpc_sequence, dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)),
            ),
        }
        for transport in args.transports:
            (ts_one, ts_target), (oip_one, oip_target) = paths[transport]
            for n in args.sequences:
                slices = max(1, args.rounds)
                ts = oip = ts_cpu = oip_cpu = 0.0
                for r in range(slices):
                    seconds, tag = args.seconds / slices, f"{transport}{n}-{r}"
                    rate, cpu = await measure(ts_one, ts_target, n, seconds, "t" + tag, pid)
                    ts, ts_cpu = ts + rate / slices, ts_cpu + cpu / slices
                    rate, cpu = await measure(oip_one, oip_target, n, seconds, "o" + tag, pid)
                    oip, oip_cpu = oip + rate / slices, oip_cpu + cpu / slices
                ratios.append(oip_cpu / ts_cpu)
                print(
                    f"{transport:4s} N={n:4d}  torchserve {ts:8.1f} req/s {ts_cpu * 1e6:6.0f} us CPU/req   "
                    f"oip {oip:8.1f} req/s {oip_cpu * 1e6:6.0f} us CPU/req   "
                    f"throughput ratio {ts / oip:5.2f}   CPU ratio {ts_cpu / oip_cpu:5.2f}",
                    flush=True,
                )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="measured seconds per path and configuration"
    )
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--transports", nargs="+", choices=["rest", "grpc"], default=["rest", "grpc"])
    parser.add_argument("--rounds", type=int, default=2, help="alternating slices per configuration")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        build_store(Path(folder))
        server = start_server(folder, timeout=120)
        try:
            import uvloop

            print("TorchServe stateful handler (running sum), sequence batching, batchSize 32", flush=True)
            ratios = uvloop.run(run(server, args))
            worst = 1 / min(ratios)
            print(f"worst CPU ratio {worst:.2f} (1.00: no tax; the target is <= 1.10)", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
