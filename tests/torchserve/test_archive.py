"""Archives that cannot be served are refused with a reason, and the others still load."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from runtime.repository import read_repository
from runtime.torchserve.archive import ArchiveError, archive_settings, find_archives


def manifest(handler: str = "h.py", **model: str) -> str:
    return json.dumps({"runtime": "python", "model": {"modelName": "m", "handler": handler, **model}})


def test_broken_archives_are_reported_and_others_load(tmp_path: Path) -> None:
    good = tmp_path / "good"
    (good / "MAR-INF").mkdir(parents=True)
    (good / "MAR-INF" / "MANIFEST.json").write_text(manifest(modelName="good"))
    (tmp_path / "not-a-zip.mar").write_bytes(b"nope")
    with zipfile.ZipFile(tmp_path / "escape.mar", "w") as zf:
        zf.writestr("../evil.py", "x = 1")
        zf.writestr("MAR-INF/MANIFEST.json", manifest())
    with zipfile.ZipFile(tmp_path / "nohandler.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", manifest(handler=""))
    with zipfile.ZipFile(tmp_path / "badyaml.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", manifest(configFile="c.yaml"))
        zf.writestr("c.yaml", "batchSize: many\n")
    found, broken = read_repository(tmp_path)
    assert [s.name for s in found] == ["good"]
    reasons = {path.name: reason for path, reason in broken}
    assert "neither a zip nor a tar" in reasons["not-a-zip.mar"]
    assert "outside itself" in reasons["escape.mar"]
    assert "names no handler" in reasons["nohandler.mar"]
    assert "batchSize must be an integer" in reasons["badyaml.mar"]
    assert not (tmp_path.parent / "evil.py").exists()


def test_a_folder_with_model_settings_is_not_an_archive(tmp_path: Path) -> None:
    (tmp_path / "MAR-INF").mkdir()
    (tmp_path / "MAR-INF" / "MANIFEST.json").write_text(manifest())
    (tmp_path / "model-settings.json").write_text("{}")
    assert find_archives(tmp_path) == []
    with pytest.raises(ArchiveError):
        archive_settings(tmp_path / "missing-dir")
