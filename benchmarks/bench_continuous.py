"""Continuous batching against each stream alone: aggregate tokens per second of the textgen example.

    python3 benchmarks/bench_continuous.py [--streams 1 8 64] [--rounds 2] [--duration 3]
        [--hidden 1024] [--layers 4] [--tokens 128] [--max-batch-size 64] [--torch-threads 1]

One real server process (``mlserver-like start``, 127.0.0.1, a free port) serves the text-generation
example of ``examples/streaming/textgen`` twice, built larger than the example (``--hidden`` wide,
``--layers`` hidden layers: by default 1024 x 4, some 3.4 M weights, so that one step costs what a
small real model's does: about 1.5 ms for one stream on one CPU thread), trained at load for a few
steps from the same seed, so both copies are the same model:

- ``textgen-continuous``: ``continuous_batching`` with ``max_batch_size`` streams; every step is one
  forward pass for all the running streams;
- ``textgen-alone``: the same class without it: each stream computes its own tokens, one forward
  pass per token (a batch of one), as a streaming model does without continuous batching.

For each number of concurrent streams (``--streams``), closed-loop clients keep that many streams
open on ``/infer_stream`` (Server-Sent Events; greedy, ``ignore_eos``, ``--tokens`` characters
each, a new stream as soon as one ends) and count the tokens that arrive during ``--duration``
seconds after a warm-up; rounds alternate the two models so that drift in the machine's load hits
both. It prints tokens per second for each, the ratio, the mean ``batch_size`` the continuous
model's tokens report and the server's CPU time per token, then the target: at least 5x at 64
streams. The clients are a minimal HTTP/1.1 reader in this process, so that they cost little next
to the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import RunningServer, start_server  # noqa: E402

TEXTGEN = ROOT / "examples" / "streaming" / "textgen"
MODES = ("continuous", "alone")
PROMPTS = [
    b"The keeper",
    b"In the morning",
    b"She kept a small book",
    b"The wind came in",
    b"Far away a bell",
]
BATCH_SIZE = re.compile(rb'"batch_size":(\d+)')
TARGET = 5.0


def write_repository(folder: Path, args: argparse.Namespace) -> None:
    for mode in MODES:
        model = folder / f"textgen-{mode}"
        model.mkdir(parents=True)
        for name in ("model.py", "corpus.txt"):
            shutil.copy(TEXTGEN / name, model / name)
        settings = json.loads((TEXTGEN / "model-settings.json").read_text())
        settings["name"] = f"textgen-{mode}"
        settings["continuous_batching"] = mode == "continuous"
        settings["max_batch_size"] = args.max_batch_size if mode == "continuous" else 0
        settings["max_queue_size"] = 4096
        settings["parameters"]["extra"].update(
            hidden=args.hidden,
            layers=args.layers,
            steps=args.train_steps,
            seed=0,
            threads=args.torch_threads,
            max_tokens=args.tokens,
        )
        (model / "model-settings.json").write_text(json.dumps(settings))


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    batch_sum: int = 0
    server_cpu: float = 0.0
    streams_done: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def request_bytes(host: str, model: str, prompt: bytes, tokens: int) -> bytes:
    body = orjson.dumps(
        {
            "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt.decode()]}],
            "parameters": {"max_tokens": tokens, "temperature": 0, "ignore_eos": True},
        }
    )
    return (
        b"POST /v2/models/%s/infer_stream HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n%s"
        % (model.encode(), host.encode(), len(body), body)
    )


async def one_stream(host: str, port: int, request: bytes, tally: Tally, start: float, end: float) -> None:
    """Read one SSE stream to its end, counting the tokens that arrive within [start, end)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.decode(errors="replace"))
        buffer = b""
        while True:
            size = int(await reader.readuntil(b"\r\n"), 16)  # chunked transfer encoding
            if size == 0:
                break
            chunk = await reader.readexactly(size + 2)
            now = time.perf_counter()
            buffer += chunk[:-2]
            while (cut := buffer.find(b"\r\n\r\n")) >= 0:
                event, buffer = buffer[:cut], buffer[cut + 4 :]
                if event.startswith(b"event: error"):
                    raise RuntimeError(event.decode(errors="replace"))
                if event.startswith(b"data: ") and start <= now < end:
                    tally.tokens += 1
                    found = BATCH_SIZE.search(event)
                    tally.batch_sum += int(found.group(1)) if found else 1
        if start <= time.perf_counter() < end:
            tally.streams_done += 1
    finally:
        writer.close()


