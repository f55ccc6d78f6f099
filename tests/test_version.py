"""The package's version (``runtime.version``): one value, the one the installed package, the CLI
and the server's metadata report."""

from __future__ import annotations

import re
from importlib import metadata

import pytest

from runtime.cli import build_parser
from runtime.core.dataplane import DataPlane
from runtime.core.registry import Registry
from runtime.settings import Settings
from runtime.version import __version__


def test_the_version_is_a_release_number() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", __version__)


def test_the_installed_package_has_this_version() -> None:
    assert metadata.version("mlserver-like") == __version__


def test_the_cli_and_the_server_metadata_report_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"mlserver-like {__version__}"
    assert DataPlane(Settings(), Registry()).metadata().version == __version__
