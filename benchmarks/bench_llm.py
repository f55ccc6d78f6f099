"""A Hugging Face language model served with continuous batching, against ``model.generate``.

    python3 -m benchmarks.bench_llm [--streams 16] [--tokens 64] [--rounds 2] [--hidden 256] [--layers 4]

(also ``python3 -m benchmarks --only llm``). A Llama-style model of a few million weights
(``--hidden`` wide, ``--layers`` layers, a 2000-token byte-level BPE trained on generated text;
random weights, built at the start, nothing downloaded) is measured three ways on ONE CPU core
with one torch thread, in interleaved rounds (the best round of each counts, as the machine may be
shared):

- ``generate, one at a time``: ``model.generate`` on each of the ``--streams`` prompts in turn,
  in this process: what a server without batching does at best (KServe's Hugging Face fallback);
- ``generate, one static batch``: ``model.generate`` on the same prompts as one left-padded batch:
  the ceiling for a batch that is all there at once (nothing joins, nothing leaves);
- ``server``: ``mlserver-like start`` (this runtime, MLServer's model-settings.json) pinned to the
  same core, ``--streams`` concurrent streamed ``/v1/completions`` (``stream: true``, greedy,
  ``ignore_eos``: every one makes exactly ``--tokens`` tokens), read on the other cores by ONE
  ``httpx.AsyncClient`` kept for the whole run, as a long-lived OpenAI client keeps its connection
  pool: a warm-up of ``--streams`` concurrent short streams (4 tokens) opens every connection
  first, and the timed rounds reuse them (the benchmark prints how many connections each part
  opened). Each round is timed from its first request sent to its last token read: tokens per
  second over the whole load, and each stream's time to first token from that same start.

Targets: the server at least 4x ``one at a time`` and at least 0.7x ``one static batch``.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.huggingface.tiny_llm import build, sentences  # noqa: E402
from tests.servers import RunningServer, start_server  # noqa: E402

SERVER_CPU = 0
TARGET_ALONE = 4.0
TARGET_STATIC = 0.7
KEEPALIVE = 60.0
"""Seconds the client keeps an idle connection (httpx's default is 5, shorter than the ``generate``
rounds between two loads; the server keeps them 75)."""


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` to ``cpus`` (threads it starts later inherit it)."""
    with contextlib.suppress(FileNotFoundError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(int(tid), cpus)


def write_model(folder: Path, hidden: int, layers: int) -> Path:
    checkpoint = build(folder / "weights", hidden=hidden, layers=layers, vocabulary=2000)
    model = folder / "models" / "llm"
    model.mkdir(parents=True)
    settings = {
        "name": "llm",
        "implementation": "mlserver_huggingface.HuggingFaceRuntime",
        "max_batch_size": 64,
        "parameters": {
            "extra": {"task": "text-generation", "pretrained_model": str(checkpoint), "intra_op_threads": 1}
        },
    }
    (model / "model-settings.json").write_text(json.dumps(settings))
    return checkpoint


class Generate:
    """``model.generate`` in this process, on the server's core with one torch thread."""

    def __init__(self, checkpoint: Path, prompts: list[str], tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        self.model.eval()  # type: ignore[no-untyped-call]
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        tokenizer.padding_side = "left"
        self.alone = [tokenizer(p, return_tensors="pt") for p in prompts]
        self.batch = tokenizer(prompts, return_tensors="pt", padding=True)
        self.tokens = tokens
        self.options = {"do_sample": False, "max_new_tokens": tokens, "min_new_tokens": tokens}

    def _run(self, inputs: Any) -> int:
        out = self.model.generate(**inputs, **self.options, pad_token_id=self.model.config.pad_token_id)
        return int(out.shape[0] * (out.shape[1] - inputs["input_ids"].shape[1]))

    def one_at_a_time(self) -> float:
        with self.torch.inference_mode():
            start = time.perf_counter()
            made = sum(self._run(inputs) for inputs in self.alone)
            return made / (time.perf_counter() - start)

    def static_batch(self) -> float:
        with self.torch.inference_mode():
            start = time.perf_counter()
            made = self._run(self.batch)
            return made / (time.perf_counter() - start)


class Load:
    """The load generator: ONE ``httpx.AsyncClient`` (one connection pool) for the whole run, as a
    long-lived OpenAI client keeps; it counts the TCP connections it opens."""

    def __init__(self, port: int, streams: int) -> None:
        import httpx

        limits = httpx.Limits(
            max_connections=streams, max_keepalive_connections=streams, keepalive_expiry=KEEPALIVE
        )
        self.client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits)
        self.connections = 0
        """TCP connections opened so far."""

    async def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self.connections += 1

    async def _stream(self, prompt: str, tokens: int, began: float) -> tuple[int, float]:
        """One streamed completion: (tokens, seconds from the load's start to its first token)."""
        body = {
            "model": "llm",
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        first = 0.0
        made = 0
        request = self.client.stream("POST", "/v1/completions", json=body, extensions={"trace": self._trace})
        async with request as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if not first:
                    first = time.perf_counter() - began
                if '"usage":{' in line:
                    made = json.loads(line[6:])["usage"]["completion_tokens"]
        return made, first

    async def run(self, prompts: list[str], tokens: int) -> tuple[float, list[float]]:
        """All ``prompts`` at once, timed from the first request sent to the last token read:
        (tokens per second, each stream's time to first token)."""
        began = time.perf_counter()
        results = await asyncio.gather(*(self._stream(p, tokens, began) for p in prompts))
        seconds = time.perf_counter() - began
        made = sum(r[0] for r in results)
        if made != len(prompts) * tokens:
            raise RuntimeError(f"the server made {made} tokens, not {len(prompts) * tokens}")
        return made / seconds, [r[1] for r in results]

    async def close(self) -> None:
        await self.client.aclose()


async def _rounds(
    port: int, prompts: list[str], tokens: int, rounds: int, generate: Generate, cpus: set[int]
) -> dict[str, Any]:
    """The interleaved rounds, on one event loop (the client's pool lives through all of them)."""
    load = Load(port, len(prompts))
    try:
        await load.run(prompts, 4)  # warm-up: every stream at once, so every connection is open
        warm = load.connections
        alone, static, served, ttft = [], [], [], []
        for _ in range(rounds):
            os.sched_setaffinity(0, {SERVER_CPU})  # the server is idle: no request is in flight
            alone.append(generate.one_at_a_time())
            static.append(generate.static_batch())
            os.sched_setaffinity(0, cpus)
            rate, firsts = await load.run(prompts, tokens)
            served.append(rate)
            ttft.append(statistics.median(firsts))
    finally:
        await load.close()
    return {
        "alone": alone,
        "static": static,
        "served": served,
        "ttft": ttft,
        "connections_warm": warm,
        "connections_timed": load.connections - warm,
    }


def run(streams: int, tokens: int, rounds: int, hidden: int, layers: int) -> dict[str, Any]:
    """Measure; returns the figures (and prints them)."""
    cpus = os.sched_getaffinity(0)
    load_cpus = (cpus - {SERVER_CPU}) or cpus
    prompts = sentences(streams, seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        checkpoint = write_model(folder, hidden, layers)
        import torch

        torch.set_num_threads(1)
        os.sched_setaffinity(0, {SERVER_CPU})
        generate = Generate(checkpoint, prompts, tokens)
        weights = sum(p.numel() for p in generate.model.parameters())
        os.sched_setaffinity(0, load_cpus)
        server: RunningServer = start_server(folder / "models")
        try:
            pin(server.process.pid, {SERVER_CPU})
            port = int(server.endpoints["http"].rsplit(":", 1)[1])
            measured = asyncio.run(_rounds(port, prompts, tokens, rounds, generate, load_cpus))
        finally:
            os.sched_setaffinity(0, cpus)
            server.stop()
    figures = {
        "weights": weights,
        "alone": max(measured["alone"]),
        "static": max(measured["static"]),
        "server": max(measured["served"]),
        "ttft_p50_ms": 1000 * min(measured["ttft"]),
        "connections_warm": measured["connections_warm"],
        "connections_timed": measured["connections_timed"],
    }
    figures["vs_alone"] = figures["server"] / figures["alone"]
    figures["vs_static"] = figures["server"] / figures["static"]
    print(
        f"{weights / 1e6:.1f} M weights, {streams} streams x {tokens} tokens, server on CPU {SERVER_CPU}, "
        f"1 torch thread, best of {rounds} rounds (load average {os.getloadavg()[0]:.2f})"
    )
    print("| way | tokens/s | server's ratio | target |")
    print("|---|---|---|---|")
    print(
        f"| generate, one at a time | {figures['alone']:.0f} | **{figures['vs_alone']:.2f}x** | >= {TARGET_ALONE:g}x |"
    )
    print(
        f"| generate, one static batch | {figures['static']:.0f} | **{figures['vs_static']:.2f}x** | >= {TARGET_STATIC:g}x |"
    )
    print(f"| server, {streams} streamed /v1/completions | {figures['server']:.0f} | | |")
    print(f"time to first token under that load, p50: {figures['ttft_p50_ms']:.0f} ms")
    print(
        f"one client pool: {figures['connections_warm']} connections opened at the warm-up, "
        f"{figures['connections_timed']} during the timed rounds"
    )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m benchmarks.bench_llm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    figures = run(args.streams, args.tokens, args.rounds, args.hidden, args.layers)
    met = figures["vs_alone"] >= TARGET_ALONE and figures["vs_static"] >= TARGET_STATIC
    print("targets met" if met else "targets NOT met")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
