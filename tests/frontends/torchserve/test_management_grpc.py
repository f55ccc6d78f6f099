"""Token authorization of TorchServe's gRPC management service, in process: the key the server
writes (the management REST API's) is required unless token authorization is off, with the
flag TorchServe users know (``--disable-token-auth``)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from runtime.cli import build_parser, settings_from_args
from runtime.frontends.grpc.generated import ts_management_pb2 as mpb
from runtime.frontends.grpc.generated import ts_management_pb2_grpc as mpb_grpc
from tests.servers import serving

pytestmark = pytest.mark.anyio


def test_disable_token_auth_is_torchserves_spelling(tmp_path: Path) -> None:
    parser = build_parser()
    assert settings_from_args(parser.parse_args(["start", str(tmp_path)])).management_token_auth
    off = settings_from_args(parser.parse_args(["start", str(tmp_path), "--disable-token-auth"]))
    assert not off.management_token_auth
    same = settings_from_args(parser.parse_args(["start", str(tmp_path), "--no-management-token-auth"]))
    assert not same.management_token_auth


async def test_the_management_key_guards_both_grpc_ports(tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    async with serving(grpc_management_port=0, management_key_file=str(key_file)) as server:
        assert server._grpc is not None and server._grpc.management_port is not None
        key = json.loads(key_file.read_text())["management"]["key"]
        for port in (server.grpc_port, server._grpc.management_port):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = mpb_grpc.ManagementAPIsServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.ListModels(mpb.ListModelsRequest(limit=5))
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                answer = await stub.ListModels(
                    mpb.ListModelsRequest(limit=5), metadata=[("authorization", f"Bearer {key}")]
                )
                assert json.loads(answer.msg) == {"models": []}
        await server.stop()  # no models: serving() leaves the stop to the test
    assert not key_file.exists()  # removed at stop, as TorchServe removes its key file


async def test_without_token_authorization_any_call_is_taken() -> None:
    async with serving(grpc_management_port=0, management_token_auth=False) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = mpb_grpc.ManagementAPIsServiceStub(channel)
            answer = await stub.ListModels(mpb.ListModelsRequest(limit=5))
            assert json.loads(answer.msg) == {"models": []}
        await server.stop()  # no models: serving() leaves the stop to the test
