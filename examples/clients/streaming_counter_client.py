"""An "update" and a "cancel" reaching a running stream of their sequence (TorchServe's sequence continuous batching).

    mlserver-like start examples/sequences        # in another shell
    python3 examples/clients/streaming_counter_client.py [--url http://127.0.0.1:8080] [--grpc 127.0.0.1:8081]

The ``streaming-counter`` model keeps a running sum per sequence; an odd number streams the sum for
a while, -1 cancels the sequence's running streams, 0 ends the sequence. Over REST the stream is
read from ``/infer_stream`` (Server-Sent Events) while the update and the cancel go to ``/infer``
with TorchServe's ``ts_request_sequence_id`` header; over gRPC every request of the sequence goes up
one ``ModelStreamInfer`` call, and the answers come back tagged with their request's id. Either
way the stream shows the update (its sum changes) and stops at the cancel, before its natural end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
from httpx_sse import aconnect_sse
from tritonclient.grpc import service_pb2 as pb

MODEL = "streaming-counter"
METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


def body(x: int, **parameters: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [x]}],
        "parameters": parameters,
    }


def _line(label: str, document: dict[str, Any]) -> tuple[str, int, str | None]:
    parameters = document.get("parameters", {})
    return label, document["outputs"][0]["data"][0], parameters.get("finish_reason")


def over_rest(url: str, sequence_id: str | None = None) -> list[tuple[str, int, str | None]]:
    """Start a sequence, stream x=5, send an update (x=4) and a cancel (x=-1) while it streams, end it.

    Returns (request, total, finish_reason) for every answer, in the order they arrived.
    """
    return asyncio.run(_over_rest(url, sequence_id or f"rest-{uuid.uuid4().hex[:8]}"))


async def _over_rest(url: str, sequence_id: str) -> list[tuple[str, int, str | None]]:
    header = {"ts_request_sequence_id": sequence_id}
    infer, stream = f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/infer_stream"
    log: list[tuple[str, int, str | None]] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def send(label: str, x: int) -> None:  # a unary request of the sequence, meanwhile
            log.append(
                _line(
                    label, (await client.post(infer, json=body(x), headers=header)).raise_for_status().json()
                )
            )

        started = await client.post(
            infer, json=body(2), headers={**header, "ts_request_sequence_start": "true"}
        )
        log.append(_line("start x=2", started.raise_for_status().json()))
        side = []
        async with aconnect_sse(client, "POST", stream, json=body(5), headers=header) as source:
            source.response.raise_for_status()
            async for event in source.aiter_sse():
                if event.event == "error":
                    raise RuntimeError(json.loads(event.data)["error"])
                log.append(_line("stream x=5", json.loads(event.data)))
                streamed = sum(label == "stream x=5" for label, _, _ in log)
                if streamed == 1:  # the stream is running: update the sum it reports...
                    side.append(asyncio.create_task(send("update x=4", 4)))
                elif streamed == 3:  # ...and, a little later, cancel it
                    side.append(asyncio.create_task(send("cancel x=-1", -1)))
        await asyncio.gather(*side)
        ended = (await client.post(infer, json=body(0), headers=header)).raise_for_status()
        log.append(
            _line(f"end x=0 (sequence_end={ended.headers.get('ts_request_sequence_end')})", ended.json())
        )
    return log


def _request(request_id: str, x: int, sequence_id: str, start: bool = False) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    request.parameters["sequence_id"].string_param = sequence_id
    if start:
        request.parameters["sequence_start"].bool_param = True
    tensor = request.inputs.add(name="x", datatype="INT64", shape=[1])
    tensor.contents.int64_contents.append(x)
    return request


def over_grpc(address: str, sequence_id: str | None = None) -> list[tuple[str, int, str | None]]:
    """The same over one ModelStreamInfer call: every request of the sequence goes up the same call."""
    sequence_id = sequence_id or f"grpc-{uuid.uuid4().hex[:8]}"
    outbox: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()

    def requests() -> Iterator[pb.ModelInferRequest]:
        while (item := outbox.get()) is not None:
            yield item

    labels = {
        "start": "start x=2",
        "stream": "stream x=5",
        "update": "update x=4",
        "cancel": "cancel x=-1",
        "end": "end x=0",
    }
    log = []
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            METHOD,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        outbox.put(_request("start", 2, sequence_id, start=True))
        outbox.put(_request("stream", 5, sequence_id))
        streamed = 0
        for response in call(requests(), timeout=30):
            if "error" in response.parameters:
                raise RuntimeError(response.parameters["error"].string_param)
            finish = (
                response.parameters["finish_reason"].string_param
                if "finish_reason" in response.parameters
                else None
            )
            log.append((labels[response.id], response.outputs[0].contents.int64_contents[0], finish))
            if response.id == "stream":
                streamed += 1
                if streamed == 1:
                    outbox.put(_request("update", 4, sequence_id))
                elif streamed == 3:
                    outbox.put(_request("cancel", -1, sequence_id))
                if finish is not None:  # the stream is over: end the sequence, then half-close
                    outbox.put(_request("end", 0, sequence_id))
                    outbox.put(None)
    return log


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--grpc", default="127.0.0.1:8081", help="gRPC address ('' to skip)")
    args = parser.parse_args()
    runs = [("REST", over_rest(args.url))]
    if args.grpc:
        runs.append(("gRPC", over_grpc(args.grpc)))
    for transport, log in runs:
        print(f"{transport}:")
        for label, total, finish in log:
            print(f"  {label:<32} -> {total:>3}" + (f"   ({finish})" if finish else ""))


if __name__ == "__main__":
    main()
