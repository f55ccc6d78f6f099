"""The bare ceilings the benchmark compares the server with, each a server of its own.

    python3 -m benchmarks.bare rest|grpc|torch [--width 256] [--hidden 1024] [--threads 1]

It listens on a free port of 127.0.0.1, prints that port on the first line of stdout and serves
until SIGTERM. Each is the least a server must do to give the same answer, on the same stack the
server uses (uvicorn with httptools and uvloop; grpc.aio on uvloop):

- ``rest``: a Starlette endpoint that parses the infer JSON with orjson and answers the echo
  model's response (the inputs as outputs, the id, the model's name and version);
- ``grpc``: a grpc.aio ModelInfer servicer on the project's generated stubs that answers the
  echo model's response message;
- ``torch``: a Starlette endpoint serving the benchmarks' torch MLP (``mlp_model.build``, the
  same weights) one request at a time, the forward pass called inline on the event loop (no
  thread hop, no queue, no batching): the binary tensor extension in and out, as tritonclient
  sends it. The ceiling of a server that does not batch.
"""

from __future__ import annotations

import argparse
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GRPC_OPTIONS = [("grpc.max_send_message_length", 100 << 20), ("grpc.max_receive_message_length", 100 << 20)]


def _listen() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    return sock


def _serve_asgi(app: Any) -> None:
    import uvicorn

    sock = _listen()
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(
        app, log_config=None, access_log=False, http="httptools", loop="uvloop", lifespan="off"
    )
    uvicorn.Server(config).run(sockets=[sock])


def rest_app() -> Any:
    import orjson
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def infer(request: Request) -> Response:
        body = orjson.loads(await request.body())
        outputs = [
            {"name": i["name"], "datatype": i["datatype"], "shape": i["shape"], "data": i["data"]}
            for i in body["inputs"]
        ]
        doc = {
            "model_name": request.path_params["m"],
            "model_version": "1",
            "id": body.get("id") or str(uuid.uuid4()),
            "outputs": outputs,
        }
        return Response(orjson.dumps(doc), media_type="application/json")

    return Starlette(routes=[Route("/v2/models/{m}/infer", infer, methods=["POST"])])


def torch_app(width: int, hidden: int, threads: int) -> Any:
    import numpy as np
    import orjson
    import torch
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    sys.path.insert(0, str(ROOT))
    from benchmarks.mlp_model import build

    torch.set_num_threads(threads)
    net = build(width, hidden)

    async def infer(request: Request) -> Response:
        body = await request.body()
        size = int(request.headers.get("inference-header-content-length", len(body)))
        tensor = orjson.loads(body[:size])["inputs"][0]
        x = np.frombuffer(body, dtype="<f4", offset=size).reshape(tensor["shape"]).copy()
        with torch.inference_mode():
            y = net(torch.from_numpy(x)).numpy()
        data = y.tobytes()
        header = orjson.dumps(
            {
                "model_name": request.path_params["m"],
                "id": str(uuid.uuid4()),
                "outputs": [
                    {
                        "name": "y",
                        "datatype": "FP32",
                        "shape": list(y.shape),
                        "parameters": {"binary_data_size": len(data)},
                    }
                ],
            }
        )
        return Response(
            header + data,
            media_type="application/octet-stream",
            headers={"inference-header-content-length": str(len(header))},
        )

    return Starlette(routes=[Route("/v2/models/{m}/infer", infer, methods=["POST"])])


async def serve_grpc() -> None:
    import grpc

    from runtime.frontends.grpc.generated import dataplane_pb2 as pb
    from runtime.frontends.grpc.generated import dataplane_pb2_grpc

    class BareEcho(dataplane_pb2_grpc.GRPCInferenceServiceServicer):
        async def ModelInfer(self, request: Any, context: object) -> Any:
            response = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
            for tensor in request.inputs:
                out = response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
                if not request.raw_input_contents:
                    out.contents.CopyFrom(tensor.contents)
            response.raw_output_contents.extend(request.raw_input_contents)
            return response

    server = grpc.aio.server(options=GRPC_OPTIONS)
    dataplane_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(BareEcho(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=["rest", "grpc", "torch"])
    parser.add_argument("--width", type=int, default=256, help="torch: the MLP's input and output width")
    parser.add_argument("--hidden", type=int, default=1024, help="torch: the MLP's hidden width")
    parser.add_argument("--threads", type=int, default=1, help="torch: intra-op threads")
    args = parser.parse_args()
    if args.kind == "rest":
        _serve_asgi(rest_app())
    elif args.kind == "torch":
        _serve_asgi(torch_app(args.width, args.hidden, args.threads))
    else:
        import uvloop

        sys.path.insert(0, str(ROOT))
        uvloop.run(serve_grpc())


if __name__ == "__main__":
    main()
