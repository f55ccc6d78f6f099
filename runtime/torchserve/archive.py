"""TorchServe model archives as models of this server: a ``.mar`` (zip or tgz) or its unpacked folder.

An archive holds ``MAR-INF/MANIFEST.json`` (the handler, the serialized file, ...), the handler's
files, and optionally a ``model-config.yaml`` (the manifest's ``configFile``). No
model-settings.json is needed: the yaml's keys map onto this server's model settings::

    batchSize               max_batch_size (adaptive batching when > 1)
    maxBatchDelay (ms)      max_batch_time (seconds)
    jobQueueSize            max_queue_size
    sequenceBatching        sequence_batching (with sequenceMaxIdleMSec > 0, as in TorchServe)
    continuousBatching      continuous_batching
    sequenceMaxIdleMSec     max_sequence_idle_ms
    sequenceTimeoutMSec     sequence_timeout_ms
    maxNumSequence          max_sequences (default max(batchSize x maxWorkers, 1), as documented)
    maxSequenceJobQueueSize max_sequence_queue_size
    responseTimeout (s)     request_timeout (seconds; streams are not limited by it)
    minWorkers              workers: worker processes, each with its own handler (0: the server's)
    maxWorkers, startupTimeout, ... kept as they are in ``parameters.extra["torchserve"]``

Other sections (e.g. ``handler:``) reach only the handler, through ``ctx.model_yaml_config``.
A ``.mar`` file is unpacked once into a cache folder next to it (``.mar-unpacked/<name>``, or a
temporary folder when the model folder is read-only), refreshed when the archive changes. Nothing here imports torch or the ``ts`` package.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from runtime.settings import MODEL_SETTINGS_FILENAME, ModelParameters, ModelSettings
from runtime.torchserve import PLATFORM

MANIFEST = Path("MAR-INF") / "MANIFEST.json"
UNPACKED = ".mar-unpacked"
ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".tgz")
IMPLEMENTATIONS = {
    "plain": "runtime.torchserve.handler_model.HandlerModel",
    "sequence": "runtime.torchserve.handler_model.HandlerSequenceModel",
    "continuous": "runtime.torchserve.handler_model.HandlerContinuousModel",
}


class ArchiveError(Exception):
    """An archive that cannot be read; the other models still load."""


def find_archives(root: Path) -> list[Path]:
    """Every ``.mar`` (or ``.tar.gz``/``.tgz``, the archiver's tgz format) file and every unpacked archive folder (``MAR-INF/MANIFEST.json`` without a
    model-settings.json beside it) under ``root``, in a stable order."""
    found: list[Path] = []
    for path in sorted(root.rglob("*")):
        if UNPACKED in path.parts:
            continue
        if path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES):
            found.append(path)
        elif path.is_dir() and (path / MANIFEST).is_file() and not (path / MODEL_SETTINGS_FILENAME).is_file():
            found.append(path)
    return found


def is_archive(path: Path) -> bool:
    """Whether ``path`` is a TorchServe archive rather than a folder (or a packed folder) of this
    server's models: a ``.mar``, a folder holding ``MAR-INF/MANIFEST.json`` and no
    model-settings.json, or a ``.tar.gz``/``.tgz`` (the archiver's tgz format) holding them so."""
    if path.is_dir():
        return (path / MANIFEST).is_file() and not (path / MODEL_SETTINGS_FILENAME).is_file()
    name = path.name.lower()
    if name.endswith(".mar"):
        return True
    if not name.endswith((".tar.gz", ".tgz")):
        return False
    import tarfile  # not at start-up: a folder rarely holds a tgz

    if not tarfile.is_tarfile(path):
        return False
    with tarfile.open(path) as tf:
        members = [Path(m) for m in tf.getnames()]
    has = {m.parts[-2:] for m in members if len(m.parts) >= 2}
    return MANIFEST.parts in has and not any(m.name == MODEL_SETTINGS_FILENAME for m in members)


def unpack(archive: Path) -> Path:
    """The folder holding the archive's files: the folder itself, or a fresh unpacking of a .mar."""
    if archive.is_dir():
        return archive
    if not archive.is_file():
        raise ArchiveError(f"{archive} does not exist")
    digest = hashlib.sha1(f"{archive.resolve()}:{archive.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    for cache in (archive.parent / UNPACKED, Path(tempfile.gettempdir()) / "mlserver-like-mar"):
        target = cache / f"{archive.stem}-{digest}"
        if (target / MANIFEST).is_file():
            return target
        try:  # next to the archive, or in a temporary folder when the model folder is read-only
            for old in cache.glob(f"{archive.stem}-*"):
                shutil.rmtree(old, ignore_errors=True)
            cache.mkdir(parents=True, exist_ok=True)
            # a staging folder of this process's own: two servers unpacking the same archive do not collide
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
        except OSError:
            continue
        return _extract(archive, staging, target)
    raise ArchiveError(f"nowhere to unpack {archive}")


def _extract(archive: Path, staging: Path, target: Path) -> Path:
    import tarfile

    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                _check_members(zf.namelist(), archive)
                zf.extractall(staging)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                tf.extractall(staging, filter="data")
        else:
            raise ArchiveError(f"{archive} is neither a zip nor a tar archive")
        root = _archive_root(staging)
        if root is None:
            raise ArchiveError(f"{archive} has no {MANIFEST.as_posix()}")
        if root != staging:  # a tgz of the model's folder: move its contents up
            for item in root.iterdir():
                item.rename(staging / item.name)
        try:
            staging.rename(target)
        except OSError:  # another process unpacked the same archive first: use its folder
            if not (target / MANIFEST).is_file():
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _check_members(names: list[str], archive: Path) -> None:
    for name in names:
        if name.startswith("/") or ".." in Path(name).parts:
            raise ArchiveError(f"{archive} holds a path outside itself: {name!r}")


def _archive_root(folder: Path) -> Path | None:
    if (folder / MANIFEST).is_file():
        return folder
    subfolders = [p for p in folder.iterdir() if p.is_dir()]
    if len(subfolders) == 1 and (subfolders[0] / MANIFEST).is_file():
        return subfolders[0]
    return None


def read_manifest(model_dir: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((model_dir / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"cannot read {model_dir / MANIFEST}: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("model"), dict):
        raise ArchiveError(f"{model_dir / MANIFEST} has no 'model' section")
    if not manifest["model"].get("handler"):
        raise ArchiveError(f"{model_dir / MANIFEST} names no handler")
    return manifest


def read_model_config(model_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The archive's model-config.yaml (the manifest's ``configFile``), or {} without one."""
    config_file = manifest["model"].get("configFile")
    if not config_file:
        return {}
    import yaml

    try:
        config = yaml.safe_load((model_dir / config_file).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ArchiveError(f"cannot read {model_dir / config_file}: {exc}") from exc
    if not isinstance(config, dict):
        raise ArchiveError(f"{model_dir / config_file} must hold a mapping")
    return config


def _int(config: dict[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArchiveError(f"model-config.yaml: {key} must be an integer, got {value!r}")
    return value


def kept(settings: ModelSettings) -> dict[str, Any]:
    """What the settings of an archive's model keep of the archive (``manifest``, ``config``, the
    ``archive``'s path); empty for any other model."""
    extra = settings.parameters.extra if settings.parameters else None
    found = extra.get(PLATFORM) if isinstance(extra, dict) else None
    return found if isinstance(found, dict) else {}


def archive_settings(archive: Path) -> ModelSettings:
    """The model settings of an archive (unpacked if it is a .mar), from its manifest and yaml."""
    model_dir = unpack(archive)
    manifest = read_manifest(model_dir)
    config = read_model_config(model_dir, manifest)
    model = manifest["model"]
    name = str(model.get("modelName") or archive.stem)
    version = model.get("modelVersion")
    batch_size = max(_int(config, "batchSize", 1), 1)
    max_workers = max(_int(config, "maxWorkers", _int(config, "minWorkers", 1)), 1)
    idle_ms = _int(config, "sequenceMaxIdleMSec", 0)
    sequences = bool(config.get("sequenceBatching", False)) and idle_ms > 0
    continuous = bool(config.get("continuousBatching", False))
    kind = "continuous" if continuous else "sequence" if sequences else "plain"
    fields: dict[str, Any] = {
        "name": name,
        "implementation": IMPLEMENTATIONS[kind],
        "platform": PLATFORM,
        "max_batch_size": batch_size,
        "max_batch_time": _int(config, "maxBatchDelay", 100) / 1000.0 if batch_size > 1 else 0.0,
        "continuous_batching": continuous,
        "sequence_batching": sequences,
        "parameters": ModelParameters(
            uri=str(model_dir),
            version=str(version) if version is not None else None,
            extra={PLATFORM: {"manifest": manifest, "config": config, "archive": str(archive)}},
        ),
    }
    if "minWorkers" in config:  # TorchServe's worker processes: as many of this server's
        fields["workers"] = max(_int(config, "minWorkers", 1), 0)
    if "responseTimeout" in config:  # seconds an answer may take (TorchServe: then the request fails)
        fields["request_timeout"] = max(_int(config, "responseTimeout", 120), 0)
    if "jobQueueSize" in config:
        fields["max_queue_size"] = max(_int(config, "jobQueueSize", 1), 1)
    if sequences:
        fields["max_sequence_idle_ms"] = idle_ms
        fields["sequence_timeout_ms"] = _int(config, "sequenceTimeoutMSec", 0)
        fields["max_sequences"] = max(_int(config, "maxNumSequence", batch_size * max_workers), 1)
        fields["max_sequence_queue_size"] = _int(config, "maxSequenceJobQueueSize", 1)
    try:
        settings = ModelSettings(**fields)
    except ValueError as exc:
        raise ArchiveError(f"{archive}: {exc}") from exc
    settings._source = model_dir / MODEL_SETTINGS_FILENAME  # its folder is the model's folder
    return settings
