"""The batchers' own cost per request, in process, without HTTP: what the ``torch`` and ``sequence``
rows of ``python3 -m benchmarks`` pay between the transport and the model.

    python3 benchmarks/bench_batch_path.py adaptive|sequence|sequence-stream [--requests N] [--instructions | --profile]

- ``adaptive``: 64 callers, each sending one FP32 [1, 256] row at a time (as the REST transport
  hands it over, a checked numpy array) to an adaptive batcher (max 32 rows, 2 ms, one batch at a
  time) in front of a model that answers at once (``y = x``, no thread), so that only the
  batcher's work is left: queueing, forming, merging, splitting, answering each caller.
- ``sequence``: 128 running-sum sequences (``benchmarks/models/running-sum``), each sending its
  steps one at a time with the sequence id in TorchServe's header (read as the REST transport
  reads it), to a sequence batcher of at most 128 steps and no wait.
- ``sequence-stream``: the same sequences' steps, but all on one stream (``scheduler.stream``, as a
  gRPC ModelStreamInfer call carrying them arrives), taking turns; the stream reads them ahead
  (``runtime.streams.window``) so that they share batches, and answers them in order.

It prints the process's CPU time per request; ``--instructions`` runs itself under valgrind's
callgrind, counting only the requests (not start-up), and prints instructions per request, a
figure that hardly moves with the machine's load; ``--profile`` prints cProfile's calls per
request, the functions that take the most time first. ``BENCH_CHECKOUT=DIR`` measures the
``runtime`` of another checkout (``git worktree add DIR COMMIT``) with this script and its models.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT = Path(os.environ.get("BENCH_CHECKOUT", ROOT)).resolve()
"""The checkout whose ``runtime`` is measured (``BENCH_CHECKOUT=DIR``: another one, e.g. a baseline)."""
sys.path.insert(0, str(CHECKOUT))

from runtime.frontends.rest.sequence import read_sequence_headers  # noqa: E402
from runtime.model import MLModel  # noqa: E402
from runtime.settings import ModelSettings  # noqa: E402
from runtime.types import (  # noqa: E402
    Datatype,
    InferenceRequest,
    InferenceResponse,
    RequestInput,
    ResponseOutput,
)

WIDTH = 256
CLIENTS = 64
SEQUENCES = 128
WARM_UP = 2000


class Mirror(MLModel):
    """Answers a batch at once with its input (``y = x``): the batcher's cost alone."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = payload.inputs[0].data
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name="y", shape=list(x.shape), datatype=Datatype.FP32, data=x)],
        )


def _request(row: np.ndarray[Any, Any]) -> InferenceRequest:
    return InferenceRequest(
        inputs=[RequestInput(name="x", shape=[1, WIDTH], datatype=Datatype.FP32, data=row)]
    )


async def _adaptive(requests: int, counted: Callable[[bool], None]) -> None:
    from runtime.scheduling.adaptive import AdaptiveScheduler

    settings = ModelSettings(
        name="mlp",
        max_batch_size=32,
        max_batch_time=0.002,
        max_concurrent_batches=1,
        parameters={"extra": {}},
    )
    scheduler = AdaptiveScheduler(Mirror(settings), settings)
    await scheduler.start()
    rows = np.random.default_rng(1).standard_normal((CLIENTS, 1, WIDTH), dtype=np.float32)
    await _clients(requests, CLIENTS, lambda i: scheduler.infer(_request(rows[i])), counted)
    await scheduler.stop()


async def _sequence(requests: int, counted: Callable[[bool], None]) -> None:
    from runtime.scheduling.sequence_batching import SequenceScheduler

    sys.path.insert(0, str(ROOT / "benchmarks" / "models" / "running-sum"))
    from model import RunningSum  # type: ignore[import-not-found,unused-ignore]  # the example folder is on sys.path

    settings = ModelSettings.model_validate_json(
        (ROOT / "benchmarks" / "models" / "running-sum" / "model-settings.json").read_text()
    )
    scheduler = SequenceScheduler(RunningSum(settings), settings)
    await scheduler.start()
    one = np.ones((1,), dtype=np.int64)
    started: set[int] = set()

    def step(i: int) -> Awaitable[InferenceResponse]:
        request = InferenceRequest(
            inputs=[RequestInput(name="x", shape=[1], datatype=Datatype.INT64, data=one)]
        )
        headers = [(b"host", b"127.0.0.1"), (b"ts_request_sequence_id", f"s{i}".encode())]
        if i not in started:
            started.add(i)
            headers.append((b"ts_request_sequence_start", b"true"))
        read_sequence_headers(request, headers)
        return scheduler.infer(request)

    await _clients(requests, SEQUENCES, step, counted)
    await scheduler.stop()


