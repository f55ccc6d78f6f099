"""Throughput of the PyTorch runtime against calling the model in a plain Python loop.

    python3 benchmarks/bench_torch.py [--device cpu|cuda] [--seconds 1] [--batch-sizes 1 32]

One MLP (``--features`` -> ``--hidden`` -> ``--hidden`` -> 10), exported with torch.export (or
saved as TorchScript with ``--format torchscript``), is served by ``runtime.torch.TorchModel``
in this process and measured, for each batch size, five ways in one run (interleaved rounds;
each figure is its best round, as the machine may be shared):

- ``plain loop``: numpy array -> ``torch.from_numpy`` -> device -> ``module(x)`` -> host numpy,
  under ``torch.inference_mode``: what a script that calls the model itself does (the baseline);
- ``runner.run``: the runtime's tensors-in/tensors-out call, in the caller's thread;
- ``runner.infer``: the same through the model's own thread pool, awaited one at a time;
- ``dataplane``: a full ``DataPlane.infer`` (request checks, OIP mapping, response checks), one at a time;
- ``dataplane x4``: four callers at once (the event loop prepares the next while one computes).

The transports are left out on purpose: they cost the same whatever the model, and the REST
benchmark measures them. Ratios are against the plain loop of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.core.dataplane import DataPlane  # noqa: E402
from runtime.core.registry import Registry  # noqa: E402
from runtime.settings import ModelSettings, Settings  # noqa: E402
from runtime.torch import TorchModel  # noqa: E402
from runtime.types import InferenceRequest, MetadataTensor, RequestInput  # noqa: E402


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


def save(folder: Path, fmt: str, features: int, hidden: int) -> tuple[Path, Any]:
    torch.manual_seed(0)
    module = MLP(features, hidden).eval()
    example = torch.randn(2, features)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if fmt == "export":
            path = folder / "mlp.pt2"
            batch = torch.export.Dim("batch", min=1, max=65536)
            torch.export.save(torch.export.export(module, (example,), dynamic_shapes={"x": {0: batch}}), path)
            loaded: Any = torch.export.load(path).module()
        else:
            path = folder / "mlp.pt"
            torch.jit.save(torch.jit.script(module), str(path))
            loaded = torch.jit.load(str(path))
    return path, loaded


async def rate(call: Callable[[], Awaitable[Any]], seconds: float, callers: int = 1) -> float:
    """Calls per second of ``call`` over ``seconds``, with ``callers`` running at once."""
    for _ in range(5):
        await call()
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return done / (time.perf_counter() - start)


async def bench(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    extra: dict[str, Any] = {"device": args.device}
    if args.threads:
        # the same intra-op threads for the plain loop (this thread) and the runtime (set at load)
        torch.set_num_threads(args.threads)
        extra["num_threads"] = args.threads
    with tempfile.TemporaryDirectory() as tmp:
        path, plain = save(Path(tmp), args.format, args.features, args.hidden)
        plain = plain.to(device) if args.format == "torchscript" else _moved(path, device)
        settings = ModelSettings(
            name="mlp",
            implementation=TorchModel,
            inputs=[MetadataTensor(name="x", datatype="FP32", shape=[-1, args.features])],
            outputs=[MetadataTensor(name="y", datatype="FP32", shape=[-1, 10])],
            parameters={"uri": str(path), "extra": extra},
        )
        registry = Registry()
        entry = await registry.load(settings)
        if not entry.ready:
            raise SystemExit(f"the model did not load: {entry.reason}")
        dataplane = DataPlane(Settings(), registry)
        dataplane.started = True
        model = entry.model
        assert isinstance(model, TorchModel)
        runner = model.runner

        print(
            f"torch {torch.__version__}, device {device}, {args.format} MLP "
            f"{args.features}->{args.hidden}->{args.hidden}->10, intra-op threads {torch.get_num_threads()}, "
            f"best of {args.rounds} interleaved rounds, {args.seconds:g} s per figure"
        )
        header = f"{'batch':>5}  {'way':<14} {'calls/s':>10} {'samples/s':>11} {'vs plain':>9}"
        print(header)
        print("-" * len(header))
        for batch in args.batch_sizes:
            x = np.random.default_rng(0).standard_normal((batch, args.features), dtype=np.float32)

            async def plain_loop(x: np.ndarray = x) -> None:
                with torch.inference_mode():
                    plain(torch.from_numpy(x).to(device)).cpu().numpy()

            async def runner_run(x: np.ndarray = x) -> None:
                runner.run({"x": x})

            async def runner_infer(x: np.ndarray = x) -> None:
                await runner.infer({"x": x})

            async def dataplane_infer(x: np.ndarray = x) -> None:
                request = InferenceRequest(
                    inputs=[RequestInput(name="x", shape=list(x.shape), datatype="FP32", data=x)]
                )
                await dataplane.infer(request, "mlp")

            ways = [
                ("plain loop", plain_loop, 1),
                ("runner.run", runner_run, 1),
                ("runner.infer", runner_infer, 1),
                ("dataplane", dataplane_infer, 1),
                ("dataplane x4", dataplane_infer, 4),
            ]
            # rounds interleave the ways, so that a burst of load elsewhere on the machine hits
            # them alike; each way keeps its best round (the least disturbed one)
            best = dict.fromkeys((name for name, _, _ in ways), 0.0)
            for _ in range(args.rounds):
                for name, call, callers in ways:
                    best[name] = max(best[name], await rate(call, args.seconds / args.rounds, callers))
            baseline = best["plain loop"]
            for name, calls in best.items():
                print(
                    f"{batch:>5}  {name:<14} {calls:>10.0f} {calls * batch:>11.0f} {calls / baseline:>8.2f}x"
                )
        await registry.unload_all()


def _moved(path: Path, device: torch.device) -> Any:
    program = torch.export.load(path)
    if device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    return program.module()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--format", choices=["export", "torchscript"], default="export")
    parser.add_argument("--seconds", type=float, default=1.5, help="measuring time per figure")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best one counts")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads on both sides; 0: torch's default"
    )
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
