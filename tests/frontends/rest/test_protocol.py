"""HTTP connections have nginx's limits: a keep-alive idle timeout, a header deadline (silent
connections and slowloris) and a header size limit; raw sockets play the misbehaving clients."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from runtime.settings import Settings
from tests.conftest import TEST_MODELS
from tests.servers import RunningServer, start_server

LIMIT = 8192


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(
        TEST_MODELS / "repo" / "typed",
        "--http-header-timeout",
        "1",
        "--http-keepalive-timeout",
        "1",
        "--http-max-header-size",
        str(LIMIT),
    )
    yield running
    running.stop()


def _connect(server: RunningServer) -> socket.socket:
    host, port = server.http_address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket times out at 30 s)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _request(extra_headers: str = "") -> bytes:
    return f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{extra_headers}\r\n".encode()


def _status_and_body(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_a_keep_alive_request_after_a_quick_one_has_its_own_header_deadline(server: RunningServer) -> None:
    """The connection's one header timer, armed for the first request, waits for the second
    request's deadline (counted from its first byte) rather than firing at the first one's."""
    with _connect(server) as sock:
        sock.sendall(_request())
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        time.sleep(0.6)  # past half of the first request's deadline (1 s from the connection's start)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        started = time.monotonic()
        sock.sendall(b"X-Slow: 1\r\n")
        time.sleep(0.6)  # the first deadline passes: the second request's header is still in time
        sock.sendall(b"Host: x\r\n\r\n")
        second = sock.recv(65536)
        assert second.startswith(b"HTTP/1.1 200"), second
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # a third one trickles in: 408
        try:
            for _ in range(100):
                sock.sendall(b"X-Slow: 1\r\n")
                time.sleep(0.2)
        except OSError:
            pass
        status, body = _status_and_body(_read_until_closed(sock))
        assert status == 408 and "within 1 s" in json.loads(body)["error"]
        assert time.monotonic() - started < 20


def test_a_silent_connection_is_closed(server: RunningServer) -> None:
    with _connect(server) as sock:
        started = time.monotonic()
        assert _read_until_closed(sock) == b""
        assert time.monotonic() - started < 20


def test_a_header_that_trickles_in_gets_408(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        started = time.monotonic()
        try:
            for _ in range(100):  # slowloris: a header line every 0.2 s, never the end
                sock.sendall(b"X-Slow: 1\r\n")
                time.sleep(0.2)
        except OSError:
            pass  # the server closed the connection
        status, body = _status_and_body(_read_until_closed(sock))
        assert status == 408 and "within 1 s" in json.loads(body)["error"]
        assert time.monotonic() - started < 20


def test_an_idle_keep_alive_connection_is_closed(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(_request())
        raw = _read_until_closed(sock)  # answered, then closed after the idle timeout
        assert raw.startswith(b"HTTP/1.1 200")


def test_a_header_over_the_limit_gets_431(server: RunningServer) -> None:
    # the client is still sending when the answer comes: the server reads and drops the rest
    # (a lingering close), so the client reads the 431 rather than a reset, every time
    for size in [LIMIT * 8] + [1 << 21] * 5:
        with _connect(server) as sock:
            sock.sendall(_request(f"X-Big: {'a' * size}\r\n"))
            status, body = _status_and_body(_read_until_closed(sock))
            assert status == 431 and str(LIMIT) in json.loads(body)["error"]
    # a header within the limit, with a body after it in the same write, is served
    text = json.dumps({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    padding = "b" * (LIMIT // 2)
    response = httpx.post(
        f"{server.http_url}/v2/models/typed/infer",
        content=text + " " * (LIMIT * 4),
        headers={"X-Padding": padding},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert httpx.get(f"{server.http_url}/v2/health/ready", timeout=30).status_code == 200


def test_the_limits_default_to_nginx_values() -> None:
    settings = Settings()
    assert settings.http_keepalive_timeout == 75
    assert settings.http_header_timeout == 60
    assert settings.http_max_header_size == 32 * 1024
