"""The model repository: finding model-settings.json files and importing model classes."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType

from runtime.settings import MODEL_ENV_PREFIX, MODEL_SETTINGS_FILENAME, ModelSettings

logger = logging.getLogger(__name__)


_SEPARATORS = frozenset("/\\\0")

IMPLEMENTATION_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "mlserver_sklearn.SKLearnModel": "runtime.sklearn.SKLearnModel",
        "mlserver_xgboost.XGBoostModel": "runtime.xgboost.XGBoostModel",
        "mlserver_lightgbm.LightGBMModel": "runtime.lightgbm.LightGBMModel",
        "mlserver_mlflow.MLflowRuntime": "runtime.mlflow.MLflowModel",
        "mlserver_huggingface.HuggingFaceRuntime": "runtime.huggingface.HuggingFaceModel",
    }
)
"""MLServer's runtime classes (as model-settings.json and ``MLSERVER_MODEL_IMPLEMENTATION`` name
them, KServe's ``kserve-mlserver`` runtime included) and the built-in runtime serving each here."""


class RepositoryError(Exception):
    """A model folder that cannot be read; the other models still load."""


def relative_paths(text: str, root: str | os.PathLike[str] | None) -> str:
    """``text`` with every path under the model repository ``root`` written relative to it.

    Error bodies go to clients, which have no business knowing where the repository lies on the
    server's disk (and do not need to: the repository's own layout names the file).
    """
    if root is None or not text:
        return text
    given = Path(root)
    prefixes = {str(given.absolute()), str(given.resolve())}
    if given.is_absolute():
        prefixes.add(str(given))
    for prefix in sorted(prefixes, key=len, reverse=True):
        if prefix in ("/", ""):
            continue
        text = text.replace(prefix + os.sep, "").replace(prefix, ".")
    return text


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
    from runtime.torchserve.archive import archive_settings, find_archives

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
    ``.module.Class`` (a leading dot) names a file of the model's folder only. Either way the file
    must lie inside the model's folder: a path that escapes it (``..evil.Model``) is refused.
    Anything else is imported normally. MLServer's runtime names (``mlserver_sklearn.SKLearnModel``,
    ``mlserver_huggingface.HuggingFaceRuntime``...) are the built-in runtimes' (:data:`IMPLEMENTATION_ALIASES`).
    """
    implementation = settings.implementation
    if isinstance(implementation, type):
        return implementation
    implementation = IMPLEMENTATION_ALIASES.get(implementation, implementation)
    module_name, _, class_name = implementation.rpartition(".")
    relative = module_name.startswith(".")
    module_name = module_name[1:] if relative else module_name
    if relative and module_name.startswith("."):
        raise RepositoryError(
            f"implementation {implementation!r} refers outside the model's folder: "
            "a leading dot names a file of the model's own folder, more dots are refused"
        )
    parts = module_name.split(".")
    if not class_name or not all(part and not _SEPARATORS.intersection(part) for part in parts):
        raise RepositoryError(
            f"implementation {implementation!r} must be a dotted path: module.Class "
            "(or .module.Class for a file of the model's folder)"
        )
    folder = settings.folder
    local = _local_file(folder, parts, implementation) if folder is not None else None
    if relative and local is None:
        where = f"in the model's folder {_shown(folder)}" if folder else "(the model has no folder)"
        raise RepositoryError(f"implementation {implementation!r}: no file {'/'.join(parts)}.py {where}")
    if local is not None:
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


def _local_file(folder: Path, parts: list[str], implementation: str) -> Path | None:
    """The model's own file named by ``parts`` (None if there is none); refuses one outside ``folder``."""
    path = folder.joinpath(*parts[:-1], parts[-1] + ".py")
    if not path.is_file():
        return None
    inside = folder.resolve()
    if not path.resolve().is_relative_to(inside):
        raise RepositoryError(
            f"implementation {implementation!r} resolves outside the model's folder {_shown(folder)}"
        )
    return path


def _shown(folder: Path | None) -> str:
    return repr(folder.name) if folder is not None else "''"


def forget_local_modules(folder: Path) -> None:
    """Forget the modules loaded from ``folder``'s files, so that the next load of its model reads
    them again (a model file changed in place)."""
    inside = folder.resolve()
    for name, module in list(sys.modules.items()):
        if not name.startswith("_mlserver_like_models.m"):
            continue
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(inside):
            del sys.modules[name]


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
