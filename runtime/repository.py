"""The model repository: finding model-settings.json files and importing model classes."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

from .settings import MODEL_ENV_PREFIX, MODEL_SETTINGS_FILENAME, ModelSettings

logger = logging.getLogger(__name__)


class RepositoryError(Exception):
    """A model folder that cannot be read; the other models still load."""


def find_model_settings(root: str | os.PathLike[str]) -> list[Path]:
    """Every model-settings.json under ``root``, recursively, in a stable order."""
    root = Path(root)
    if not root.is_dir():
        raise RepositoryError(f"model repository {str(root)!r} is not a folder")
    return sorted(p for p in root.rglob(MODEL_SETTINGS_FILENAME) if p.is_file())


def read_repository(root: str | os.PathLike[str]) -> tuple[list[ModelSettings], list[tuple[Path, str]]]:
    """The settings of every model under ``root``, and the files that could not be read (with why).

    TorchServe archives (``.mar`` files and unpacked archive folders) are models too
    (:mod:`runtime.torchserve.archive`). With no model-settings.json and no archive at all, a
    single model described by ``MLSERVER_MODEL_*`` environment variables is served, as MLServer does.
    """
    from .torchserve.archive import archive_settings, find_archives

    found: list[ModelSettings] = []
    broken: list[tuple[Path, str]] = []
    for path in find_model_settings(root):
        try:
            found.append(ModelSettings.from_file(path))
        except Exception as exc:
            broken.append((path, str(exc)))
    for path in find_archives(Path(root)):
        try:
            found.append(archive_settings(path))
        except Exception as exc:
            broken.append((path, str(exc)))
    if not found and not broken and f"{MODEL_ENV_PREFIX}IMPLEMENTATION" in os.environ:
        try:
            found.append(ModelSettings.from_environment())
        except Exception as exc:
            broken.append((Path(f"{MODEL_ENV_PREFIX}* variables"), str(exc)))
    return found, broken


def settings_in_repository(root: str | os.PathLike[str], name: str | None = None) -> list[ModelSettings]:
    """The settings of the models under ``root`` (only those named ``name`` if given), read afresh.

    A model-settings.json that cannot be read is skipped, unless its folder bears ``name``: then
    the reason is raised, since it is most likely the file asked for.
    """
    found, broken = read_repository(root)
    if name is None:
        return found
    named = [s for s in found if s.name == name]
    if not named:
        for path, reason in broken:
            if path.parent.name == name:
                raise RepositoryError(f"cannot read {path}: {reason}")
    return named


def import_model_class(settings: ModelSettings) -> type:
    """The class named by ``settings.implementation``.

    ``module.Class`` whose module is a .py file in the model's folder is loaded from that file,
    under a name unique to the folder, so that two models may both keep their code in model.py.
    Anything else is imported normally.
    """
    implementation = settings.implementation
    if isinstance(implementation, type):
        return implementation
    module_name, _, class_name = implementation.rpartition(".")
    if not module_name:
        raise RepositoryError(f"implementation {implementation!r} must be a dotted path: module.Class")
    folder = settings.folder
    local = folder / (module_name.replace(".", "/") + ".py") if folder else None
    if local is not None and local.is_file():
        assert folder is not None
        module = _load_local(local, module_name, folder)
    else:
        module = importlib.import_module(module_name)
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise RepositoryError(f"module {module_name!r} has no class {class_name!r}") from None
    if not isinstance(cls, type):
        raise RepositoryError(f"{implementation!r} is not a class")
    return cls


def _load_local(path: Path, module_name: str, folder: Path) -> ModuleType:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    unique = f"_mlserver_like_models.m{digest}.{module_name}"
    if unique in sys.modules:
        return sys.modules[unique]
    spec = importlib.util.spec_from_file_location(unique, path)
    if spec is None or spec.loader is None:
        raise RepositoryError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    # let the model's code import its sibling files
    added = str(folder.resolve())
    sys.path.insert(0, added)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[unique]
        raise
    finally:
        try:
            sys.path.remove(added)
        except ValueError:
            pass
    return module
