"""The benchmark: this server against the bare ceilings, side by side in one run.

    python3 -m benchmarks [--quick] [--only rest,rest-1,grpc,torch,sequence,startup,memory,tabular,many-models,llm]
                          [--rounds 3] [--seconds 3] [--no-pin] [--baseline OTHER_CHECKOUT]
                          [--mlserver MLSERVER_COMMAND]

Every server runs as its own process on 127.0.0.1 with free ports: this server (``mlserver-like
start``) on the folders each row needs, and the bare ceilings of ``benchmarks/bare.py`` (bare
Starlette + uvicorn, bare grpc.aio, a bare unbatched torch server). Where the machine has two
cores or more, every server is pinned to the first core and the load generator (this process) to
the others, so that the client does not take the server's CPU. The rows are measured in
interleaved rounds (in every round each row measures both sides, in alternating order), so that a
change in the machine's load falls on both alike; each ratio is taken within this run, from the
means of its rounds. Absolute figures are printed too, but only the ratios compare across runs.

Rows (``--only`` picks some):

- ``rest``: REST infer of the echo model, one FP32 [1, 16] tensor as JSON, 16 keep-alive clients,
  against bare Starlette + uvicorn answering the same document;
- ``rest-1``: the same with one client;
- ``grpc``: gRPC ModelInfer of the echo model (raw FP32 [1, 16]), 16 calls in flight, against a
  bare grpc.aio servicer;
- ``torch``: the torch MLP 256 -> 1024 -> 256 with adaptive batching, 64 clients sending one row
  each (binary tensor extension), against the bare unbatched server running the same MLP inline;
- ``sequence``: 128 concurrent running-sum sequences (``benchmarks/models/running-sum``,
  sequence id and flags in TorchServe's HTTP headers) against stateless echo requests to the
  same server at the same concurrency;
- ``startup``: cold start to ready of the echo model alone, and of the torch examples against
  ``import torch`` (+ 0.3 s is the target); medians of interleaved starts;
- ``memory``: resident memory of the idle echo-only server (and of the bare Starlette server);
- ``tabular``: a scikit-learn LogisticRegression and an XGBClassifier served by this server
  (unbatched, and with adaptive batching) and by MLServer 1.7.1 (``--mlserver CMD`` or
  ``BENCH_MLSERVER``; without it that side is skipped) on the same files, ``--clients`` clients
  sending one row each: requests per server-CPU-second against MLServer's
  (``benchmarks/bench_tabular.py``, its own table, printed after the others);
- ``many-models``: a hot model's p50 and p99 beside a client asking a cold model every 100 ms
  (each a load on demand and an eviction) against the same hot loop alone
  (``benchmarks/bench_many_models.py``; targets: within 1.2x and 2x);
- ``llm``: a Hugging Face language model of a few million weights, 16 streamed OpenAI completions
  of 64 tokens on the server's one core, against ``model.generate`` one request at a time and on
  one static batch (``benchmarks/bench_llm.py``, which runs alone too); needs the ``llm`` extra.

``--instructions N`` times nothing: it counts, with valgrind's callgrind, the instructions per REST
and per gRPC echo request over N requests (benchmarks/instructions.py), of this checkout and, with
``--baseline``, of the other one: figures that hardly move with the machine's load, each the median
of ``--instruction-starts K`` (3) starts of the side's server, printed net of the event loop's clocks
and raw. ``--server-args ARGS`` starts both sides' servers with more arguments: both at one value of
a default that changed between them (``--loop-block-warning 0.5``, the watchdog's clock), say.
``--start-instructions [FOLDER]`` counts likewise the instructions of a server from its start to its
ready line (every thread; the echo model unless FOLDER is given): the start-up rows' steady figure.

``--baseline DIR`` adds a third side to every row: the server of another checkout of this project
(``git worktree add /tmp/before <commit>``), on the same folders, in the same interleaved rounds,
so that a change's before and after come from one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import bench_tabular  # noqa: E402
from benchmarks import instructions as counting  # noqa: E402
from benchmarks.loadgen import (  # noqa: E402
    Result,
    Script,
    build_request,
    echo_body,
    exchange,
    run_grpc_load,
    run_load,
)
from tests.servers import RunningServer, start_server  # noqa: E402

ROWS = ["rest", "rest-1", "grpc", "torch", "sequence", "startup", "memory", "tabular", "many-models", "llm"]
TARGETS = {"rest": 0.8, "rest-1": 0.9, "grpc": 0.9, "torch": 1.5, "sequence": 0.85}
START_TARGET_S = 0.3  # echo alone: at most this; torch examples: at most import torch + this
RSS_TARGET_MIB = 50.0
ECHO = ROOT / "examples" / "models" / "echo"
BENCH_MODELS = ROOT / "benchmarks" / "models"


# ---------------------------------------------------------------------- processes and pinning


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` to ``cpus`` (threads it starts later inherit it)."""
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(int(tid), cpus)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Bare:
    """A bare ceiling (``python3 -m benchmarks.bare KIND``) as a process; its port read back."""

    def __init__(self, kind: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bare", kind, *args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the bare {kind} server did not start: {line!r}")
        self.port = int(line)
        self.pid = self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def launch(folder: Path, checkout: Path, env: dict[str, str] | None = None) -> RunningServer:
    """``mlserver-like start FOLDER`` of the checkout ``checkout`` on free loopback ports, once ready."""
    if checkout == ROOT:
        return start_server(folder, timeout=180, env=env)
    process = subprocess.Popen(
        counting.server_command(checkout, folder),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=checkout,  # python -m puts the working directory first: that checkout's runtime
    )
    server = RunningServer(process)
    if not server._wait(lambda: bool(server.endpoints), 180):
        server.stop(signal.SIGKILL)
        raise RuntimeError(f"the server of {checkout} did not become ready:\n{server.read_log()}")
    return server