async def _sequence_stream(requests: int, counted: Callable[[bool], None]) -> None:
    from runtime.scheduling.sequence_batching import SequenceScheduler

    sys.path.insert(0, str(ROOT / "benchmarks" / "models" / "running-sum"))
    from model import RunningSum

    settings = ModelSettings.model_validate_json(
        (ROOT / "benchmarks" / "models" / "running-sum" / "model-settings.json").read_text()
    )
    scheduler = SequenceScheduler(RunningSum(settings), settings)
    await scheduler.start()
    one = np.ones((1,), dtype=np.int64)
    started: set[int] = set()

    async def steps(total: int) -> AsyncIterator[InferenceRequest]:
        for k in range(total):
            i = k % SEQUENCES
            request = InferenceRequest(
                id=str(k), inputs=[RequestInput(name="x", shape=[1], datatype=Datatype.INT64, data=one)]
            )
            headers = [(b"host", b"127.0.0.1"), (b"ts_request_sequence_id", f"s{i}".encode())]
            if i not in started:
                started.add(i)
                headers.append((b"ts_request_sequence_start", b"true"))
            read_sequence_headers(request, headers)
            yield request

    for total, on in ((WARM_UP, False), (requests, True)):
        counted(on)
        answered = 0
        async for response in scheduler.stream(steps(total)):
            assert isinstance(response, InferenceResponse) and response.outputs, response
            answered += 1
        assert answered == total, answered
        counted(False)
    await scheduler.stop()


async def _clients(
    requests: int,
    clients: int,
    send: Callable[[int], Awaitable[InferenceResponse]],
    counted: Callable[[bool], None],
) -> None:
    """``clients`` closed loops sharing ``WARM_UP`` requests, then ``requests`` counted ones."""
    for total, on in ((WARM_UP, False), (requests, True)):
        counted(on)
        await _loops(total, clients, send)
        counted(False)


async def _loops(total: int, clients: int, send: Callable[[int], Awaitable[InferenceResponse]]) -> None:
    left = [total]

    async def client(i: int) -> None:
        while left[0] > 0:
            left[0] -= 1
            response = await send(i)
            assert response.outputs, response

    await asyncio.gather(*(client(i) for i in range(clients)))


def _callgrind(on: bool) -> None:
    pid = str(os.getpid())
    if on:
        subprocess.run(["callgrind_control", "-i", "on", pid], capture_output=True, check=True)
        subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
    elif _callgrind.armed:  # type: ignore[attr-defined]
        subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True)
        subprocess.run(["callgrind_control", "-i", "off", pid], capture_output=True, check=True)
    _callgrind.armed = on  # type: ignore[attr-defined]


_callgrind.armed = False  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("path", choices=["adaptive", "sequence", "sequence-stream"])
    parser.add_argument("--requests", type=int, default=20000)
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--instructions", action="store_true", help="count instructions per request (callgrind)")
    how.add_argument("--profile", action="store_true", help="cProfile's calls per request")
    parser.add_argument("--top", type=int, default=25, help="--profile: functions shown")
    parser.add_argument("--under-callgrind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    run = {"adaptive": _adaptive, "sequence": _sequence, "sequence-stream": _sequence_stream}[args.path]
    if args.instructions:
        with tempfile.TemporaryDirectory() as tmp:
            command = [
                *("valgrind", "--tool=callgrind", "--instr-atstart=no"),
                f"--callgrind-out-file={tmp}/out.%p",
                sys.executable,
                str(Path(__file__).resolve()),
                args.path,
                "--requests",
                str(args.requests),
                "--under-callgrind",
            ]
            env = {**os.environ, "PYTHONHASHSEED": "0"}
            subprocess.run(command, check=True, env=env, stderr=subprocess.DEVNULL)
            dumps = [p for p in Path(tmp).glob("out.*") if p.name.count(".") == 2]
            total = max(_total(p) for p in dumps)
        print(f"{args.path}: {total / args.requests:.0f} instructions per request")
        return 0
    profile = cProfile.Profile() if args.profile else None
    cpu: list[float] = []

    def counted(on: bool) -> None:
        if args.under_callgrind:
            _callgrind(on)
        if on:
            gc.collect()
            cpu.append(time.process_time())
            if profile is not None:
                profile.enable()
        elif len(cpu) == 1:
            if profile is not None:
                profile.disable()
            cpu.append(time.process_time())

    import uvloop  # the server's loop

    uvloop.run(run(args.requests, counted))
    if args.under_callgrind:
        return 0
    print(f"{args.path}: {(cpu[1] - cpu[0]) / args.requests * 1e6:.1f} us CPU per request")
    if profile is not None:
        stats = pstats.Stats(profile)
        calls = sum(entry[1] for entry in stats.stats.values())  # type: ignore[attr-defined]
        print(f"{calls / args.requests:.1f} function calls per request")
        stats.sort_stats("tottime").print_stats(args.top)
    return 0


def _total(dump: Path) -> int:
    total = 0
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            total = max(total, int(line.split()[1]))
    return total


if __name__ == "__main__":
    sys.exit(main())
