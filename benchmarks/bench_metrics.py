"""What the metrics cost: REST echo throughput with metrics on and off, in one run.

    python3 benchmarks/bench_metrics.py [--seconds 1.5] [--rounds 6] [--connections 16]

Two servers of the example models run as separate processes on 127.0.0.1: one with the defaults
(metrics on: every request counted per model and per route, /metrics served) and one started
with ``--metrics-endpoint ''`` (metrics off: nothing counted). The same client loads them in
alternating rounds, so that a change in the machine's load falls on both alike. Printed: each
server's throughput over all rounds and its CPU time per request (read from /proc, the steadier
figure on a shared machine), and the ratios (target: metrics on at most 5 % lower).

Then, since a busy machine blurs a difference of a few percent, the time the metrics add to one
REST infer request is measured alone, in this process: the REST wrapper around a trivial ASGI app
and the DataPlane's observer around a trivial coroutine, against the same without them (CPU
time, best of 5 runs of 100 000 calls), as a share of the server's CPU time per request above.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.loadgen import compare, echo_body, echo_options, median_ratio  # noqa: E402
from runtime.observability.access import ObservedApp  # noqa: E402
from runtime.observability.counts import Recorder  # noqa: E402
from runtime.observability.observer import Observer  # noqa: E402
from runtime.registry import Registry  # noqa: E402
from runtime.settings import ModelSettings  # noqa: E402
from tests.servers import start_server  # noqa: E402


async def added_cost(calls: int = 100_000) -> float:
    """Microseconds of CPU the metrics add to one REST infer request (wrapper + observer)."""
    registry = Registry()
    await registry.load(ModelSettings(name="echo", implementation="tests.models.zoo.Echo"))
    recorder = Recorder()
    observer = Observer(registry, recorder, None)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["endpoint"], scope["path_params"] = app, {"model_name": "echo"}
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message: Any) -> None:
        pass

    async def work() -> int:
        return 1

    def scope() -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": "/v2/models/echo/infer", "headers": []}

    wrapped = ObservedApp(app, recorder, False, None)
    cases: dict[str, Callable[[], Awaitable[Any]]] = {
        "bare app": lambda: app(scope(), None, send),
        "observed app": lambda: wrapped(scope(), None, send),
        "bare infer": work,
        "observed infer": lambda: observer.infer("echo", None, work()),
    }
    best: dict[str, float] = {}
    for _ in range(5):
        for label, call in cases.items():
            began = time.process_time()
            for _ in range(calls):
                await call()
            best[label] = min(best.get(label, math.inf), (time.process_time() - began) / calls)
    await registry.unload_all()
    return (best["observed app"] - best["bare app"] + best["observed infer"] - best["bare infer"]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    echo_options(parser)
    args = parser.parse_args()
    body = echo_body(args.elements)
    examples = ROOT / "examples" / "models"
    servers = {
        "metrics on": start_server(examples),
        "metrics off": start_server(examples, "--metrics-endpoint", ""),
    }
    try:
        assert (
            "metrics" in servers["metrics on"].endpoints and "metrics" not in servers["metrics off"].endpoints
        )
        targets = {
            label: (int(server.http_address.rsplit(":", 1)[1]), server.process.pid)
            for label, server in servers.items()
        }
        compared = compare(targets, body, args)
        on, off = compared["metrics on"], compared["metrics off"]
        print(
            f"metrics on / off: throughput {on.throughput / off.throughput:.3f} over all rounds, "
            f"{median_ratio(on, off):.3f} median of rounds; "
            f"CPU per request {on.cpu / off.cpu:.3f}  (target: throughput >= 0.95)"
        )
        added = asyncio.run(added_cost())
        print(
            f"CPU the metrics add to one REST infer request, measured alone: {added:.1f} us, "
            f"{added / (off.cpu * 1e6):.1%} of the CPU per request with metrics off"
        )
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
