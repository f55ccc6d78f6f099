"""TorchServe archives through both management front ends, as TorchServe's users register them:
``curl -X POST "localhost:8081/models?url=echo.mar"`` and the gRPC ``RegisterModel``. Both are the
one management core: the same archives, the same ``allowed_urls`` refusal, the same description,
TorchServe's error types and gRPC codes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import grpc
import httpx
import pytest

pytest.importorskip("ts", reason="the torchserve extra (pip install -e '.[torchserve]') is not installed")

from runtime.frontends.grpc.generated import ts_management_pb2 as mpb
from runtime.frontends.grpc.generated import ts_management_pb2_grpc as mpb_grpc
from tests.servers import serving
from tests.torchserve.archiver import run_model_archiver

pytestmark = pytest.mark.anyio

HANDLERS = Path(__file__).resolve().parents[1] / "models" / "torchserve"


async def test_a_mar_registers_through_rest_and_grpc_alike(tmp_path: Path) -> None:
    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    for name in ("echo", "twin"):
        run_model_archiver(
            "--model-name", name, "--version", "1.0", "--handler", str(HANDLERS / "echo_handler.py"),
            "--export-path", str(store),
        )  # fmt: skip
    shutil.copy(store / "echo.mar", elsewhere / "stray.mar")
    async with serving(
        model_repository_root=str(store), management_token_auth=False, grpc_management_port=0
    ) as server:
        assert server.management_port is not None and server._grpc is not None
        management = f"http://127.0.0.1:{server.management_port}"
        async with httpx.AsyncClient(base_url=management) as admin:
            registered = await admin.post("/models", params={"url": "echo.mar", "synchronous": "true"})
            assert registered.status_code == 200, registered.text
            assert registered.json() == {
                "status": 'Model "echo" Version: 1.0 registered with in the server process (0 workers)'
            }
            assert (await admin.get("/models")).json() == {
                "models": [{"modelName": "echo", "modelUrl": "echo.mar"}]
            }
            outside = await admin.post("/models", params={"url": str(elsewhere / "stray.mar")})
            assert outside.status_code == 403 and outside.json()["type"] == "ForbiddenException"
            again = await admin.post("/models", params={"url": "echo.mar", "synchronous": "true"})
            assert again.status_code == 409 and again.json()["type"] == "ConflictStatusException"
            rest_described = (await admin.get("/models/echo")).json()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            answer = await client.post("/predictions/echo", content=b"hello")
            assert answer.status_code == 200
            assert answer.json()["data"] == {"body": {"bytes": "hello"}}

        address = f"127.0.0.1:{server._grpc.management_port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = mpb_grpc.ManagementAPIsServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.RegisterModel(mpb.RegisterModelRequest(url=str(elsewhere / "stray.mar")))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # TorchServe's 403
            assert (
                refused.value.details()
                == f"Given URL {elsewhere / 'stray.mar'} does not match any allowed URL(s)"
            )
            with pytest.raises(grpc.aio.AioRpcError) as conflict:
                await stub.RegisterModel(mpb.RegisterModelRequest(url="echo.mar", synchronous=True))
            assert conflict.value.code() == grpc.StatusCode.ABORTED  # TorchServe's 409
            done = await stub.RegisterModel(mpb.RegisterModelRequest(url="twin.mar", synchronous=True))
            assert done.msg == 'Model "twin" Version: 1.0 registered with in the server process (0 workers)'
            grpc_described = json.loads(
                (await stub.DescribeModel(mpb.DescribeModelRequest(model_name="echo"))).msg
            )
            listed = json.loads((await stub.ListModels(mpb.ListModelsRequest(limit=10))).msg)
            assert listed == {
                "models": [
                    {"modelName": "echo", "modelUrl": "echo.mar"},
                    {"modelName": "twin", "modelUrl": "twin.mar"},
                ]
            }
        for described in (rest_described, grpc_described):  # one description, whichever front end asks
            for worker in described[0]["workers"]:
                worker.pop("memoryUsage")
        assert grpc_described == rest_described
        assert rest_described[0]["modelUrl"] == "echo.mar" and rest_described[0]["modelVersion"] == "1.0"


async def test_min_workers_of_model_config_are_worker_processes(tmp_path: Path) -> None:
    """``minWorkers: 2`` in model-config.yaml: two worker processes, each with its own handler,
    as TorchServe runs them; described with their pids, and each request answered by one of them."""
    store = tmp_path / "store"
    store.mkdir()
    config = tmp_path / "model-config.yaml"
    config.write_text("minWorkers: 2\nmaxWorkers: 2\n")
    run_model_archiver(
        "--model-name", "echo", "--version", "1.0", "--handler", str(HANDLERS / "echo_handler.py"),
        "--config-file", str(config), "--export-path", str(store),
    )  # fmt: skip
    async with serving(model_repository_root=str(store), management_token_auth=False) as server:
        assert server.management_port is not None
        # two processes import the handler (and torch, through ts): slow on a busy machine
        management = f"http://127.0.0.1:{server.management_port}"
        async with httpx.AsyncClient(base_url=management, timeout=120) as admin:
            registered = await admin.post("/models", params={"url": "echo.mar", "synchronous": "true"})
            assert registered.json() == {
                "status": 'Model "echo" Version: 1.0 registered with 2 initial workers'
            }
            described = (await admin.get("/models/echo")).json()[0]
        assert described["parallelType"] == "workers" and described["minWorkers"] == 2
        pids = {worker["pid"] for worker in described["workers"]}
        assert len(pids) == 2 and os.getpid() not in pids
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            answer = await client.post("/predictions/echo", content=b"hello")
        assert answer.status_code == 200 and answer.json()["data"] == {"body": {"bytes": "hello"}}
