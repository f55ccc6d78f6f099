"""Tokens per second of the PyTorch runtime's continuous batching against one stream at a time.

    python3 benchmarks/bench_torch_continuous.py [--device cpu|cuda] [--streams 32] [--tokens 64]

The example token decoder's class (``examples/torch/models/decoder-chat/decoder.py``: embedding,
LSTM, linear head), with random weights of ``--hidden`` units, is saved as TorchScript and served by
``runtime.torch.TorchModel`` with continuous batching in this process (feedback of ``next_token``,
``h``/``c`` as its state, no stop token, so every stream makes exactly ``--tokens`` tokens). Each
figure is measured in one run, in interleaved rounds (the best round counts, as the machine may be
shared):

- ``plain loop``: the model's own generation loop, one stream at a time, under
  ``torch.inference_mode``: what a script that generates by itself does (the baseline);
- ``one at a time``: ``--streams`` streams through ``DataPlane.infer_stream`` with
  ``max_batch_size`` 1, so that they take turns;
- ``continuous``: the same streams with ``max_batch_size`` = ``--streams``: every step is one
  forward call for all of them.

The transports are left out on purpose (the stream benchmarks measure SSE and gRPC).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.core.dataplane import DataPlane  # noqa: E402
from runtime.core.registry import Registry  # noqa: E402
from runtime.settings import ModelSettings, Settings  # noqa: E402
from runtime.types import InferenceRequest, Parameters, RequestInput  # noqa: E402

DECODER = ROOT / "examples" / "torch" / "models" / "decoder-chat" / "decoder.py"


def save(folder: Path, vocabulary: int, hidden: int) -> tuple[Path, Any]:
    spec = importlib.util.spec_from_file_location("_bench_decoder", DECODER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    net = module.Decoder(vocabulary=vocabulary, embedding=hidden, hidden=hidden).eval()
    path = folder / "decoder.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(net), str(path))
    return path, torch.jit.load(str(path))


def settings(name: str, path: Path, args: argparse.Namespace, streams: int) -> ModelSettings:
    state = {"datatype": "FP32", "shape": [-1, 1, args.hidden], "parameters": {"optional": True}}
    extra: dict[str, Any] = {
        "device": args.device,
        "sequence_state": {"h0": "h", "c0": "c"},
        "feedback": {"tokens": "next_token"},
        "max_steps": args.tokens,
    }
    if args.threads:
        extra["num_threads"] = args.threads
    return ModelSettings.model_validate(
        {
            "name": name,
            "implementation": "runtime.torch.TorchModel",
            "continuous_batching": True,
            "max_batch_size": streams,
            "max_queue_size": 10 * args.streams,
            "inputs": [
                {"name": "tokens", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "h0", **state},
                {"name": "c0", **state},
            ],
            "outputs": [
                {"name": "next_token", "datatype": "INT64", "shape": [-1, 1]},
                {"name": "logits", "datatype": "FP32", "shape": [-1, args.vocabulary]},
                {"name": "h", "datatype": "FP32", "shape": [-1, 1, args.hidden]},
                {"name": "c", "datatype": "FP32", "shape": [-1, 1, args.hidden]},
            ],
            "parameters": {"uri": str(path), "extra": extra},
        }
    )


def prompts(args: argparse.Namespace) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.integers(1, args.vocabulary, size=(1, args.prompt), dtype=np.int64) for _ in range(args.streams)
    ]


def plain_loop(module: Any, prompt: np.ndarray, args: argparse.Namespace, device: torch.device) -> int:
    tokens = torch.from_numpy(prompt).to(device)
    h = c = torch.zeros(1, 1, args.hidden, device=device)
    made = []
    with torch.inference_mode():
        for _ in range(args.tokens):
            tokens, _, h, c = module(tokens, h, c)
            made.append(tokens.cpu())  # each token goes to the host, as a streaming client needs it
    return len(made)


async def one_request(request: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    yield request


async def served(dataplane: DataPlane, name: str, prompt: np.ndarray) -> int:
    request = InferenceRequest(
        inputs=[RequestInput(name="tokens", shape=list(prompt.shape), datatype="INT64", data=prompt)],
        parameters=Parameters(),
    )
    count = 0
    async for _ in dataplane.infer_stream(one_request(request), name):
        count += 1
    return count


async def bench(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path, module = save(Path(tmp), args.vocabulary, args.hidden)
        module = module.to(device)
        registry = Registry()
        for name, streams in (("one-at-a-time", 1), ("continuous", args.streams)):
            entry = await registry.load(settings(name, path, args, streams))
            if not entry.ready:
                raise SystemExit(f"the model did not load: {entry.reason}")
        dataplane = DataPlane(Settings(), registry)
        dataplane.started = True
        requests = prompts(args)
        expected = args.streams * args.tokens

        async def plain() -> int:
            return sum(plain_loop(module, prompt, args, device) for prompt in requests)

        async def through(name: str) -> int:
            counts = await asyncio.gather(*(served(dataplane, name, prompt) for prompt in requests))
            return sum(counts)

        ways: dict[str, Callable[[], Awaitable[int]]] = {
            "plain loop": plain,
            "one at a time": lambda: through("one-at-a-time"),
            "continuous": lambda: through("continuous"),
        }
        for way in ways.values():  # warm-up (and a check that every stream made all its tokens)
            made = await way()
            if made != expected:
                raise SystemExit(f"expected {expected} tokens, got {made}")
        best = dict.fromkeys(ways, 0.0)
        for _ in range(args.rounds):
            for name, way in ways.items():
                start = time.perf_counter()
                await way()
                best[name] = max(best[name], expected / (time.perf_counter() - start))
        scheduler = registry.get("continuous").scheduler
        assert scheduler is not None
        stats = scheduler.describe()["stats"]
        await registry.unload_all()

    print(
        f"torch {torch.__version__}, device {device}, decoder vocabulary {args.vocabulary}, hidden {args.hidden}, "
        f"{args.streams} streams x {args.tokens} tokens (prompt {args.prompt}), intra-op threads "
        f"{torch.get_num_threads()}, best of {args.rounds} interleaved rounds"
    )
    header = f"{'way':<14} {'tokens/s':>10} {'vs plain':>9} {'vs one at a time':>17}"
    print(header)
    print("-" * len(header))
    for name, rate in best.items():
        print(
            f"{name:<14} {rate:>10.0f} {rate / best['plain loop']:>8.2f}x {rate / best['one at a time']:>16.2f}x"
        )
    print(f"continuous: largest step {stats['largest_batch']} streams, {stats['steps']} steps in all")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--streams", type=int, default=32, help="streams at once")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument("--prompt", type=int, default=8, help="prompt tokens per stream")
    parser.add_argument("--vocabulary", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best one counts")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads on both sides; 0: torch's default"
    )
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
