"""Sequence batching of the LSTM example: steps per second, batched against each request alone.

    python3 benchmarks/bench_sequence.py [--seconds 5] [--frames 10] [--sequences 1 16 128]

One server serves two copies of ``examples/sequences/lstm`` at its full size (80 features per frame,
2 LSTM layers of 512, 32 classes): ``lstm`` with sequence batching (up to 128 sequences per
batch) and ``lstm-alone`` with ``max_batch_size: 1``, the same model serving each request alone.
For N concurrent sequences, N keep-alive connections each run one sequence closed-loop over REST:
START, then one chunk of ``--frames`` frames per request (binary tensors both ways), the next
chunk sent when the previous answer arrives. Throughput is steps (requests) per second of all
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
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import start_server  # noqa: E402

EXAMPLE = ROOT / "examples" / "sequences" / "lstm"


def write_models(folder: Path, max_batch_time: float, threads: int) -> None:
    base = json.loads((EXAMPLE / "model-settings.json").read_text())
    for name, batch in (("lstm", 128), ("lstm-alone", 1)):
        target = folder / name
        target.mkdir()
        shutil.copy(EXAMPLE / "model.py", target / "model.py")
        settings = {**base, "name": name, "max_batch_size": batch, "max_batch_time": max_batch_time if batch > 1 else 0}
        settings["parameters"] = {"extra": {**base["parameters"]["extra"], "torch_threads": threads}}
        (target / "model-settings.json").write_text(json.dumps(settings))


def request(host: str, model: str, sequence: str, chunk: np.ndarray, start: bool = False, end: bool = False) -> bytes:
    parameters = {"sequence_id": sequence, "binary_data_output": True, "sequence_start": start, "sequence_end": end}
    tensor = {"name": "frames", "shape": list(chunk.shape), "datatype": "FP32", "parameters": {"binary_data_size": chunk.nbytes}}
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


async def sequence(address: str, model: str, n: int, tag: str, frames: int, stop_at: float, counts: list[int]) -> None:
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


async def measure(address: str, model: str, sequences: int, frames: int, seconds: float, tag: str) -> float:
    """Steps per second of ``sequences`` closed-loop sequences, counted over ``seconds`` after a warm-up."""
    counts = [0] * sequences
    warm = 0.2 * seconds + 0.3
    began = time.perf_counter()
    runs = [
        asyncio.create_task(sequence(address, model, n, tag, frames, began + warm + seconds, counts))
        for n in range(sequences)
    ]
    await asyncio.sleep(warm)
    at_start, t0 = sum(counts), time.perf_counter()
    await asyncio.sleep(seconds)
    done, t1 = sum(counts), time.perf_counter()
    await asyncio.gather(*runs)
    return (done - at_start) / (t1 - t0)


async def run(address: str, args: argparse.Namespace) -> list[tuple[int, float, float]]:
    rows = []
    for n in args.sequences:
        # alternate the two models in short slices, so that a change of load on a shared machine
        # weighs on both alike
        slices = max(1, args.rounds)
        batched = alone = 0.0
        for r in range(slices):
            batched += await measure(address, "lstm", n, args.frames, args.seconds / slices, f"b{n}-{r}") / slices
            alone += await measure(address, "lstm-alone", n, args.frames, args.seconds / slices, f"a{n}-{r}") / slices
        rows.append((n, batched, alone))
        print(f"N={n:4d}  batched {batched:8.1f} steps/s   alone {alone:8.1f} steps/s   ratio {batched / alone:5.2f}x", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per configuration")
    parser.add_argument("--frames", type=int, default=10, help="frames (of 80 features) per request")
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--max-batch-time", type=float, default=0.005, help="batch window of the batched model (s)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating slices per configuration")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads of the server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        write_models(Path(folder), args.max_batch_time, args.torch_threads)
        server = start_server(folder, timeout=120)
        try:
            import uvloop

            print(
                f"LSTM 80 -> 2 x 512 -> 32, {args.frames} frames per step, REST, {args.seconds:g} s per configuration",
                flush=True,
            )
            uvloop.run(run(server.http_address, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
