"""Stream tokens from the textgen example over gRPC ``ModelStreamInfer`` (OIP, package ``inference``).

    mlserver-like start examples/streaming      # in another terminal (gRPC on 127.0.0.1:8081)
    python3 examples/clients/textgen_grpc.py "The keeper" "In the morning"

Several prompts go up one bidirectional stream; every response comes back tagged with the id of
the request it answers. Two clients are shown, one per wire format of the server's stream:

- ``stream_text``: the default format (MLServer's): the server streams ``ModelInferResponse``
  messages. A plain ``grpc`` stream-stream call, with the OIP messages that tritonclient ships
  (same package, service and field numbers as the OIP proto). An error for one request comes
  back in band, as a response with that request's id, no outputs and the parameters ``error``
  and ``error_code``; the stream goes on for the other prompts.
- ``triton_stream_text``: Triton's format (``ModelStreamInferResponse`` with in-band
  ``error_message`` and the ``triton_final_response`` parameter), which the server speaks when
  it is started with ``--grpc-stream-format triton``: tritonclient's ``start_stream`` /
  ``async_stream_infer`` work unchanged. Run with ``--triton`` for this one.
"""

from __future__ import annotations

import argparse
import queue
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


class GenerateError(Exception):
    """The server could not answer a prompt (its message says why)."""


def _request(model: str, request_id: str, prompt: str, max_tokens: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.parameters["max_tokens"].int64_param = max_tokens
    request.parameters["temperature"].double_param = 0.0
    tensor = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(prompt.encode("utf-8"))
    return request


def _text(response: pb.ModelInferResponse) -> str:
    if response.raw_output_contents:  # BYTES in raw form: a 4-byte little-endian length, then the bytes
        raw = response.raw_output_contents[0]
        return raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode("utf-8")
    return response.outputs[0].contents.bytes_contents[0].decode("utf-8")


def stream_text(
    address: str, prompts: list[str], model: str = "textgen", max_tokens: int = 60
) -> Iterator[tuple[str, str | GenerateError]]:
    """(request id, piece of text) for every response, as they arrive (default wire format).

    A prompt the server could not answer gives (its id, a GenerateError) instead; the others go on.
    """
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            METHOD,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        requests = (_request(model, f"p{i}", prompt, max_tokens) for i, prompt in enumerate(prompts))
        for response in call(requests):
            if "error" in response.parameters:
                code = response.parameters["error_code"].string_param
                yield response.id, GenerateError(f"{code}: {response.parameters['error'].string_param}")
            else:
                yield response.id, _text(response)


def triton_stream_text(
    address: str, prompt: str, model: str = "textgen", max_tokens: int = 60
) -> Iterator[str]:
    """The pieces of text for one prompt, with tritonclient (Triton wire format)."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([prompt.encode("utf-8")], dtype=object))
        client.async_stream_infer(
            model,
            [text],
            request_id="t0",
            # tritonclient sends int, bool and str parameters (no float): temperature 0 = greedy
            parameters={"max_tokens": max_tokens, "temperature": 0},
            enable_empty_final_response=True,
        )
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                raise GenerateError(error.message()) from error
            response = result.get_response()
            if response.outputs:
                yield result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")
            if response.parameters["triton_final_response"].bool_param:
                return
    finally:
        client.stop_stream()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--address", default="127.0.0.1:8081")
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--triton", action="store_true", help="use tritonclient (Triton stream format)")
    args = parser.parse_args()
    if args.triton:
        for prompt in args.prompts:
            sys.stdout.write(prompt)
            for piece in triton_stream_text(args.address, prompt, max_tokens=args.max_tokens):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
        return
    texts: dict[str, str] = {}
    for request_id, piece in stream_text(args.address, args.prompts, max_tokens=args.max_tokens):
        if isinstance(piece, GenerateError):
            texts[request_id] = f" (error: {piece})"
        else:
            texts[request_id] = texts.get(request_id, "") + piece
    for i, prompt in enumerate(args.prompts):
        print(f"[p{i}] {prompt}{texts.get(f'p{i}', '')}")


if __name__ == "__main__":
    main()
