"""The gRPC server's lifecycle: the ready line, TLS, and draining in-flight calls on SIGTERM."""

from __future__ import annotations

import datetime
import ipaddress
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from runtime.grpc.generated import dataplane_pb2 as pb
from runtime.grpc.generated import dataplane_pb2_grpc

from .grpc_support import GRPC_MODELS, inference_stub, raw_request, wait_for_log
from .servers import start_server


def self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def held_request(request_id: str, hold_ms: int) -> pb.ModelInferRequest:
    request = raw_request("mirror", request_id, x=np.ones(2, np.float32))
    request.parameters["hold_ms"].int64_param = hold_ms
    return request


def test_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = start_server(
        GRPC_MODELS, "--grpc-tls-certificate", str(cert), "--grpc-tls-private-key", str(key)
    )
    try:
        assert "grpc=127.0.0.1:" in "\n".join(server.log)
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(server.grpc_address, credentials) as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
        with inference_stub(server.grpc_address) as plain, pytest.raises(grpc.RpcError):
            plain.ServerLive(pb.ServerLiveRequest(), timeout=5)
    finally:
        assert server.stop() == 0


def test_settings_refuse_a_certificate_without_its_key(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "start", str(GRPC_MODELS), "--grpc-tls-certificate", str(cert)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "must be given together" in done.stderr


def test_sigterm_lets_in_flight_calls_finish_then_exits_0() -> None:
    """Race guarded: SIGTERM arrives while a unary call and a stream are inside the model."""
    server = start_server(GRPC_MODELS, "--shutdown-grace-period", "30")
    with inference_stub(server.grpc_address) as stub, ThreadPoolExecutor(2) as pool:
        unary = pool.submit(stub.ModelInfer, held_request("unary", 500))
        stream = pool.submit(lambda: list(stub.ModelStreamInfer(iter([held_request("streamed", 500)]))))
        wait_for_log(server, "mirror holds request unary")
        wait_for_log(server, "mirror holds request streamed")
        server.process.send_signal(signal.SIGTERM)
        assert unary.result(timeout=60).id == "unary"
        assert [r.id for r in stream.result(timeout=60)] == ["streamed"]
    assert server.stop() == 0
    assert "Server stopped" in "\n".join(server.log)


def test_calls_past_the_grace_period_are_cancelled() -> None:
    server = start_server(GRPC_MODELS, "--shutdown-grace-period", "0.2")
    with inference_stub(server.grpc_address) as stub, ThreadPoolExecutor(1) as pool:
        call = pool.submit(stub.ModelInfer, held_request("slow", 60_000))
        wait_for_log(server, "mirror holds request slow")
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=60)
        assert info.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert server.stop() == 0
