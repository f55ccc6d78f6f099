"""Tabular models against MLServer 1.7.1 and its runtimes, serving the same files, side by side in one run.

    python3 benchmarks/bench_tabular.py [--mlserver CMD] [--rounds 3] [--seconds 3] [--clients 16]
    python3 -m benchmarks --only tabular [--mlserver CMD]

Two models trained here on generated data (20 features, 3 classes): a scikit-learn
LogisticRegression (``model.joblib``) and an XGBClassifier (``model.json``), each in a folder whose
model-settings.json names MLServer's runtime (``mlserver_sklearn.SKLearnModel``,
``mlserver_xgboost.XGBoostModel``). Three servers, each its own process pinned to the first core
(the load generator on the others):

- ``mlserver``: MLServer 1.7.1 (``mlserver start``) on those folders with ``parallel_workers: 0``,
  its fastest set-up on one core (``OMP_NUM_THREADS=1``, so that XGBoost's threads do not fight
  over the one core). The command comes from ``--mlserver`` or ``BENCH_MLSERVER`` (e.g.
  ``/opt/mlserver-venv/bin/mlserver``); without one, or if it does not run, that side is skipped
  and said so;
- ``ours``: this server on the same folders, unchanged (no batching);
- ``ours batched``: this server on copies whose settings add adaptive batching
  (``max_batch_size`` = the clients, ``max_batch_time`` 2 ms).

Every side first answers one request, and the answers must agree (outputs, datatypes, shapes,
values). Then the load: REST JSON, one row per request, ``--clients`` closed-loop keep-alive
connections, in interleaved rounds (each side of each model in every round, order alternating).
Printed per model and side: requests per second, the server's CPU time per request (from /proc),
requests per server-CPU-second, and the ratios to MLServer of both. Targets: at least 3x
MLServer's requests per CPU-second without batching, 5x with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.loadgen import Result, build_request, exchange, run_load  # noqa: E402
from tests.servers import RunningServer, start_server  # noqa: E402

FEATURES = 20
MODELS = {"lr": "mlserver_sklearn.SKLearnModel", "xgb": "mlserver_xgboost.XGBoostModel"}
UNBATCHED_TARGET = 3.0
BATCHED_TARGET = 5.0


def train(folder: Path) -> dict[str, Any]:
    """The two models, saved under ``folder/lr`` and ``folder/xgb`` with MLServer's settings."""
    import joblib
    import xgboost as xgb
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, FEATURES))
    y = np.digitize(x[:, :3].sum(axis=1) + 0.3 * rng.normal(size=2000), [-1.0, 1.0])
    models: dict[str, Any] = {
        "lr": LogisticRegression(max_iter=1000).fit(x, y),
        "xgb": xgb.XGBClassifier(n_estimators=100, max_depth=4, n_jobs=1).fit(x, y),
    }
    for name, implementation in MODELS.items():
        (folder / name).mkdir(parents=True)
        uri = "./model.joblib" if name == "lr" else "./model.json"
        settings = {"name": name, "implementation": implementation, "parameters": {"uri": uri}}
        (folder / name / "model-settings.json").write_text(json.dumps(settings))
    joblib.dump(models["lr"], folder / "lr" / "model.joblib")
    models["xgb"].save_model(folder / "xgb" / "model.json")
    return models


