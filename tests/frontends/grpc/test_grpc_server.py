"""The gRPC server's lifecycle: the ready line, TLS, and draining in-flight calls on SIGTERM."""

from __future__ import annotations

import datetime
import ipaddress
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.grpc_support import GRPC_MODELS, inference_stub, raw_request, wait_for_log
from tests.servers import RunningServer, start_server


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
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def held_request(request_id: str, hold_ms: int) -> pb.ModelInferRequest:
    request = raw_request("mirror", request_id, x=np.ones(2, np.float32))
    request.parameters["hold_ms"].int64_param = hold_ms
    return request


@contextmanager
def running(*flags: str) -> Iterator[RunningServer]:
    """A server on tests/models/grpc that is stopped (killed if need be) whatever the test does."""
    server = start_server(GRPC_MODELS, *flags)
    try:
        yield server
    finally:
        server.stop()


def test_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with running("--grpc-tls-certificate", str(cert), "--grpc-tls-private-key", str(key)) as server:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(server.grpc_address, credentials) as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
        with inference_stub(server.grpc_address) as plain, pytest.raises(grpc.RpcError):
            plain.ServerLive(pb.ServerLiveRequest(), timeout=5)


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
    with running("--shutdown-grace-period", "30") as server:
        with inference_stub(server.grpc_address) as stub, ThreadPoolExecutor(2) as pool:
            unary = pool.submit(stub.ModelInfer, held_request("unary", 500))
            stream = pool.submit(lambda: list(stub.ModelStreamInfer(iter([held_request("streamed", 500)]))))
            wait_for_log(server, "mirror holds request unary")
            wait_for_log(server, "mirror holds request streamed")
            server.process.send_signal(signal.SIGTERM)
            assert unary.result(timeout=60).id == "unary"
            assert [r.id for r in stream.result(timeout=60)] == ["streamed"]
        assert server.process.wait(timeout=60) == 0
    assert "Server stopped" in "\n".join(server.log)


def test_calls_past_the_grace_period_are_cancelled() -> None:
    with running("--shutdown-grace-period", "0.2") as server:
        with inference_stub(server.grpc_address) as stub, ThreadPoolExecutor(1) as pool:
            call = pool.submit(stub.ModelInfer, held_request("slow", 60_000))
            wait_for_log(server, "mirror holds request slow")
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as info:
                call.result(timeout=60)
            assert info.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert server.process.wait(timeout=60) == 0


def test_a_stream_past_the_grace_period_gets_unavailable_saying_why_and_one_log_line() -> None:
    with running("--shutdown-grace-period", "0.2") as server:
        with inference_stub(server.grpc_address) as stub, ThreadPoolExecutor(1) as pool:
            stream = pool.submit(lambda: list(stub.ModelStreamInfer(iter([held_request("long", 60_000)]))))
            wait_for_log(server, "mirror holds request long")
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as info:
                stream.result(timeout=60)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in (info.value.details() or "")
            assert ("retry-after", "1") in tuple(info.value.trailing_metadata() or ())
        assert server.process.wait(timeout=60) == 0
    log = "\n".join(server.log)
    assert log.count("gRPC stream was still running when the grace period ended") == 1
    assert "Traceback" not in log


def test_health_watch_ends_when_the_server_drains() -> None:
    """An open Watch must not hold the shutdown for the whole grace period (30 s here).

    Race guarded: SIGTERM can land while the server is still finishing its write of SERVING,
    after the draining flag is set but before the statuses change; NOT_SERVING must still be sent.
    """
    with running("--shutdown-grace-period", "30") as server:
        with grpc.insecure_channel(server.grpc_address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            server.process.send_signal(signal.SIGTERM)
            assert [r.status for r in watch] == [health_pb2.HealthCheckResponse.NOT_SERVING]
            assert server.process.wait(timeout=20) == 0