async def client(
    host: str, port: int, model: str, k: int, tokens: int, tally: Tally, start: float, end: float
) -> None:
    request = request_bytes(host, model, PROMPTS[k % len(PROMPTS)], tokens)
    while time.perf_counter() < end:
        await one_stream(host, port, request, tally, start, end)


async def measure(
    server: RunningServer, model: str, streams: int, args: argparse.Namespace, tally: Tally
) -> None:
    """``streams`` concurrent closed-loop streams on ``model``; tokens counted after the warm-up."""
    host, port = server.http_address.rsplit(":", 1)
    begin = time.perf_counter()
    start, end = begin + args.warmup, begin + args.warmup + args.duration
    cpu: list[float] = []
    loop = asyncio.get_running_loop()
    marks = [
        loop.call_later(args.warmup, lambda: cpu.append(process_cpu(server.process.pid))),
        loop.call_later(args.warmup + args.duration, lambda: cpu.append(process_cpu(server.process.pid))),
    ]
    tasks = [
        asyncio.create_task(client(host, int(port), model, k, args.tokens, tally, start, end))
        for k in range(streams)
    ]
    await asyncio.wait(tasks, timeout=args.warmup + args.duration)
    for task in tasks:  # streams still open at the end are cut: the server drops them
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for marker in marks:
        marker.cancel()
    errors = [r for r in results if isinstance(r, Exception)]
    if errors:
        raise errors[0]
    if len(cpu) == 2:
        tally.server_cpu += cpu[1] - cpu[0]
    tally.seconds += args.duration
    await asyncio.sleep(0.3)  # let the server drop the cut streams before the next measurement


async def main_async(args: argparse.Namespace, server: RunningServer) -> bool:
    tallies = {(streams, mode): Tally() for streams in args.streams for mode in MODES}
    for round in range(args.rounds):
        for streams in args.streams:
            for mode in MODES if round % 2 == 0 else MODES[::-1]:
                await measure(server, f"textgen-{mode}", streams, args, tallies[(streams, mode)])
    print()
    print(
        f"{'streams':>7}  {'continuous tok/s':>16}  {'alone tok/s':>11}  {'ratio':>6}  "
        f"{'mean batch':>10}  {'server CPU/token (cont./alone)':>30}"
    )
    met = True
    for streams in args.streams:
        cont, alone = tallies[(streams, "continuous")], tallies[(streams, "alone")]
        ratio = cont.rate / alone.rate if alone.rate else float("inf")
        batch = cont.batch_sum / cont.tokens if cont.tokens else 0.0
        cpu = (
            f"{cont.server_cpu / max(1, cont.tokens) * 1e6:.0f} us / "
            f"{alone.server_cpu / max(1, alone.tokens) * 1e6:.0f} us"
        )
        print(
            f"{streams:>7}  {cont.rate:>16.0f}  {alone.rate:>11.0f}  {ratio:>5.2f}x  {batch:>10.1f}  {cpu:>30}"
        )
        if streams == 64:
            met = ratio >= TARGET
            print(
                f"\n64 streams: continuous batching {ratio:.2f}x the streams alone (target >= {TARGET:g}x: "
                f"{'met' if met else 'NOT met'})"
            )
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the two models")
    parser.add_argument(
        "--duration", type=float, default=3.0, help="seconds measured per model, level and round"
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each measurement")
    parser.add_argument(
        "--hidden", type=int, default=1024, help="width of the model's hidden layers (>= 512)"
    )
    parser.add_argument("--layers", type=int, default=4, help="hidden layers")
    parser.add_argument(
        "--train-steps", type=int, default=20, help="training steps at load (same seed for both)"
    )
    parser.add_argument("--tokens", type=int, default=128, help="characters per stream")
    parser.add_argument("--max-batch-size", type=int, default=64, help="streams in the continuous batch")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads per model")
    args = parser.parse_args()
    if args.hidden < 512:
        parser.error("--hidden must be at least 512")
    print(
        f"textgen {args.hidden} x {args.layers}, {args.tokens} tokens per stream, streams {args.streams}, "
        f"{args.rounds} x {args.duration:g} s per model and level after {args.warmup:g} s warm-ups; "
        f"max_batch_size {args.max_batch_size}; torch threads {args.torch_threads}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        write_repository(Path(tmp), args)
        loading = time.perf_counter()
        server = start_server(tmp, timeout=300)
        print(f"server ready in {time.perf_counter() - loading:.1f} s (both models trained at load)")
        try:
            met = asyncio.run(main_async(args, server))
        finally:
            server.stop()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