def port_of(server: RunningServer, transport: str = "http") -> int:
    return int(server.endpoints[transport].rsplit(":", 1)[1])


# ---------------------------------------------------------------------- rows


@dataclass
class Side:
    label: str
    pid: int
    load: Callable[[float, float], Awaitable[Result]]
    """(seconds, warm-up seconds) -> the counted result."""
    results: list[Result] = field(default_factory=list)

    def mean(self) -> float:
        return statistics.fmean(r.throughput for r in self.results)


@dataclass
class Extra:
    """A row measured once rather than under load (start-up, memory)."""

    work: str
    ours: str
    ceiling: str
    ratio: str
    target: str
    met: bool
    before: str = ""


@dataclass
class Row:
    key: str
    work: str
    ours: Side
    ceiling: Side
    before: Side | None = None
    """The same work on the server of the ``--baseline`` checkout."""
    before_ceiling: Side | None = None
    """The ceiling of ``before`` where it is not the same as ours (the baseline's own echo)."""

    def sides(self) -> list[Side]:
        extra = [self.before, self.before_ceiling]
        return [self.ours, self.ceiling] + [side for side in extra if side is not None]

    def _pair(self, before: bool) -> tuple[Side, Side]:
        if before:
            assert self.before is not None
            return self.before, self.before_ceiling or self.ceiling
        return self.ours, self.ceiling

    def ratios(self, before: bool = False) -> list[float]:
        side, ceiling = self._pair(before)
        return [
            o.throughput / c.throughput if c.throughput else float("nan")
            for o, c in zip(side.results, ceiling.results, strict=True)
        ]

    def ratio(self, before: bool = False) -> float:
        side, ceiling = self._pair(before)
        return side.mean() / ceiling.mean() if ceiling.mean() else float("nan")


def binary_request(host: str, port: int, model: str, rows: np.ndarray) -> bytes:
    """An infer request with the binary tensor extension both ways, as tritonclient sends it."""
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": rows.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    return build_request(
        host,
        port,
        f"/v2/models/{model}/infer",
        header + rows.astype("<f4").tobytes(),
        {"Inference-Header-Content-Length": str(len(header))},
    )


def binary_output(headers: dict[str, str], body: bytes) -> np.ndarray:
    size = int(headers.get("inference-header-content-length", len(body)))
    shape = orjson.loads(body[:size])["outputs"][0]["shape"]
    return np.frombuffer(body[size:], dtype="<f4").reshape(shape)


