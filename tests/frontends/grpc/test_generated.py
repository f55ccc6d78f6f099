"""The checked-in stubs match proto/, and the proto matches the wire of Triton's clients."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc
from google.protobuf.descriptor import Descriptor

from runtime.frontends.grpc.generated import dataplane_pb2 as pb

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "runtime" / "frontends" / "grpc" / "generated"


def pinned_grpcio_tools() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"grpcio-tools==([^"]+)"', text)
    assert match, "pyproject.toml's test extra must pin grpcio-tools exactly"
    return match.group(1)


def test_checked_in_stubs_match_the_proto(tmp_path: Path) -> None:
    pinned, installed = pinned_grpcio_tools(), importlib.metadata.version("grpcio-tools")
    assert installed == pinned, f"grpcio-tools {installed} is installed; the stubs are made with {pinned}"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_grpc.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    checked_in = {
        p.name: p.read_bytes() for p in GENERATED.iterdir() if p.name != "__init__.py" and p.is_file()
    }
    assert sorted(fresh) == sorted(checked_in)
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, f"{stale} differ from proto/: run python3 scripts/generate_grpc.py"


# messages whose field numbers, types and names must be Triton's (and so KServe's and MLServer's)
SHARED = [
    "ServerLiveResponse",
    "ServerReadyResponse",
    "ModelReadyRequest",
    "ModelReadyResponse",
    "ServerMetadataResponse",
    "ModelMetadataRequest",
    "ModelMetadataResponse",
    "ModelMetadataResponse.TensorMetadata",
    "InferParameter",
    "InferTensorContents",
    "ModelInferRequest",
    "ModelInferRequest.InferInputTensor",
    "ModelInferRequest.InferRequestedOutputTensor",
    "ModelInferResponse",
    "ModelInferResponse.InferOutputTensor",
    "ModelStreamInferResponse",
    "ModelRepositoryParameter",
    "RepositoryIndexRequest",
    "RepositoryIndexResponse",
    "RepositoryIndexResponse.ModelIndex",
    "RepositoryModelLoadRequest",
    "RepositoryModelUnloadRequest",
]


def _fields(descriptor: Descriptor) -> set[tuple[int, str, int, bool]]:
    return {
        (f.number, f.name, f.type, f.message_type is not None and f.message_type.GetOptions().map_entry)
        for f in descriptor.fields
    }


@pytest.mark.parametrize("name", SHARED)
def test_messages_are_wire_compatible_with_tritonclient(name: str) -> None:
    ours = pb.DESCRIPTOR.message_types_by_name[name.split(".")[0]]
    theirs = triton_grpc.service_pb2.DESCRIPTOR.message_types_by_name[name.split(".")[0]]
    for part in name.split(".")[1:]:
        ours, theirs = ours.nested_types_by_name[part], theirs.nested_types_by_name[part]
    assert _fields(ours) == _fields(theirs)


def test_service_methods_match_tritonclient() -> None:
    ours = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_grpc.service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == other.input_type.full_name
        if method.name != "ModelStreamInfer":  # ours streams MLServer's message by default
            assert method.output_type.full_name == other.output_type.full_name


def test_stubs_and_tritonclient_share_a_process() -> None:
    """Both declare inference.* messages; ours live in their own descriptor pool, so both import."""
    request = triton_grpc.service_pb2.ModelInferRequest(model_name="m")
    request.parameters["big"].uint64_param = 2**64 - 1
    parsed = pb.ModelInferRequest.FromString(request.SerializeToString())
    assert parsed.model_name == "m" and parsed.parameters["big"].uint64_param == 2**64 - 1
