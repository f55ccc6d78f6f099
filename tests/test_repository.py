"""runtime.repository: finding model folders and importing their classes, and how each way of
getting it wrong is reported (the other models still load)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from runtime.repository import (
    RepositoryError,
    find_model_settings,
    import_model_class,
    settings_in_repository,
)
from runtime.settings import ModelSettings


def _model(root: Path, name: str, implementation: str, code: str | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model-settings.json").write_text(json.dumps({"name": name, "implementation": implementation}))
    if code is not None:
        (folder / "model.py").write_text(code)
    return folder / "model-settings.json"


def test_a_repository_that_is_not_a_folder_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "models.txt"
    file.write_text("")
    with pytest.raises(RepositoryError, match="is not a folder"):
        find_model_settings(file)
    with pytest.raises(RepositoryError, match="is not a folder"):
        find_model_settings(tmp_path / "missing")


def test_a_broken_settings_file_is_skipped_unless_its_model_is_asked_for(tmp_path: Path) -> None:
    _model(tmp_path, "good", "model.Good", "class Good:\n    pass\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model-settings.json").write_text("{not json")
    assert [s.name for s in settings_in_repository(tmp_path)] == ["good"]
    assert [s.name for s in settings_in_repository(tmp_path, "good")] == ["good"]
    assert settings_in_repository(tmp_path, "other") == []
    with pytest.raises(RepositoryError, match=r"cannot read .*bad.*model-settings\.json"):
        settings_in_repository(tmp_path, "bad")


@pytest.mark.parametrize(
    ("implementation", "code", "message"),
    [
        ("Model", None, "must be a dotted path: module.Class"),
        ("model.Missing", "class Present:\n    pass\n", "module 'model' has no class 'Missing'"),
        ("model.value", "value = 3\n", "'model.value' is not a class"),
    ],
)
def test_an_implementation_that_names_no_class_is_refused(
    tmp_path: Path, implementation: str, code: str | None, message: str
) -> None:
    settings = ModelSettings.from_file(_model(tmp_path, "m", implementation, code))
    with pytest.raises(RepositoryError, match=message):
        import_model_class(settings)


def test_a_model_module_that_fails_to_import_is_tried_afresh_next_time(tmp_path: Path) -> None:
    path = _model(tmp_path, "m", "model.M", "raise RuntimeError('weights missing')\n")
    settings = ModelSettings.from_file(path)
    modules_before = set(sys.modules)
    path_before = list(sys.path)
    with pytest.raises(RuntimeError, match="weights missing"):
        import_model_class(settings)
    assert set(sys.modules) == modules_before
    assert sys.path == path_before
    (path.parent / "model.py").write_text("class M:\n    pass\n")
    assert import_model_class(settings).__name__ == "M"


def test_a_model_module_imports_its_sibling_files(tmp_path: Path) -> None:
    path = _model(tmp_path, "m", "model.M", "from helper import SCALE\n\nclass M:\n    scale = SCALE\n")
    (path.parent / "helper.py").write_text("SCALE = 3\n")
    cls = import_model_class(ModelSettings.from_file(path))
    assert cls.scale == 3  # type: ignore[attr-defined]
    assert str(path.parent.resolve()) not in sys.path
    sys.modules.pop("helper", None)
