"""What a shared sequence store costs: steps per second with Redis against the in-process store.

    python3 benchmarks/bench_sequence_store.py [--seconds 6] [--sequences 128] [--transports rest grpc]

Starts a private redis-server on 127.0.0.1 (a free port) and one server with two copies of
``examples/sequences/lstm`` (80 features per frame, 2 LSTM layers of 512, its state two tensors of
2 x 512 floats per sequence): ``lstm`` with ``sequence_store: "memory"`` and ``lstm-redis`` with
``sequence_store: "redis://..."``: each step claims its sequence (a lease), loads the state, and
writes the new state, step count and lease with one fenced, pipelined write (one round trip per
batch each way; the state pickled, tensors as bytes). N clients each run one sequence closed-loop as
in ``bench_sequence.py``; the two models alternate in short slices of one run, so a change of load
on a shared machine weighs on both alike. The ratio redis / memory is the figure of merit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_sequence import EXAMPLE, measure  # noqa: E402
from runtime.grpc.generated import dataplane_pb2_grpc  # noqa: E402
from tests.external import redis_server  # noqa: E402
from tests.servers import RunningServer, start_server  # noqa: E402


def write_models(folder: Path, redis_url: str, max_batch_time: float, threads: int) -> None:
    base = json.loads((EXAMPLE / "model-settings.json").read_text())
    for name, store in (("lstm", "memory"), ("lstm-redis", redis_url)):
        target = folder / name
        target.mkdir()
        shutil.copy(EXAMPLE / "model.py", target / "model.py")
        settings = {**base, "name": name, "sequence_store": store, "max_batch_time": max_batch_time}
        settings["parameters"] = {"extra": {**base["parameters"]["extra"], "torch_threads": threads}}
        (target / "model-settings.json").write_text(json.dumps(settings))


async def run(server: RunningServer, args: argparse.Namespace) -> None:
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        targets = {"rest": server.http_address, "grpc": dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)}
        for transport in args.transports:
            for n in args.sequences:
                slices = max(1, args.rounds)
                memory = redis = 0.0
                for r in range(slices):
                    seconds, tag = args.seconds / slices, f"{transport}{n}-{r}"
                    target = targets[transport]
                    memory += (
                        await measure(target, transport, "lstm", n, args.frames, seconds, "m" + tag) / slices
                    )
                    redis += (
                        await measure(target, transport, "lstm-redis", n, args.frames, seconds, "r" + tag)
                        / slices
                    )
                print(
                    f"{transport:4s} N={n:4d}  memory {memory:8.1f} steps/s   redis {redis:8.1f} steps/s   "
                    f"redis/memory {redis / memory:5.2f}",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per configuration")
    parser.add_argument("--frames", type=int, default=10, help="frames (of 80 features) per request")
    parser.add_argument("--sequences", type=int, nargs="+", default=[128])
    parser.add_argument("--max-batch-time", type=float, default=0.005, help="batch window (s)")
    parser.add_argument("--transports", nargs="+", choices=["rest", "grpc"], default=["rest"])
    parser.add_argument("--rounds", type=int, default=3, help="alternating slices per configuration")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads of the server")
    args = parser.parse_args()
    with redis_server() as url, tempfile.TemporaryDirectory() as folder:
        write_models(Path(folder), url, args.max_batch_time, args.torch_threads)
        server = start_server(folder, timeout=120)
        try:
            import uvloop

            print(f"LSTM 80 -> 2 x 512 -> 32, {args.frames} frames per step, Redis at {url}", flush=True)
            uvloop.run(run(server, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
