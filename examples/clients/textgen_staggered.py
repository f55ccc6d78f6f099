"""Streams that start at staggered times share the textgen model's steps (continuous batching).

    mlserver-like start examples/streaming      # in another terminal
    python3 examples/clients/textgen_staggered.py [--url http://127.0.0.1:8080] [--streams 5] [--every 0.1]

Starts ``--streams`` generations, one every ``--every`` seconds, each asking for a different number
of characters, over ``/infer_stream`` (Server-Sent Events). Every response carries ``batch_size``,
the number of streams that shared the step that made it; for each stream the script prints when it
started and ended and those numbers, run-length encoded (``2x40`` = 40 characters made in steps of
2 streams), so the overlap is plain to see: a stream that starts while others run joins their
steps at once (its first steps are shared), and the others' batches shrink as streams finish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import aconnect_sse

PROMPTS = ["The keeper", "In the morning", "She kept a small book", "The wind came in", "Far away a bell"]


@dataclass
class Run:
    name: str
    prompt: str
    started: float = 0.0
    ended: float = 0.0
    text: str = ""
    sizes: list[int] = field(default_factory=list)


def body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}],
        "parameters": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    }


async def stream(client: httpx.AsyncClient, run: Run, max_tokens: int, delay: float, origin: float) -> Run:
    await asyncio.sleep(delay)
    run.started = time.monotonic() - origin
    async with aconnect_sse(
        client, "POST", "/v2/models/textgen/infer_stream", json=body(run.prompt, max_tokens)
    ) as source:
        if source.response.status_code != 200:
            await source.response.aread()
            raise RuntimeError(source.response.json()["error"])
        async for event in source.aiter_sse():
            document = json.loads(event.data)
            if event.event == "error":
                raise RuntimeError(document["error"])
            run.text += document["outputs"][0]["data"][0]
            run.sizes.append(document["parameters"]["batch_size"])
    run.ended = time.monotonic() - origin
    return run


async def staggered(url: str, streams: int, every: float, tokens: int) -> list[Run]:
    """Run the streams; return what each one got."""
    runs = [Run(f"s{i}", PROMPTS[i % len(PROMPTS)]) for i in range(streams)]
    origin = time.monotonic()
    limits = httpx.Limits(max_connections=streams)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        return await asyncio.gather(
            *(
                stream(client, run, tokens + tokens // 2 * (i % 3), i * every, origin)
                for i, run in enumerate(runs)
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--streams", type=int, default=5)
    parser.add_argument("--every", type=float, default=0.1, help="seconds between two streams' starts")
    parser.add_argument("--tokens", type=int, default=300, help="characters of the shortest stream")
    args = parser.parse_args()
    runs = asyncio.run(staggered(args.url, args.streams, args.every, args.tokens))
    print("stream  start    end  chars  batch_size of its steps (size x characters)")
    for run in runs:
        print(f"{run.name:<6} {run.started:5.2f}s {run.ended:5.2f}s {len(run.sizes):5}  {runs_of(run.sizes)}")
    print()
    for run in runs:
        print(f"{run.name}: {run.prompt}{run.text[:60]}...")


def runs_of(sizes: list[int]) -> str:
    """``[1, 1, 2, 2, 2]`` -> ``1x2 2x3``."""
    parts: list[list[int]] = []
    for size in sizes:
        if parts and parts[-1][0] == size:
            parts[-1][1] += 1
        else:
            parts.append([size, 1])
    return " ".join(f"{size}x{count}" for size, count in parts)


if __name__ == "__main__":
    main()
