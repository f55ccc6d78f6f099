"""``python -m runtime`` (``runtime/__main__.py``): the CLI's entry point, whose return value is the
process's exit status."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.version import __version__


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", ["python -m runtime", *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("runtime", run_name="__main__", alter_sys=False)
    code = exited.value.code
    assert isinstance(code, int)
    return code


def test_version_exits_zero(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--version"], monkeypatch) == 0
    assert capsys.readouterr().out.strip() == f"mlserver-like {__version__}"


def test_no_command_prints_the_help_and_exits_two(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run([], monkeypatch) == 2
    shown = capsys.readouterr().out
    assert "start" in shown and "infer" in shown


def test_a_missing_model_folder_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["start", str(tmp_path / "absent")], monkeypatch) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_module_runs_as_a_program() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "runtime", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0 and shown.stdout.strip() == f"mlserver-like {__version__}"