def http_side(
    label: str, port: int, pid: int, request: bytes | Callable[[], list[Script]], clients: int
) -> Side:
    async def load(seconds: float, warmup: float) -> Result:
        scripts = request if isinstance(request, bytes) else request()
        return await run_load("127.0.0.1", port, scripts, clients, seconds, warmup, pid)

    return Side(label, pid, load)


class GrpcTarget:
    """A grpc.aio channel to one server, opened on first use (in the event loop that uses it)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel: Any = None

    def stub(self) -> Any:
        import grpc

        from benchmarks.bare import GRPC_OPTIONS
        from runtime.frontends.grpc.generated import dataplane_pb2_grpc

        if self.channel is None:
            self.channel = grpc.aio.insecure_channel(self.address, options=GRPC_OPTIONS)
        return dataplane_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()


def grpc_side(label: str, target: GrpcTarget, pid: int, request: Any, concurrency: int) -> Side:
    async def load(seconds: float, warmup: float) -> Result:
        return await run_grpc_load(target.stub(), request, concurrency, seconds, warmup, pid)

    return Side(label, pid, load)


class Bench:
    """Starts what the chosen rows need, checks their answers, measures, prints, stops."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rows = args.only
        self.servers: list[RunningServer] = []
        self.bares: list[Bare] = []
        self.grpc_targets: list[GrpcTarget] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="bench-"))
        self.notes: list[str] = []
        cpus = sorted(os.sched_getaffinity(0))
        self.pinned = len(cpus) >= 2 and not args.no_pin
        self.server_cpus = {cpus[0]} if self.pinned else set(cpus)
        self.load_cpus = set(cpus[1:]) if self.pinned else set(cpus)
        self.baseline: Path | None = Path(args.baseline).resolve() if args.baseline else None
        for checkout in [ROOT] + ([self.baseline] if self.baseline else []):
            # as installed: pip compiles a package's modules to bytecode; a checkout run with
            # PYTHONDONTWRITEBYTECODE=1 would compile the server's own modules again at every start
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "runtime")], check=True)

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        for bare in self.bares:
            bare.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- processes

    def ours(self, folder: Path, env: dict[str, str] | None = None, before: bool = False) -> RunningServer:
        """This checkout's server on ``folder`` (``before``: the baseline checkout's)."""
        checkout = self.baseline if before and self.baseline is not None else ROOT
        if env and "PYTHONPATH" in env:
            env = {**env, "PYTHONPATH": env["PYTHONPATH"].replace(str(ROOT), str(checkout), 1)}
        server = launch(folder, checkout, env)
        self.servers.append(server)
        return server

    def bare(self, kind: str, *args: str) -> Bare:
        bare = Bare(kind, *args)
        self.bares.append(bare)
        return bare

    def pin_all(self) -> None:
        if not self.pinned:
            return
        for pid in [s.process.pid for s in self.servers] + [b.pid for b in self.bares]:
            pin(pid, self.server_cpus)
        pin(os.getpid(), self.load_cpus)

    # ---- startup and memory (measured before any load, with nothing else busy)

    def startup(self) -> list[Extra]:
        repeats = self.args.starts
        torch_folder = self.tmp / "torch-examples"
        built = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "torch" / "build.py"), str(torch_folder)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if built.returncode != 0:
            raise RuntimeError(f"building the torch examples failed:\n{built.stderr}")
        # what torch itself costs: the import, and the import plus loading one exported program
        # (torch.export.load imports torch._dynamo and sympy on first use)
        export = torch_folder / "mlp-export" / "mlp.pt2"
        commands: dict[str, list[str] | tuple[Path, Path]] = {
            "echo": (ECHO, ROOT),
            "import torch": [sys.executable, "-c", "import torch"],
            "torch": (torch_folder, ROOT),
            "import torch + export.load": [
                sys.executable,
                "-c",
                f"import torch; torch.export.load({str(export)!r}).module()",
            ],
        }
        if self.baseline is not None:
            commands["echo before"] = (ECHO, self.baseline)
            commands["torch before"] = (torch_folder, self.baseline)
        tables: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(repeats):
            for name, command in commands.items():
                began = time.perf_counter()
                if isinstance(command, list):
                    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
                    tables[name].append(time.perf_counter() - began)
                else:
                    server = launch(*command)
                    tables[name].append(time.perf_counter() - began)  # to ready, not to stopped
                    server.stop()
        medians = {name: statistics.median(values) for name, values in tables.items()}
        echo, torch_start, torch_import = medians["echo"], medians["torch"], medians["import torch"]
        return [
            Extra(
                "cold start to ready, echo model only",
                f"{echo:.2f} s",
                "",
                "",
                f"<= {START_TARGET_S:.1f} s",
                echo <= START_TARGET_S,
                f"{medians['echo before']:.2f} s" if self.baseline else "",
            ),
            Extra(
                "cold start to ready, torch examples",
                f"{torch_start:.2f} s",
                f"import torch {torch_import:.2f} s; with one torch.export.load "
                f"{medians['import torch + export.load']:.2f} s",
                f"+{torch_start - torch_import:.2f} s",
                f"<= import torch + {START_TARGET_S:.1f} s",
                torch_start <= torch_import + START_TARGET_S,
                f"{medians['torch before']:.2f} s" if self.baseline else "",
            ),
        ]

    # ---- the load rows

    def build_rows(self) -> list[Row]:
        args = self.args
        rows: list[Row] = []
        before = self.baseline is not None
        need_echo = {"rest", "rest-1", "grpc", "memory"} & set(self.rows)
        echo = self.ours(ECHO) if need_echo else None
        echo_before = self.ours(ECHO, before=True) if need_echo and before else None
        if echo is not None:
            self.idle_rss = rss_mib(echo.process.pid)
        if echo_before is not None:
            self.idle_rss_before = rss_mib(echo_before.process.pid)
        echoes = [("mlserver-like", echo)] + ([("before", echo_before)] if echo_before else [])
        if {"rest", "rest-1"} & set(self.rows) or "memory" in self.rows:
            bare_rest = self.bare("rest")
            self.bare_rss = rss_mib(bare_rest.pid)
            self.rest_check = [(label, port_of(s)) for label, s in echoes if s is not None]
            self.rest_check.append(("bare", bare_rest.port))
        path = "/v2/models/echo/infer"
        body = echo_body(args.elements)
        for key, clients in (("rest", args.clients), ("rest-1", 1)):
            if key not in self.rows:
                continue
            sides = [
                http_side(
                    label,
                    port_of(s),
                    s.process.pid,
                    build_request("127.0.0.1", port_of(s), path, body),
                    clients,
                )
                for label, s in echoes
                if s is not None
            ]
            ceiling = http_side(
                "bare Starlette + uvicorn",
                bare_rest.port,
                bare_rest.pid,
                build_request("127.0.0.1", bare_rest.port, path, body),
                clients,
            )
            work = f"REST infer echo [1,{args.elements}] FP32, {clients} client{'s' * (clients > 1)}"
            rows.append(Row(key, work, sides[0], ceiling, sides[1] if before else None))
        if "grpc" in self.rows:
            from runtime.frontends.grpc.generated import dataplane_pb2 as pb

            bare_grpc = self.bare("grpc")
            request = pb.ModelInferRequest(model_name="echo", id="bench")
            request.inputs.add(name="x", datatype="FP32", shape=[1, args.elements])
            request.raw_input_contents.append(np.arange(args.elements, dtype=np.float32).tobytes())
            self.grpc_request = request
            sides = []
            for label, server in [*echoes, ("bare grpc.aio", None)]:
                address = server.grpc_address if server is not None else f"127.0.0.1:{bare_grpc.port}"
                pid = server.process.pid if server is not None else bare_grpc.pid
                target = GrpcTarget(address)
                self.grpc_targets.append(target)
                sides.append(grpc_side(label, target, pid, request, args.clients))
            work = f"gRPC ModelInfer echo [1,{args.elements}] FP32, {args.clients} in flight"
            rows.append(Row("grpc", work, sides[0], sides[-1], sides[1] if before else None))
        if "torch" in self.rows:
            rows.append(self.torch_row())
        if "sequence" in self.rows:
            rows.append(self.sequence_row())
        return rows

    def torch_row(self) -> Row:
        args = self.args
        width, hidden = 256, 1024
        folder = self.tmp / "torch"
        (folder / "mlp").mkdir(parents=True)
        settings = {
            "name": "mlp",
            "implementation": "mlp_model.TorchMLP",
            "platform": "pytorch",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, width]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, width]}],
            "parameters": {"extra": {"in": width, "hidden": hidden, "seed": 0, "threads": 1}},
            "max_batch_size": args.max_batch_size,
            "max_batch_time": args.max_batch_time,
            "max_concurrent_batches": args.max_concurrent_batches,
        }
        (folder / "mlp" / "model-settings.json").write_text(json.dumps(settings))
        env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
        servers = [("mlserver-like", self.ours(folder, env))]
        if self.baseline is not None:
            servers.append(("before", self.ours(folder, env, before=True)))
        bare = self.bare("torch", "--width", str(width), "--hidden", str(hidden), "--threads", "1")
        rng = np.random.default_rng(1)
        rows = [rng.standard_normal((1, width), dtype=np.float32) for _ in range(args.torch_clients)]
        self.torch_check = ([port_of(s) for _, s in servers] + [bare.port], rows[0])

        def scripts(port: int) -> Callable[[], list[Script]]:
            return lambda: [Script(binary_request("127.0.0.1", port, "mlp", r)) for r in rows]

        sides = [
            http_side(label, port_of(s), s.process.pid, scripts(port_of(s)), args.torch_clients)
            for label, s in servers
        ]
        return Row(
            "torch",
            f"torch MLP {width}-{hidden}-{width}, {args.torch_clients} clients, REST binary, adaptive batching "
            f"(max {args.max_batch_size}, {args.max_batch_time * 1000:g} ms)",
            sides[0],
            http_side(
                "bare unbatched Starlette", bare.port, bare.pid, scripts(bare.port), args.torch_clients
            ),
            sides[1] if len(sides) > 1 else None,
        )

    def sequence_row(self) -> Row:
        args = self.args
        folder = self.tmp / "sequences"
        shutil.copytree(BENCH_MODELS / "running-sum", folder / "running-sum")
        shutil.copytree(ECHO, folder / "echo")
        body = orjson.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]})
        path = "/v2/models/running-sum/infer"
        counter = iter(range(1 << 30))

        def sequences(port: int) -> Callable[[], list[Script]]:
            def scripts() -> list[Script]:
                made = []
                for _ in range(args.sequences):
                    head = {"ts_request_sequence_id": f"s{next(counter)}"}
                    made.append(
                        Script(
                            build_request("127.0.0.1", port, path, body, head),
                            first=build_request(
                                "127.0.0.1", port, path, body, {**head, "ts_request_sequence_start": "true"}
                            ),
                            last=build_request(
                                "127.0.0.1", port, path, body, {**head, "ts_request_sequence_end": "true"}
                            ),
                        )
                    )
                return made

            return scripts

        pairs = []
        for before in [False] + ([True] if self.baseline is not None else []):
            server = self.ours(folder, before=before)
            port, pid = port_of(server), server.process.pid
            echo = build_request("127.0.0.1", port, "/v2/models/echo/infer", body)
            pairs.append(
                (
                    http_side("sequences", port, pid, sequences(port), args.sequences),
                    http_side("stateless echo, same server", port, pid, echo, args.sequences),
                )
            )
        self.sequence_check = ([port_of(s) for s in self.servers[-len(pairs) :]], path, body)
        return Row(
            "sequence",
            f"running-sum sequences, {args.sequences} concurrent, REST headers (vs stateless echo)",
            pairs[0][0],
            pairs[0][1],
            pairs[1][0] if len(pairs) > 1 else None,
            pairs[1][1] if len(pairs) > 1 else None,
        )

    # ---- checks: every side gives the right answer before anything is counted

    async def check(self, rows: list[Row]) -> None:
        keys = {row.key for row in rows}
        if {"rest", "rest-1"} & keys:
            body = echo_body(self.args.elements)
            for label, port in self.rest_check:
                status, _, answer = await exchange(
                    "127.0.0.1", port, build_request("127.0.0.1", port, "/v2/models/echo/infer", body)
                )
                if (
                    status != 200
                    or orjson.loads(answer)["outputs"][0]["data"] != orjson.loads(body)["inputs"][0]["data"]
                ):
                    raise RuntimeError(f"REST echo ({label}) answered {status}: {answer[:300]!r}")
        if "grpc" in keys:
            for target in self.grpc_targets:
                response = await target.stub().ModelInfer(self.grpc_request)
                if list(response.raw_output_contents) != list(self.grpc_request.raw_input_contents):
                    raise RuntimeError(f"gRPC echo answered {response}")
        if "torch" in keys:
            ports, x = self.torch_check
            outputs = []
            for port in ports:
                status, headers, body = await exchange(
                    "127.0.0.1", port, binary_request("127.0.0.1", port, "mlp", x)
                )
                if status != 200:
                    raise RuntimeError(f"torch MLP answered {status}: {body[:300]!r}")
                outputs.append(binary_output(headers, body))
            for output in outputs[1:]:
                if output.shape != outputs[0].shape or not np.allclose(output, outputs[0], atol=1e-4):
                    raise RuntimeError("the server's MLP and the bare one disagree")
        if "sequence" in keys:
            ports, path, body = self.sequence_check
            for port in ports:
                head = {"ts_request_sequence_id": "check"}
                totals = []
                for extra in ({"ts_request_sequence_start": "true"}, {}, {"ts_request_sequence_end": "true"}):
                    status, _, answer = await exchange(
                        "127.0.0.1", port, build_request("127.0.0.1", port, path, body, {**head, **extra})
                    )
                    if status != 200:
                        raise RuntimeError(f"running-sum answered {status}: {answer[:300]!r}")
                    totals.append(orjson.loads(answer)["outputs"][0]["data"][0])
                if totals != [1, 2, 3]:
                    raise RuntimeError(f"running-sum totals {totals}, expected [1, 2, 3]")

    async def measure(self, rows: list[Row]) -> None:
        await self.check(rows)
        args = self.args
        for round_ in range(args.rounds):
            for row in rows:
                sides = row.sides()
                for side in sides if round_ % 2 == 0 else reversed(sides):
                    side.results.append(await side.load(args.seconds, args.warmup))
            print(f"  round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        for target in self.grpc_targets:
            await target.close()


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _ms(result: list[Result]) -> str:
    latencies = Result(latencies=[x for r in result for x in r.latencies])
    return f"{latencies.percentile(0.5) * 1e3:.2f} / {latencies.percentile(0.99) * 1e3:.2f}"


def _cpu(result: list[Result]) -> str:
    values = [r.cpu_per_request for r in result if r.requests and r.cpu_seconds == r.cpu_seconds]
    return f"{statistics.median(values) * 1e6:.0f}" if values else "-"


def print_table(rows: list[Row], extra: list[Extra], before: bool) -> bool:
    header = (
        "| work | mlserver-like | ceiling | ratio (per round) | target | p50 / p99 ms | ceiling p50 / p99 ms "
        "| server CPU us/req (ours vs ceiling) | |"
    )
    if before:
        header += " before (--baseline) |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    all_met = True
    for row in rows:
        ratio, target = row.ratio(), TARGETS[row.key]
        met = ratio >= target
        all_met &= met
        rounds = ", ".join(f"{r:.2f}" for r in row.ratios())
        errors = sum(r.errors for side in row.sides() for r in side.results)
        line = (
            f"| {row.work} | {row.ours.mean():.0f}/s | {row.ceiling.label}: {row.ceiling.mean():.0f}/s "
            f"| **{ratio:.2f}** ({rounds}) | >= {target:g} | {_ms(row.ours.results)} | {_ms(row.ceiling.results)} "
            f"| {_cpu(row.ours.results)} vs {_cpu(row.ceiling.results)} | {_met(met)}"
            f"{f', {errors} errors' if errors else ''} |"
        )
        if before and row.before is not None:
            rounds = ", ".join(f"{r:.2f}" for r in row.ratios(before=True))
            line += (
                f" {row.before.mean():.0f}/s, ratio {row.ratio(before=True):.2f} ({rounds}), "
                f"p50 / p99 {_ms(row.before.results)} ms, CPU {_cpu(row.before.results)} us/req |"
            )
        print(line)
    for item in extra:
        all_met &= item.met
        line = f"| {item.work} | {item.ours} | {item.ceiling} | {item.ratio} | {item.target} | | | | {_met(item.met)} |"
        print(line + (f" {item.before} |" if before else ""))
    for row in rows:
        for side in row.sides():
            first = next((r.first_error for r in side.results if r.first_error), "")
            if first:
                print(f"{row.key} ({side.label}): first error: {first}")
    return all_met


def llm_rows() -> list[Extra]:
    """The ``llm`` row: benchmarks/bench_llm.py's figures (16 streams x 64 tokens)."""
    from benchmarks import bench_llm

    figures = bench_llm.run(streams=16, tokens=64, rounds=2, hidden=256, layers=4)
    server = f"{figures['server']:.0f} tok/s (TTFT p50 {figures['ttft_p50_ms']:.0f} ms)"
    return [
        Extra(
            "LLM, 16 streams x 64 tokens vs generate one at a time",
            server,
            f"generate alone: {figures['alone']:.0f} tok/s",
            f"**{figures['vs_alone']:.2f}**",
            f">= {bench_llm.TARGET_ALONE:g}",
            figures["vs_alone"] >= bench_llm.TARGET_ALONE,
        ),
        Extra(
            "LLM, 16 streams x 64 tokens vs generate on one static batch",
            server,
            f"static batch: {figures['static']:.0f} tok/s",
            f"**{figures['vs_static']:.2f}**",
            f">= {bench_llm.TARGET_STATIC:g}",
            figures["vs_static"] >= bench_llm.TARGET_STATIC,
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a short run: 2 rounds of 1 s, 2 starts")
    parser.add_argument(
        "--only", default=",".join(ROWS), help=f"rows to run, comma-separated: {','.join(ROWS)}"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; --quick 2)")
    parser.add_argument(
        "--seconds", type=float, help="counted seconds per side and round (default 3; --quick 1)"
    )
    parser.add_argument(
        "--warmup", type=float, help="seconds of load before counting (default 0.5; --quick 0.3)"
    )
    parser.add_argument("--starts", type=int, help="cold starts of each kind, the median counts (default 5)")
    parser.add_argument("--clients", type=int, default=16, help="REST and gRPC echo clients")
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements of the echoed tensor")
    parser.add_argument("--torch-clients", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=32, help="torch row: adaptive batching")
    parser.add_argument("--max-batch-time", type=float, default=0.002, help="torch row: seconds")
    parser.add_argument("--max-concurrent-batches", type=int, default=1, help="torch row")
    parser.add_argument("--sequences", type=int, default=128, help="sequence row: concurrent sequences")
    parser.add_argument("--no-pin", action="store_true", help="leave every process on every core")
    bench_tabular.add_arguments(parser)
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="another checkout of this project (git worktree add DIR COMMIT): its server measured beside",
    )
    parser.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="instead of timing, count the instructions per REST and gRPC echo request over N requests "
        "(callgrind), of this checkout and of --baseline's",
    )
    parser.add_argument(
        "--server-args",
        default="",
        metavar="ARGS",
        help="with --instructions: more `mlserver-like start` arguments for both sides' servers, "
        "e.g. --server-args='--loop-block-warning 0.5' (both at one setting of a default that changed)",
    )
    parser.add_argument(
        "--instruction-starts",
        dest="starts_counted",
        type=int,
        default=3,
        metavar="K",
        help="with --instructions: start each side's server K times, the sides in turn, and take each "
        "figure's median (two processes of one checkout differ by about a percent)",
    )
    parser.add_argument(
        "--start-instructions",
        metavar="FOLDER",
        nargs="?",
        const=str(ECHO),
        help="instead of timing, count the instructions from start to ready of a server on FOLDER "
        "(default: the echo model; callgrind, every thread), of this checkout and of --baseline's",
    )
    args = parser.parse_args()
    if args.instructions:
        return instructions(args)
    if args.start_instructions:
        return start_instructions(args)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(args.only) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; choose from {','.join(ROWS)}")
    defaults = (2, 1.0, 0.3, 2) if args.quick else (3, 3.0, 0.5, 5)
    for name, default in zip(("rounds", "seconds", "warmup", "starts"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)

    tabular = "tabular" in args.only
    args.only = [name for name in args.only if name != "tabular"]
    met = True
    if args.only:
        met = measure_rows(args)
    if tabular:
        met &= bench_tabular.run(args) == 0
    print("every target met" if met else "some targets not met")
    return 0


def measure_rows(args: argparse.Namespace) -> bool:
    """The rows of this module (every one but ``tabular``); whether every target was met."""
    bench = Bench(args)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        + (
            f"servers pinned to CPU {sorted(bench.server_cpus)}, load generator to {sorted(bench.load_cpus)}"
            if bench.pinned
            else "no pinning"
        )
        + f"; {args.rounds} interleaved rounds of {args.seconds:g} s (+{args.warmup:g} s warm-up) per side; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    try:
        extra = bench.startup() if "startup" in args.only else []
        if "llm" in args.only:
            extra += llm_rows()
        rows = bench.build_rows()
        if "memory" in args.only:
            extra.append(
                Extra(
                    "idle RSS, echo model only",
                    f"{bench.idle_rss:.0f} MiB",
                    f"bare Starlette {bench.bare_rss:.0f} MiB",
                    "",
                    f"<= {RSS_TARGET_MIB:.0f} MiB",
                    bench.idle_rss <= RSS_TARGET_MIB,
                    f"{bench.idle_rss_before:.0f} MiB" if bench.baseline else "",
                )
            )
        bench.pin_all()
        if rows:
            import uvloop

            uvloop.run(bench.measure(rows))
        if "many-models" in args.only:
            os.sched_setaffinity(0, bench.server_cpus | bench.load_cpus)  # it pins its own server
            extra += many_models(args)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        met = print_table(rows, extra, bench.baseline is not None)
    finally:
        bench.close()
    return met


def many_models(args: argparse.Namespace) -> list[Extra]:
    """The ``many-models`` row: ``benchmarks/bench_many_models.py`` in this run's rounds."""
    from benchmarks import bench_many_models as bench

    figures = bench.run(rounds=args.rounds, seconds=args.seconds, pinned=not args.no_pin)
    bench.report(figures)
    (a50, a99, _), (b50, b99, _) = figures["alone"], figures["beside"]
    sides = f"alone {a50:.3f} / {a99:.3f} ms"
    beside = f"{b50:.3f} / {b99:.3f} ms"
    return [
        Extra(
            "hot p50 beside a cold load every 100 ms",
            beside,
            sides,
            f"{b50 / a50:.2f}",
            f"<= {bench.P50_TARGET:g}x",
            b50 / a50 <= bench.P50_TARGET and not figures["errors"],
        ),
        Extra(
            "hot p99 beside a cold load every 100 ms",
            beside,
            sides,
            f"{b99 / a99:.2f}",
            f"<= {bench.P99_TARGET:g}x",
            b99 / a99 <= bench.P99_TARGET and not figures["errors"],
        ),
    ]


def instructions(args: argparse.Namespace) -> int:
    """``--instructions N``: instructions per echo request (benchmarks/instructions.py), of this
    checkout and of the baseline's, on the echo model alone."""
    if not counting.available():
        return 1
    extra = shlex.split(args.server_args)
    sides: dict[str, tuple[Path, list[str]]] = {"this checkout": (ROOT, extra)}
    if args.baseline:
        sides["before"] = (Path(args.baseline).resolve(), extra)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ECHO, Path(tmp) / ECHO.name)
        body = echo_body(args.elements)
        counts = counting.count(sides, Path(tmp), args.instructions, body, args.clients, args.starts_counted)
    if args.baseline:
        counting.print_ratios(counts, "this checkout", "before")
    return 0


def start_instructions(args: argparse.Namespace) -> int:
    """``--start-instructions [FOLDER]``: instructions from start to ready (benchmarks/instructions.py)."""
    if not counting.available():
        return 1
    sides = {"this checkout": ROOT}
    if args.baseline:
        sides["before"] = Path(args.baseline).resolve()
    counts = counting.to_ready(sides, Path(args.start_instructions).resolve())
    if args.baseline:
        print(f"this checkout / before: {counts['this checkout'] / counts['before']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
