"""A gRPC client with the command line of TorchServe's ``ts_scripts/torchserve_grpc_client.py``.

It imports the stubs generated from TorchServe's protos next to it, exactly as TorchServe's
documents make them (here from this repository's proto/torchserve/)::

    python -m grpc_tools.protoc -I proto/torchserve -I $(python -c "import google.rpc, os; \
        print(os.path.dirname(os.path.dirname(google.rpc.__path__[0])))") \
        --python_out=examples/torchserve --grpc_python_out=examples/torchserve \
        proto/torchserve/inference.proto proto/torchserve/management.proto

    python examples/torchserve/torchserve_grpc_client.py infer <model> <file>
    python examples/torchserve/torchserve_grpc_client.py infer_stream <model> <file>
    python examples/torchserve/torchserve_grpc_client.py infer_stream2 <model> <sequence_id> <f1,f2,...>
    python examples/torchserve/torchserve_grpc_client.py register <model> [<mar_set>]
    python examples/torchserve/torchserve_grpc_client.py unregister <model>

It talks to localhost:7070 (inference) and localhost:7071 (management), TorchServe's ports
(``mlserver-like start ... --torchserve`` listens there); ``--host``, ``--inference-port`` and
``--management-port`` point it elsewhere. Every call carries the metadata ``protocol: gRPC`` and
``session_id: 12345`` (and ``authorization: Bearer T`` with ``--auth-token T``). Any gRPC error
exits with status 1.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import inference_pb2  # type: ignore[import-not-found]
import inference_pb2_grpc  # type: ignore[import-not-found]
import management_pb2  # type: ignore[import-not-found]
import management_pb2_grpc  # type: ignore[import-not-found]

S3_URL = "https://torchserve.s3.amazonaws.com/mar_files/{}.mar"


def metadata(token: str | None) -> list[tuple[str, str]]:
    items = [("protocol", "gRPC"), ("session_id", "12345")]
    if token:
        items.append(("authorization", f"Bearer {token}"))
    return items


def infer(stub: Any, model: str, path: str, meta: list[tuple[str, str]]) -> None:
    with open(path, "rb") as f:
        data = f.read()
    response = stub.Predictions(
        inference_pb2.PredictionsRequest(model_name=model, input={"data": data}), metadata=meta
    )
    print(response.prediction.decode("utf-8"))


def infer_stream(stub: Any, model: str, path: str, meta: list[tuple[str, str]]) -> None:
    with open(path, "rb") as f:
        data = f.read()
    responses = stub.StreamPredictions(
        inference_pb2.PredictionsRequest(model_name=model, input={"data": data}), metadata=meta
    )
    for response in responses:
        print(response.prediction.decode("utf-8"))


class _Requests:
    """The requests of one StreamPredictions2 call, fed from a queue; None half-closes."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()

    def __iter__(self) -> Iterator[Any]:
        while (item := self.queue.get()) is not None:
            yield item


def infer_stream2(
    stub: Any, model: str, sequence_id: str, paths: list[str], meta: list[tuple[str, str]]
) -> None:
    """One bidirectional call: a request per file, each answer printed as it comes."""
    requests = _Requests()
    responses = stub.StreamPredictions2(iter(requests), metadata=meta)
    answers: queue.Queue[Any] = queue.Queue()

    def read() -> None:
        try:
            for response in responses:
                answers.put(response)
        except grpc.RpcError as exc:
            answers.put(exc)
        answers.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        requests.queue.put(
            inference_pb2.PredictionsRequest(model_name=model, sequence_id=sequence_id, input={"data": data})
        )
        answer = answers.get()
        if answer is None:
            break
        if isinstance(answer, grpc.RpcError):
            raise answer
        print(str(answer))
    print("Sequence completed!")
    requests.queue.put(None)
    reader.join()


def register(stub: Any, model: str, mar_set: str | None, meta: list[tuple[str, str]]) -> None:
    local = set(mar_set.split(",")) if mar_set else set()
    url = f"{model}.mar" if model in local else S3_URL.format(model)
    response = stub.RegisterModel(
        management_pb2.RegisterModelRequest(url=url, initial_workers=1, synchronous=True, model_name=model),
        metadata=meta,
    )
    print(f"Model {model} registered successfully")
    print(response.msg)


def unregister(stub: Any, model: str, meta: list[tuple[str, str]]) -> None:
    response = stub.UnregisterModel(management_pb2.UnregisterModelRequest(model_name=model), metadata=meta)
    print(f"Model {model} unregistered successfully")
    print(response.msg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="TorchServe gRPC client")
    parser.add_argument("--auth-token", default=None)
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--inference-port", type=int, default=7070)
    parser.add_argument("--management-port", type=int, default=7071)
    commands = parser.add_subparsers(dest="action", required=True)
    for name in ("infer", "infer_stream"):
        sub = commands.add_parser(name)
        sub.add_argument("model_name")
        sub.add_argument("model_input")
    sub = commands.add_parser("infer_stream2")
    sub.add_argument("model_name")
    sub.add_argument("sequence_id")
    sub.add_argument("input_files")
    sub = commands.add_parser("register")
    sub.add_argument("model_name")
    sub.add_argument("mar_set", nargs="?", default=None)
    sub = commands.add_parser("unregister")
    sub.add_argument("model_name")
    args = parser.parse_args(argv)
    meta = metadata(args.auth_token)
    inference = grpc.insecure_channel(f"{args.host}:{args.inference_port}")
    management = grpc.insecure_channel(f"{args.host}:{args.management_port}")
    try:
        if args.action in ("infer", "infer_stream", "infer_stream2"):
            stub = inference_pb2_grpc.InferenceAPIsServiceStub(inference)
            if args.action == "infer":
                infer(stub, args.model_name, args.model_input, meta)
            elif args.action == "infer_stream":
                infer_stream(stub, args.model_name, args.model_input, meta)
            else:
                infer_stream2(stub, args.model_name, args.sequence_id, args.input_files.split(","), meta)
        else:
            mstub = management_pb2_grpc.ManagementAPIsServiceStub(management)
            if args.action == "register":
                register(mstub, args.model_name, args.mar_set, meta)
            else:
                unregister(mstub, args.model_name, meta)
    except grpc.RpcError as exc:
        print(f"gRPC error: {exc.code()}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        inference.close()
        management.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