def batched_copy(source: Path, target: Path, clients: int) -> None:
    shutil.copytree(source, target)
    for name in MODELS:
        path = target / name / "model-settings.json"
        settings = json.loads(path.read_text())
        settings.update(max_batch_size=clients, max_batch_time=0.002)
        path.write_text(json.dumps(settings))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class MLServer:
    """``CMD start FOLDER`` with parallel_workers 0 on free ports; ready once /v2/health/ready is 200."""

    def __init__(self, command: list[str], folder: Path) -> None:
        self.port = free_port()
        (folder / "settings.json").write_text(
            json.dumps(
                {
                    "parallel_workers": 0,
                    "http_port": self.port,
                    "grpc_port": free_port(),
                    "metrics_port": free_port(),
                    "host": "127.0.0.1",
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("MLSERVER_")}
        env["OMP_NUM_THREADS"] = "1"
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [*command, "start", str(folder)], stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=folder
        )
        self.pid = self.process.pid

    def wait_ready(self, timeout: float = 180.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)  # polling another program's readiness: it signals nothing we can wait on
        self.stop()
        self.log.seek(0)
        raise RuntimeError(
            f"MLServer did not become ready:\n{self.log.read().decode(errors='replace')[-3000:]}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def pin(pid: int, cpus: set[int]) -> None:
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(int(tid), cpus)


@dataclass
class Side:
    label: str
    port: int
    pid: int
    results: dict[str, list[Result]] = field(default_factory=dict)

    def rate(self, model: str) -> float:
        return statistics.fmean(r.throughput for r in self.results[model])

    def per_cpu_second(self, model: str) -> float:
        """Requests per second of the server's CPU time (all rounds together)."""
        runs = self.results[model]
        cpu = sum(r.cpu_seconds for r in runs)
        return sum(r.requests for r in runs) / cpu if cpu > 0 else float("nan")


def body(row: np.ndarray) -> bytes:
    return orjson.dumps(
        {"inputs": [{"name": "input-0", "shape": [1, FEATURES], "datatype": "FP64", "data": row.tolist()}]}
    )


def mlserver_command(given: str | None) -> tuple[list[str] | None, str]:
    """The MLServer command to run, or None with the reason it is skipped."""
    text = given or os.environ.get("BENCH_MLSERVER")
    if not text:
        return None, "no MLServer command (give --mlserver CMD or BENCH_MLSERVER=CMD): its side is skipped"
    command = shlex.split(text)
    if shutil.which(command[0]) is None:
        return None, f"MLServer command {command[0]!r} not found: its side is skipped"
    return command, ""


async def check(sides: list[Side], request: Callable[[int, str], bytes]) -> None:
    """Every side answers each model alike (the same outputs, datatypes, shapes and values)."""
    for model in MODELS:
        answers = []
        for side in sides:
            status, _, answer = await exchange("127.0.0.1", side.port, request(side.port, model))
            if status != 200:
                raise RuntimeError(f"{side.label} answered {status} for {model}: {answer[:300]!r}")
            outputs = orjson.loads(answer)["outputs"]
            answers.append([(o["name"], o["datatype"], o["shape"], o["data"]) for o in outputs])
        for side, outputs_of_side in zip(sides[1:], answers[1:], strict=True):
            if outputs_of_side != answers[0]:
                raise RuntimeError(
                    f"{side.label} answers {model} {outputs_of_side}, {sides[0].label} {answers[0]}"
                )


async def measure(sides: list[Side], args: argparse.Namespace, request: Callable[[int, str], bytes]) -> None:
    await check(sides, request)
    for round_ in range(args.rounds):
        for model in MODELS:
            for side in sides if round_ % 2 == 0 else list(reversed(sides)):
                result = await run_load(
                    "127.0.0.1",
                    side.port,
                    request(side.port, model),
                    args.clients,
                    args.seconds,
                    args.warmup,
                    side.pid,
                )
                side.results.setdefault(model, []).append(result)
        print(f"  round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)


def report(sides: list[Side], args: argparse.Namespace) -> bool:
    baseline = next((s for s in sides if s.label == "mlserver"), None)
    print(
        "| model | server | req/s | server CPU us/req | req per CPU-second | vs MLServer req/s "
        "| vs MLServer req per CPU-second | target | |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    met = True
    for model in MODELS:
        for side in sides:
            rate, per_cpu = side.rate(model), side.per_cpu_second(model)
            errors = sum(r.errors for r in side.results[model])
            ratio_rate = ratio_cpu = target = verdict = ""
            if baseline is not None and side is not baseline:
                ratio_rate = f"{rate / baseline.rate(model):.2f}x"
                cpu_ratio = per_cpu / baseline.per_cpu_second(model)
                ratio_cpu = f"**{cpu_ratio:.2f}x**"
                goal = BATCHED_TARGET if "batched" in side.label else UNBATCHED_TARGET
                target = f">= {goal:g}x"
                verdict = "met" if cpu_ratio >= goal else "NOT met"
                met &= cpu_ratio >= goal
            print(
                f"| {model} | {side.label} | {rate:.0f} | {1e6 / per_cpu:.0f} | {per_cpu:.0f} | {ratio_rate} "
                f"| {ratio_cpu} | {target} | {verdict}{f', {errors} errors' if errors else ''} |"
            )
    for side in sides:
        first = next((r.first_error for runs in side.results.values() for r in runs if r.first_error), "")
        if first:
            print(f"{side.label}: first error: {first}")
    return met


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    parser.add_argument("--clients", type=int, default=16, help="closed-loop keep-alive connections")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--no-pin", action="store_true", help="leave every process on every core")
    return parser.parse_args(argv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``python3 -m benchmarks`` takes for this row too."""
    parser.add_argument(
        "--mlserver",
        metavar="CMD",
        help="MLServer's command (default: $BENCH_MLSERVER); without it, no MLServer side",
    )


def run(args: argparse.Namespace) -> int:
    """Start the servers, check, measure, print the table; 0 when every target is met."""
    command, skipped = mlserver_command(args.mlserver)
    cpus = sorted(os.sched_getaffinity(0))
    pinned = len(cpus) >= 2 and not args.no_pin
    tmp = Path(tempfile.mkdtemp(prefix="bench-tabular-"))
    ours: list[RunningServer] = []
    mlserver: MLServer | None = None
    try:
        models = tmp / "models"
        train(models)
        batched_copy(models, tmp / "batched", args.clients)
        sides: list[Side] = []
        if command is not None:
            shutil.copytree(models, tmp / "mlserver")
            mlserver = MLServer(command, tmp / "mlserver")
        for label, folder in (("ours", models), ("ours batched", tmp / "batched")):
            server = start_server(folder, timeout=180)
            ours.append(server)
            sides.append(Side(label, int(server.endpoints["http"].rsplit(":", 1)[1]), server.process.pid))
        if mlserver is not None:
            try:
                mlserver.wait_ready()
                sides.insert(0, Side("mlserver", mlserver.port, mlserver.pid))
            except RuntimeError as exc:
                skipped = f"MLServer did not start, its side is skipped: {exc}"
                mlserver = None
        if pinned:
            for side in sides:
                pin(side.pid, {cpus[0]})
            pin(os.getpid(), set(cpus[1:]))
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
            + (f"servers pinned to CPU {cpus[0]}, load generator to {cpus[1:]}" if pinned else "no pinning")
            + f"; {args.rounds} interleaved rounds of {args.seconds:g} s (+{args.warmup:g} s warm-up); "
            f"{args.clients} clients, one row per request (REST JSON); load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if skipped:
            print(skipped, flush=True)
        row = np.random.default_rng(7).normal(size=FEATURES)
        payload = body(row)

        def request(port: int, model: str) -> bytes:
            return build_request(
                "127.0.0.1", port, f"/v2/models/{model}/infer", payload, {"Content-Type": "application/json"}
            )

        import uvloop

        uvloop.run(measure(sides, args, request))
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        met = report(sides, args)
    finally:
        for server in ours:
            server.stop()
        if mlserver is not None:
            mlserver.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if skipped:
        print("tabular: targets not checked (no MLServer side)")
        return 0
    print("tabular: every target met" if met else "tabular: some targets not met")
    return 0 if met else 1


def main() -> int:
    return run(arguments())


if __name__ == "__main__":
    sys.exit(main())
