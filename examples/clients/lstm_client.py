"""Stream audio-like frames through the LSTM example, many sequences at once, over REST or gRPC.

    mlserver-like start examples/sequences         # in another shell (needs torch)
    python3 examples/clients/lstm_client.py [http://127.0.0.1:8080] [--sequences 16] [--chunks 5]
    python3 examples/clients/lstm_client.py --grpc 127.0.0.1:8081

Each sequence (an utterance) sends chunks of 10 frames x 80 features as binary tensors; the server
carries each sequence's LSTM state from chunk to chunk and batches chunks of different sequences
together. The last chunk carries ``sequence_end`` and frees the state.

Over REST, each utterance sends its next chunk when the previous answer is back. Over gRPC, every
chunk of every utterance goes up one ``ModelStreamInfer`` stream at once, without waiting: the
server keeps each utterance's chunks in order and batches the utterances together.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import grpc
import httpx
import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

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


def grpc_stream(address: str, sequences: int, chunks: int) -> list[tuple[str, list[int]]]:
    """Every chunk of every utterance up one stream, pipelined; answers grouped by utterance."""

    def requests():  # type: ignore[no-untyped-def]
        rngs = [np.random.default_rng(n) for n in range(sequences)]
        for i in range(chunks):
            for n, rng in enumerate(rngs):
                chunk = rng.standard_normal((FRAMES, FEATURES), dtype=np.float32)
                request = pb.ModelInferRequest(model_name="lstm", id=f"utt-{n}/{i}")
                request.parameters["sequence_id"].string_param = f"utt-{n}"
                request.parameters["sequence_start"].bool_param = i == 0
                request.parameters["sequence_end"].bool_param = i == chunks - 1
                request.inputs.add(name="frames", datatype="FP32", shape=list(chunk.shape))
                request.raw_input_contents.append(chunk.tobytes())
                yield request

    best: dict[str, list[int]] = {f"utt-{n}": [] for n in range(sequences)}
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        for response in call(requests()):
            if "error" in response.parameters:
                raise RuntimeError(f"{response.id}: {response.parameters['error'].string_param}")
            logits = np.frombuffer(response.raw_output_contents[0], np.float32).reshape(
                response.outputs[0].shape
            )
            best[response.id.split("/")[0]].append(int(logits[-1].argmax()))
    return list(best.items())


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:8080")
    parser.add_argument(
        "--grpc", metavar="HOST:PORT", help="use one gRPC stream at this address instead of REST"
    )
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--chunks", type=int, default=5)
    args = parser.parse_args()
    began = time.perf_counter()
    if args.grpc:
        results = await asyncio.to_thread(grpc_stream, args.grpc, args.sequences, args.chunks)
        for name, best in results:
            print(f"{name}: best class of each chunk's last frame {best}")
        print(
            f"{args.sequences * args.chunks} chunks in {time.perf_counter() - began:.2f} s over one gRPC stream"
        )
        return
    async with httpx.AsyncClient(base_url=args.url, timeout=60) as client:
        results = await asyncio.gather(*(utterance(client, n, args.chunks) for n in range(args.sequences)))
        scheduling = (await client.get("/v2/models/lstm")).json()["parameters"]
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
