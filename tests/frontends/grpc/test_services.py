"""Health, reflection and the model repository (over gRPC, tritonclient and REST) on a real server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.utils import InferenceServerException

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.grpc_support import InferenceStub, inference_stub, raw_request
from tests.servers import RunningServer


@pytest.fixture(scope="module")
def channel(grpc_server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(grpc_server.grpc_address) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> dataplane_pb2_grpc.GRPCInferenceServiceStub:
    return dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def keyed(grpc_server: RunningServer) -> tuple[tuple[str, str], ...]:
    """The metadata the repository's load and unload need (the management key)."""
    return tuple(grpc_server.authorization().items())


# ---------------------------------------------------------------------- health and reflection


def test_health_service_answers_probes(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "inference.GRPCInferenceService"):
        response = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()


def test_reflection_lists_and_describes_the_services(channel: grpc.Channel) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
    ]
    listing, described = list(reflection.ServerReflectionInfo(iter(requests)))
    names = {service.name for service in listing.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    service = next(s for f in files for s in f.service if s.name == "GRPCInferenceService")
    assert {m.name for m in service.method} >= {"ModelInfer", "ModelStreamInfer", "RepositoryModelLoad"}


# ---------------------------------------------------------------------- the model repository


def index(stub: InferenceStub, ready: bool = False) -> dict[str, tuple[str, str]]:
    response = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready))
    return {m.name: (m.state, m.reason) for m in response.models}


def tag_of(stub: InferenceStub) -> str:
    response = stub.ModelInfer(raw_request("tagged", x=np.zeros(1, np.int8)))
    return cast(str, response.parameters["tag"].string_param)


def set_tag(folder: Path, tag: str) -> None:
    path = folder / "tagged" / "model-settings.json"
    settings = json.loads(path.read_text())
    settings["parameters"]["extra"]["tag"] = tag
    path.write_text(json.dumps(settings))


def test_index_lists_loaded_and_failed_models(stub: InferenceStub) -> None:
    models = index(stub)
    assert models["mirror"] == ("READY", "")
    state, reason = models["broken"]
    assert state == "UNAVAILABLE" and "RuntimeError: broken on purpose" in reason
    assert "broken" not in index(stub, ready=True)


def test_load_unload_and_reload_over_grpc(
    grpc_models: Path, stub: InferenceStub, keyed: tuple[tuple[str, str], ...]
) -> None:
    stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="tagged"), metadata=keyed)
    assert index(stub)["tagged"] == ("UNAVAILABLE", "not loaded")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(raw_request("tagged", x=np.zeros(1, np.int8)))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="tagged"), metadata=keyed)
    assert index(stub)["tagged"] == ("READY", "")
    set_tag(grpc_models, "second")
    stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="tagged"), metadata=keyed)  # re-reads
    assert tag_of(stub) == "second"


def test_reload_drops_no_traffic(
    grpc_server: RunningServer, grpc_models: Path, keyed: tuple[tuple[str, str], ...]
) -> None:
    """Requests keep flowing while the model is reloaded: the new instance is swapped in once ready."""
    failures: list[BaseException] = []
    tags: set[str] = set()
    stop = threading.Event()
    done = 0

    def traffic() -> None:
        nonlocal done
        with inference_stub(grpc_server.grpc_address) as stub:
            while not stop.is_set():
                try:
                    tags.add(tag_of(stub))
                    done += 1
                except grpc.RpcError as exc:
                    failures.append(exc)

    with inference_stub(grpc_server.grpc_address) as stub:
        tag_of(stub)
        worker = threading.Thread(target=traffic)
        worker.start()
        try:
            for tag in ("r1", "r2", "r3"):
                set_tag(grpc_models, tag)
                stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="tagged"), metadata=keyed)
        finally:
            stop.set()
            worker.join()
        assert tag_of(stub) == "r3"
    assert not failures and done > 0


@pytest.mark.parametrize(
    ("rpc", "request_", "code", "message"),
    [
        (
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(model_name="nope"),
            "NOT_FOUND",
            "Model 'nope' not found",
        ),
        (
            "RepositoryModelUnload",
            pb.RepositoryModelUnloadRequest(model_name="nope"),
            "NOT_FOUND",
            "Model 'nope' not found",
        ),
        (
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(model_name="broken"),
            "INTERNAL",
            "broken on purpose",
        ),
        (
            "RepositoryModelLoad",
            pb.RepositoryModelLoadRequest(
                model_name="tagged", parameters={"config": pb.ModelRepositoryParameter(string_param="{}")}
            ),
            "INVALID_ARGUMENT",
            "not supported",
        ),
    ],
)
def test_repository_errors(
    stub: InferenceStub,
    keyed: tuple[tuple[str, str], ...],
    rpc: str,
    request_: Message,
    code: str,
    message: str,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, rpc)(request_, metadata=keyed)
    assert info.value.code().name == code and message in info.value.details()
    assert stub.ServerReady(pb.ServerReadyRequest()).ready


def test_tritonclient_repository_calls(grpc_server: RunningServer) -> None:
    client = triton.InferenceServerClient(grpc_server.grpc_address)
    try:
        names = {m.name for m in client.get_model_repository_index().models}
        assert {"mirror", "strict", "tagged", "broken"} <= names
        key = grpc_server.authorization()
        client.unload_model("tagged", headers=key)
        assert not any(
            m.name == "tagged" and m.state == "READY" for m in client.get_model_repository_index().models
        )
        client.load_model("tagged", headers=key)
        assert client.is_model_ready("tagged")
        with pytest.raises(InferenceServerException) as info:
            client.load_model("nope", headers=key)
        assert info.value.status() == "StatusCode.NOT_FOUND"
    finally:
        client.close()


def test_mlserver_repository_service_name(channel: grpc.Channel) -> None:
    """MLServer's clients call the repository under its own service; same messages on the wire."""
    service = "/inference.model_repository.ModelRepositoryService/"
    call = channel.unary_unary(
        service + "RepositoryIndex",
        request_serializer=pb.RepositoryIndexRequest.SerializeToString,
        response_deserializer=pb.RepositoryIndexResponse.FromString,
    )
    assert "mirror" in {m.name for m in call(pb.RepositoryIndexRequest()).models}


def test_rest_repository_routes(grpc_server: RunningServer) -> None:
    with httpx.Client(base_url=grpc_server.http_url, headers=grpc_server.authorization()) as http:
        listing = http.post("/v2/repository/index")
        assert listing.status_code == 200
        by_name = {item["name"]: item for item in listing.json()}
        assert by_name["mirror"] == {"name": "mirror", "version": "1", "state": "READY", "reason": ""}
        ready = http.post("/v2/repository/index", json={"ready": True}).json()
        assert "broken" not in {item["name"] for item in ready}
        assert http.post("/v2/repository/models/tagged/unload").status_code == 200
        assert http.get("/v2/models/tagged/ready").status_code == 404
        assert http.post("/v2/repository/models/tagged/load").status_code == 200
        assert http.get("/v2/models/tagged/ready").status_code == 200
        missing = http.post("/v2/repository/models/nope/load")
        assert missing.status_code == 404 and missing.json() == {"error": "Model 'nope' not found"}
        assert http.post("/v2/repository/models/nope/unload").status_code == 404
        failed = http.post("/v2/repository/models/broken/load")
        assert failed.status_code == 500 and "broken on purpose" in failed.json()["error"]
        bad = http.post("/v2/repository/index", content=b"{not json")
        assert bad.status_code == 400
