"""A hot model beside a stream of cold loads: what loading on demand and evicting cost the hot path.

    python3 benchmarks/bench_many_models.py [--rounds 3] [--seconds 3] [--cold-mib 8] [--every 0.1] [--no-pin]
    python3 -m benchmarks --only many-models

One server process (``mlserver-like start``, 127.0.0.1, free ports, ``--no-load-models-at-startup
--max-loaded-models 2``) serves a repository of ``tests/models/ballast.py`` models: ``hot`` (1 MiB)
and ``--cold`` others of ``--cold-mib`` MiB each. Two sides, in interleaved rounds of the same run:

- **alone**: one client calls ``hot`` in a closed loop (keep-alive REST, one FP64 value);
- **beside cold loads**: the same loop, while a second client asks the next cold model every
  ``--every`` seconds (round robin): with room for two models, each of its requests is a load on
  demand (the previous cold model is the least recently used idle one: an eviction too).

Every answer is checked (x + k). The server is pinned to the first core and this process to the
others (``--no-pin``: every process on every core). It prints the hot loop's p50 and p99 on each
side, their ratios (targets: p50 within 1.2x, p99 within 2x), and the loads and evictions the
cold client caused (from the server's metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.loadgen import Result, build_request, exchange, read_response  # noqa: E402
from tests.servers import start_server  # noqa: E402

P50_TARGET = 1.2
P99_TARGET = 2.0


def write_repository(folder: Path, cold: int, cold_mib: float) -> None:
    models: dict[str, dict[str, Any]] = {"hot": {"k": 1, "mib": 1}}
    models.update({f"cold{i}": {"k": 1000 + i, "mib": cold_mib} for i in range(cold)})
    for name, extra in models.items():
        (folder / name).mkdir()
        settings = {
            "name": name,
            "implementation": "tests.models.ballast.Ballast",
            "parameters": {"extra": extra},
        }
        (folder / name / "model-settings.json").write_text(json.dumps(settings))


def infer(port: int, model: str, x: float) -> bytes:
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [x]}]})
    return build_request("127.0.0.1", port, f"/v2/models/{model}/infer", body)


def answer_of(body: bytes) -> float:
    return float(orjson.loads(body)["outputs"][0]["data"][0])


async def hot_loop(port: int, seconds: float, result: Result) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = infer(port, "hot", 2.0)
    try:
        stop_at = time.perf_counter() + seconds
        while (start := time.perf_counter()) < stop_at:
            writer.write(request)
            status, _, body = await read_response(reader)
            result.latencies.append(time.perf_counter() - start)
            result.requests += 1
            if status != 200 or answer_of(body) != 3.0:
                result.error(f"hot: {status} {body[:200]!r}")
    finally:
        writer.close()


async def cold_client(port: int, seconds: float, every: float, cold: int, first: int, result: Result) -> int:
    """Ask the next cold model every ``every`` seconds; return how many it asked."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    asked = 0
    try:
        begin = time.perf_counter()
        while time.perf_counter() - begin < seconds:
            i = (first + asked) % cold
            start = time.perf_counter()
            writer.write(infer(port, f"cold{i}", 5.0))
            status, _, body = await read_response(reader)
            result.latencies.append(time.perf_counter() - start)
            asked += 1
            if status != 200 or answer_of(body) != 1005.0 + i:
                result.error(f"cold{i}: {status} {body[:200]!r}")
            next_at = begin + asked * every
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    finally:
        writer.close()
    return asked


def metric(text: str, name: str, label: str = "") -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and (line[len(name)] in "{ ") and label in line
    )


