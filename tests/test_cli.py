"""The command line (``runtime.cli``): flags derived from ``Settings``, and how they meet the
settings file (no server is started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.cli import build_parser, main, settings_from_args


def test_flags_follow_the_settings_fields_types(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "start",
            str(tmp_path),
            "--no-strict-readiness",
            "--grpc-stream-format",
            "triton",
            "--drain-delay",
            "1.5",
        ]
    )
    assert (args.strict_readiness, args.grpc_stream_format, args.drain_delay) == (False, "triton", 1.5)
    assert args.http_port is None  # unset flags leave the field to the file, variables and defaults
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", str(tmp_path), "--grpc-stream-format", "other"])
    with pytest.raises(SystemExit):  # set in settings.json only
        build_parser().parse_args(["start", str(tmp_path), "--extensions", "x"])


def test_a_flag_wins_over_the_settings_file_and_the_folder_is_the_repository(tmp_path: Path) -> None:
    (tmp_path / "settings.json").write_text(json.dumps({"server_name": "file", "http_port": 9000}))
    settings = settings_from_args(build_parser().parse_args(["start", str(tmp_path), "--http-port", "9100"]))
    assert (settings.server_name, settings.http_port) == ("file", 9100)
    assert settings.model_repository_root == str(tmp_path)


def test_another_settings_file_is_read_when_named_and_must_exist(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"server_name": "other"}))
    args = build_parser().parse_args(["start", str(tmp_path), "--settings", str(other)])
    assert settings_from_args(args).server_name == "other"
    missing = build_parser().parse_args(["start", str(tmp_path), "--settings", str(tmp_path / "none.json")])
    with pytest.raises(SystemExit, match=r"settings file .* not found"):
        settings_from_args(missing)


def test_torchserves_spelling_turns_token_auth_off(tmp_path: Path) -> None:
    args = build_parser().parse_args(["start", str(tmp_path), "--disable-token-auth"])
    assert settings_from_args(args).management_token_auth is False


def test_main_without_a_command_or_with_a_missing_folder_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([]) == 2
    with pytest.raises(SystemExit) as exited:
        main(["start", str(tmp_path / "missing")])
    assert exited.value.code == 2 and "does not exist" in capsys.readouterr().err
    (tmp_path / "settings.json").write_text("[]")
    with pytest.raises(SystemExit) as exited:
        main(["start", str(tmp_path)])
    assert exited.value.code == 2 and "must hold a JSON object" in capsys.readouterr().err


def test_a_memory_limit_flag_takes_a_unit_and_refuses_what_is_not_a_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for text, expected in (("150MiB", 150 * 1024**2), ("4GiB", 4 * 1024**3), ("1000", 1000)):
        args = build_parser().parse_args(["start", str(tmp_path), "--models-memory-limit", text])
        assert settings_from_args(args).models_memory_limit == expected
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", str(tmp_path), "--models-memory-limit", "15x"])
    assert "invalid size value: '15x'" in capsys.readouterr().err
