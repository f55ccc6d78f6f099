"""Stream audio-like frames through the LSTM example, many sequences at once, over REST.

    mlserver-like start examples/sequences         # in another shell (needs torch)
    python3 examples/clients/lstm_client.py [http://127.0.0.1:8080] [--sequences 16] [--chunks 5]

Each sequence (an utterance) sends chunks of 10 frames x 80 features as binary tensors; the server
carries each sequence's LSTM state from chunk to chunk and batches chunks of different sequences
together. The last chunk carries ``sequence_end`` and frees the state.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
import numpy as np
import orjson

FRAMES, FEATURES = 10, 80


def request(chunk: np.ndarray, sequence: str, start: bool, end: bool) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "frames",
                    "shape": list(chunk.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": chunk.nbytes},
                }
            ],
            "parameters": {"sequence_id": sequence, "sequence_start": start, "sequence_end": end},
        }
    )
    return header + chunk.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


async def utterance(client: httpx.AsyncClient, n: int, chunks: int) -> tuple[str, list[int]]:
    rng = np.random.default_rng(n)
    best = []
    for i in range(chunks):
        chunk = rng.standard_normal((FRAMES, FEATURES), dtype=np.float32)
        body, headers = request(chunk, f"utt-{n}", i == 0, i == chunks - 1)
        response = await client.post("/v2/models/lstm/infer", content=body, headers=headers)
        response.raise_for_status()
        out = response.json()["outputs"][0]
        logits = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        best.append(int(logits[-1].argmax()))
    return f"utt-{n}", best


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:8080")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--chunks", type=int, default=5)
    args = parser.parse_args()
    began = time.perf_counter()
    async with httpx.AsyncClient(base_url=args.url, timeout=60) as client:
        results = await asyncio.gather(*(utterance(client, n, args.chunks) for n in range(args.sequences)))
        scheduling = (await client.get("/v2/models/lstm")).json()["parameters"]["scheduling"]
    seconds = time.perf_counter() - began
    for name, best in results:
        print(f"{name}: best class of each chunk's last frame {best}")
    stats = scheduling["stats"]
    print(
        f"{args.sequences * args.chunks} chunks in {seconds:.2f} s; "
        f"{stats['batches']} batches so far, largest {stats['largest_batch']}"
    )


if __name__ == "__main__":
    asyncio.run(main())