async def scrape(metrics: str) -> str:
    host, _, port = metrics.partition(":")
    request = f"GET /metrics HTTP/1.1\r\nHost: {metrics}\r\n\r\n".encode()
    _, _, body = await exchange(host, int(port), request)
    return body.decode()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def measure(
    port: int, metrics: str, rounds: int, seconds: float, every: float, cold: int
) -> dict[str, Any]:
    alone, beside, colds = Result(), Result(), Result()
    await hot_loop(port, 0.5, Result())  # warm the connection path and the hot model
    before = await scrape(metrics)
    asked = 0
    for number in range(rounds):
        sides = ["alone", "beside"] if number % 2 == 0 else ["beside", "alone"]
        for side in sides:
            if side == "alone":
                await hot_loop(port, seconds, alone)
            else:
                _, n = await asyncio.gather(
                    hot_loop(port, seconds, beside), cold_client(port, seconds, every, cold, asked, colds)
                )
                asked += n
    after = await scrape(metrics)
    evicted = metric(after, "model_unloads_total", 'reason="evicted"') - metric(
        before, "model_unloads_total", 'reason="evicted"'
    )
    loads = metric(after, "model_loads_total") - metric(before, "model_loads_total")
    ms = 1000.0
    return {
        "alone": (
            percentile(alone.latencies, 0.5) * ms,
            percentile(alone.latencies, 0.99) * ms,
            alone.requests,
        ),
        "beside": (
            percentile(beside.latencies, 0.5) * ms,
            percentile(beside.latencies, 0.99) * ms,
            beside.requests,
        ),
        "cold_requests": asked,
        "cold_p50_ms": statistics.median(colds.latencies) * ms if colds.latencies else float("nan"),
        "loads": loads,
        "evictions": evicted,
        "errors": alone.errors + beside.errors + colds.errors,
        "first_error": alone.first_error or beside.first_error or colds.first_error,
    }


def pin(pid: int, cpus: set[int]) -> None:
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(int(tid), cpus)


def run(
    rounds: int = 3,
    seconds: float = 3.0,
    cold: int = 30,
    cold_mib: float = 8.0,
    every: float = 0.1,
    pinned: bool = True,
) -> dict[str, Any]:
    """One run of both sides; the figures (``python3 -m benchmarks --only many-models`` calls this)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = pinned and len(cpus) >= 2
    with tempfile.TemporaryDirectory() as tmp:
        write_repository(Path(tmp), cold, cold_mib)
        server = start_server(tmp, "--no-load-models-at-startup", "--max-loaded-models", "2")
        try:
            if pinned:
                pin(server.process.pid, {cpus[0]})
                os.sched_setaffinity(0, set(cpus[1:]))
            figures = asyncio.run(
                measure(
                    int(server.http_address.rsplit(":", 1)[1]),
                    server.endpoints["metrics"],
                    rounds,
                    seconds,
                    every,
                    cold,
                )
            )
        finally:
            server.stop()
            if pinned:
                os.sched_setaffinity(0, set(cpus))
    figures["pinned"] = pinned
    return figures


def report(figures: dict[str, Any]) -> bool:
    """Print the table; return whether both targets were met."""
    (a50, a99, an), (b50, b99, bn) = figures["alone"], figures["beside"]
    r50, r99 = b50 / a50, b99 / a99
    met50, met99 = r50 <= P50_TARGET, r99 <= P99_TARGET
    print("| hot loop (1 client) | p50 ms | p99 ms | requests |")
    print("|---|---|---|---|")
    print(f"| alone | {a50:.3f} | {a99:.3f} | {an} |")
    print(f"| beside a cold load every 100 ms | {b50:.3f} | {b99:.3f} | {bn} |")
    print(
        f"| **ratio** | **{r50:.2f}** (target <= {P50_TARGET:g}: {'met' if met50 else 'NOT met'}) "
        f"| **{r99:.2f}** (target <= {P99_TARGET:g}: {'met' if met99 else 'NOT met'}) | |"
    )
    print(
        f"cold client: {figures['cold_requests']} requests (p50 {figures['cold_p50_ms']:.1f} ms), "
        f"{figures['loads']:.0f} loads and {figures['evictions']:.0f} evictions in the server; "
        f"{figures['errors']} errors{': ' + figures['first_error'] if figures['errors'] else ''}; "
        f"{'server pinned to one core, client to the others' if figures['pinned'] else 'no pinning'}"
    )
    return met50 and met99 and not figures["errors"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each side")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per side and round")
    parser.add_argument("--cold", type=int, default=30, help="cold models, asked round robin")
    parser.add_argument("--cold-mib", type=float, default=8.0, help="MiB each cold model allocates at load")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between two cold requests")
    parser.add_argument("--no-pin", action="store_true", help="leave every process on every core")
    args = parser.parse_args()
    figures = run(args.rounds, args.seconds, args.cold, args.cold_mib, args.every, not args.no_pin)
    met = report(figures)
    print("every target met" if met else "some targets not met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
