"""The repository extension's load and unload on the inference ports need the management key.

By default (``repository_token_auth``) a client that may infer may not unload every model: REST
``POST /v2/repository/models/{m}/load|unload`` and gRPC ``RepositoryModelLoad|Unload`` (under
both service names) are refused with 401 / UNAUTHENTICATED unless they carry
``Authorization: Bearer <key>``, the key of the management API (the same key file). The index,
read-only, stays open. With the setting off they are open, as before. Real clients: httpx,
grpcio's stubs and tritonclient (HTTP and gRPC).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.server.serving import Server
from tests.servers import serving, start_server

pytestmark = pytest.mark.anyio

SERVICES = ("inference.GRPCInferenceService", "inference.model_repository.ModelRepositoryService")


def _repository(root: Path) -> Path:
    folder = root / "models" / "echo"
    folder.mkdir(parents=True)
    (folder / "model-settings.json").write_text(
        json.dumps({"name": "echo", "implementation": "tests.models.zoo.Echo"})
    )
    return root / "models"


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[tuple[Server, str]]:
    """A server with the default settings, and its management key (read from its key file)."""
    key_file = tmp_path / "key_file.json"
    async with serving(
        model_repository_root=str(_repository(tmp_path)), management_key_file=str(key_file)
    ) as server:
        await server.load_models()
        yield server, json.loads(key_file.read_text())["management"]["key"]


def _rpc(channel: grpc.aio.Channel, service: str, method: str) -> Any:
    request, response = {
        "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
        "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
    }[method]
    return channel.unary_unary(
        f"/{service}/{method}",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )


async def test_rest_load_and_unload_need_the_key(guarded: tuple[Server, str]) -> None:
    server, key = guarded
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as client:
        for action in ("unload", "load"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):
                refused = await client.post(f"/v2/repository/models/echo/{action}", headers=headers)
                assert refused.status_code == 401, refused.text
                assert "management key" in refused.json()["error"]
                assert refused.headers["www-authenticate"] == "Bearer"
        assert server.registry.get("echo").model is not None  # nothing was unloaded
        # the index is read-only and stays open
        index = await client.post("/v2/repository/index")
        assert index.status_code == 200 and [m["name"] for m in index.json()] == ["echo"]
        bearer = {"Authorization": f"Bearer {key}"}
        assert (await client.post("/v2/repository/models/echo/unload", headers=bearer)).status_code == 200
        assert "echo" not in {entry.name for entry in server.registry.entries()}
        assert (await client.post("/v2/repository/models/echo/load", headers=bearer)).status_code == 200
        assert (await client.get("/v2/models/echo/ready")).status_code == 200


@pytest.mark.parametrize("service", SERVICES)
async def test_grpc_load_and_unload_need_the_key(guarded: tuple[Server, str], service: str) -> None:
    server, key = guarded
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        for method, request in (
            ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="echo")),
            ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="echo")),
        ):
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _rpc(channel, service, method)(request, metadata=metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "management key" in (refused.value.details() or "")
        assert server.registry.get("echo").model is not None
        stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
        index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
        assert [m.name for m in index.models] == ["echo"]
        bearer = (("authorization", f"Bearer {key}"),)
        await _rpc(channel, service, "RepositoryModelUnload")(
            pb.RepositoryModelUnloadRequest(model_name="echo"), metadata=bearer
        )
        assert "echo" not in {entry.name for entry in server.registry.entries()}
        await _rpc(channel, service, "RepositoryModelLoad")(
            pb.RepositoryModelLoadRequest(model_name="echo"), metadata=bearer
        )
        assert (await stub.ModelReady(pb.ModelReadyRequest(name="echo"))).ready


def _tritonclient(http_port: int, grpc_port: int, key: str | None) -> list[str]:
    """Unload then load with tritonclient's HTTP and gRPC clients; what each call raised."""
    tritonhttp = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
    tritongrpc = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
    from tritonclient.utils import InferenceServerException

    headers = {"authorization": f"Bearer {key}"} if key else None  # gRPC metadata keys are lowercase
    raised = []
    for module, url in ((tritonhttp, f"127.0.0.1:{http_port}"), (tritongrpc, f"127.0.0.1:{grpc_port}")):
        client = module.InferenceServerClient(url)
        try:
            for call in (client.unload_model, client.load_model):
                try:
                    call("echo", headers=headers)
                    raised.append("")
                except InferenceServerException as exc:
                    raised.append(str(exc))
        finally:
            client.close()
    return raised


def test_tritonclient_unloads_and_loads_with_the_key(tmp_path: Path) -> None:
    """tritonclient's HTTP client runs on gevent, whose hub belongs to one thread: it is driven from
    this test's own thread, against a server in a process of its own (not from a worker thread of
    the event loop, where its objects would be collected in another thread than their hub's)."""
    server = start_server(_repository(tmp_path))
    try:
        http_port = int(server.http_address.rsplit(":", 1)[1])
        grpc_port = int(server.grpc_address.rsplit(":", 1)[1])
        refused = _tritonclient(http_port, grpc_port, None)
        assert len(refused) == 4 and all("management key" in message for message in refused), refused
        key = server.authorization()["authorization"].removeprefix("Bearer ")
        assert _tritonclient(http_port, grpc_port, key) == ["", "", "", ""]
        ready = httpx.get(f"{server.http_url}/v2/models/echo/ready", timeout=30)
        assert ready.status_code == 200
    finally:
        server.stop()


async def test_the_setting_opens_them(tmp_path: Path) -> None:
    async with serving(
        model_repository_root=str(_repository(tmp_path)), repository_token_auth=False
    ) as server:
        await server.load_models()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as client:
            assert (await client.post("/v2/repository/models/echo/unload")).status_code == 200
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="echo"))
            assert (await stub.ModelReady(pb.ModelReadyRequest(name="echo"))).ready
