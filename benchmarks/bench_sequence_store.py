"""What a shared sequence store costs: steps per second with Redis against the in-process store.

    python3 benchmarks/bench_sequence_store.py [--seconds 6] [--sequences 128] [--transports rest grpc]
    python3 benchmarks/bench_sequence_store.py --hidden 8 --layers 1 --frames 1   # a light model


Starts a private redis-server on 127.0.0.1 (a free port) and one server with two copies of
``examples/sequences/lstm`` (80 features per frame, 2 LSTM layers of 512, its state two tensors of
2 x 512 floats per sequence): ``lstm`` with ``sequence_store: "memory"`` and ``lstm-redis`` with
``sequence_store: "redis://..."``: a batch's steps of sequences the replica does not hold under a
fresh lease are claimed (a lease) and their states loaded with one script call, and every batch
writes its new states, step counts and leases with one fenced script call (one round trip per
batch; the states pickled, tensors as their bytes). N clients each run one sequence closed-loop as
in ``bench_sequence.py``; the two models alternate in short slices of one run, so a change of load
on a shared machine weighs on both alike. The ratio redis / memory is the figure of merit. With a
light model (``--hidden 8 --layers 1 --frames 1``) the server's own work per step dominates, which
is where the store's cost shows most.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_sequence import arguments, bench  # noqa: E402
from tests.external import redis_server  # noqa: E402


def main() -> None:
    args = arguments(__doc__, seconds=6.0, sequences=[128], transports=["rest"], rounds=3)
    with redis_server() as url:
        store = {"max_batch_time": args.max_batch_time}
        bench(
            args,
            {"lstm": {**store, "sequence_store": "memory"}, "lstm-redis": {**store, "sequence_store": url}},
            f"LSTM 80 -> {args.layers} x {args.hidden} -> 32, {args.frames} frames per step, Redis at {url}",
            lambda transport, n, memory, redis: (
                f"{transport:4s} N={n:4d}  memory {memory:8.1f} steps/s   redis {redis:8.1f} steps/s   "
                f"redis/memory {redis / memory:5.2f}"
            ),
        )


if __name__ == "__main__":
    main()
