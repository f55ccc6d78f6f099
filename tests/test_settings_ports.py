"""``--torchserve`` (``torchserve: true``) moves only the port defaults to TorchServe's."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli import build_parser, settings_from_args
from runtime.settings import Settings


def test_torchserve_moves_the_port_defaults() -> None:
    plain = Settings()
    assert (plain.http_port, plain.grpc_port, plain.metrics_port, plain.grpc_management_port) == (
        8080,
        8081,
        8082,
        None,
    )
    ts = Settings(torchserve=True)
    assert (ts.http_port, ts.grpc_port, ts.metrics_port, ts.grpc_management_port) == (8080, 7070, 8082, 7071)
    assert (plain.management_port, ts.management_port) == (8083, 8081)


def test_explicit_ports_win(tmp_path: Path) -> None:
    args = build_parser().parse_args(["start", str(tmp_path), "--torchserve", "--grpc-port", "9000"])
    settings = settings_from_args(args)
    assert settings.torchserve and settings.grpc_port == 9000 and settings.grpc_management_port == 7071
    (tmp_path / "settings.json").write_text('{"torchserve": true, "grpc_management_port": 9001}')
    from_file = settings_from_args(build_parser().parse_args(["start", str(tmp_path)]))
    assert from_file.grpc_port == 7070 and from_file.grpc_management_port == 9001


def test_environment_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLSERVER_TORCHSERVE", "true")
    assert Settings().grpc_port == 7070
