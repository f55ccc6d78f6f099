"""What the metrics cost: REST echo throughput with metrics on and off, in one run.

    python3 benchmarks/bench_metrics.py [--seconds 1.5] [--rounds 6] [--connections 16]

Two servers of the example models run as separate processes on 127.0.0.1: one with the defaults
(metrics on: every request counted per model and per route, /metrics served) and one started
with ``--metrics-endpoint ''`` (metrics off: nothing counted). The same client loads them in
alternating rounds, so that a change in the machine's load falls on both alike. Printed: each
server's throughput over all rounds and its CPU time per request (read from /proc, the steadier
figure on a shared machine), and the ratios (target: metrics on at most 5 % lower).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_rest import measure  # noqa: E402
from tests.servers import start_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements in the echoed tensor")
    args = parser.parse_args()

    body = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [1, args.elements], "datatype": "FP32", "data": [0.5] * args.elements}
            ]
        }
    )
    examples = ROOT / "examples" / "models"
    servers = {
        "metrics on": start_server(examples),
        "metrics off": start_server(examples, "--metrics-endpoint", ""),
    }
    try:
        assert (
            "metrics" in servers["metrics on"].endpoints and "metrics" not in servers["metrics off"].endpoints
        )
        rounds: dict[str, list] = {label: [] for label in servers}  # type: ignore[type-arg]
        for _ in range(args.rounds):
            for label, server in servers.items():
                port = int(server.http_address.rsplit(":", 1)[1])
                rounds[label].append(measure(port, server.process.pid, body, args.connections, args.seconds))
        totals = {}
        for label, results in rounds.items():
            requests = sum(r.requests for r, _ in results)
            seconds = sum(r.seconds for r, _ in results)
            cpu = statistics.median(c for _, c in results)
            totals[label] = (requests / seconds, cpu)
            print(
                f"{label:>12}: {requests / seconds:8.0f} req/s  CPU {cpu * 1e6:5.0f} us/request  "
                f"errors {sum(r.errors for r, _ in results)}"
            )
        per_round = [
            a.throughput / b.throughput
            for (a, _), (b, _) in zip(rounds["metrics on"], rounds["metrics off"], strict=True)
        ]
        on, off = totals["metrics on"], totals["metrics off"]
        print(
            f"metrics on / off: throughput {on[0] / off[0]:.3f} over all rounds, "
            f"{statistics.median(per_round):.3f} median of rounds; "
            f"CPU per request {on[1] / off[1]:.3f}  (target: throughput >= 0.95)"
        )
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
