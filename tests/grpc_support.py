"""Helpers for the gRPC tests: servers over a copy of tests/models/grpc, stubs, log waits."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.servers import RunningServer, start_server

GRPC_MODELS = Path(__file__).resolve().parent / "models" / "grpc"
MAX_MESSAGE = 1 << 20

InferenceStub = dataplane_pb2_grpc.GRPCInferenceServiceStub
"""The type of the stubs the tests call (the generated class; its methods are untyped)."""


@pytest.fixture(scope="session")
def grpc_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``grpc_server`` serves (a copy of tests/models/grpc)."""
    return tmp_path_factory.mktemp("grpc") / "models"


@pytest.fixture(scope="session")
def grpc_server(grpc_models: Path) -> Iterator[RunningServer]:
    """A server (MLServer stream format) on a copy of tests/models/grpc, shared by the session.

    Import it into a test module to use it. Repository tests may edit, load and unload only the
    models ``tagged`` and ``broken``; the others stay as they are for everyone else.
    """
    with serving_copy(grpc_models, "--grpc-max-message-length", str(MAX_MESSAGE)) as running:
        yield running


@contextmanager
def serving_copy(folder: Path, *flags: str) -> Iterator[RunningServer]:
    """A real server on a fresh copy of tests/models/grpc (tests may edit the copy)."""
    shutil.copytree(GRPC_MODELS, folder)
    server = start_server(folder, *flags)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def inference_stub(address: str) -> Iterator[dataplane_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(address) as channel:
        yield dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)


def raw_request(model: str, request_id: str = "", **arrays: np.ndarray) -> pb.ModelInferRequest:
    """A ModelInferRequest carrying ``arrays`` (numeric) in raw_input_contents."""
    from runtime.tensors import datatype_of

    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype=datatype_of(array.dtype), shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    return request


def wait_for_log(server: RunningServer, pattern: str, timeout: float = 30.0) -> str:
    """Block until the server writes a log line matching ``pattern``; return that line."""
    return server.wait_for_log(pattern, timeout)
