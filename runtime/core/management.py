"""Management operations, transport-free: list, describe, register, scale, set-default, unregister.

Both management front ends, TorchServe's REST shape (``api.py``) and TorchServe's gRPC management
service (``runtime.frontends.torchserve.management_grpc``), translate their calls to these and their errors
(the tree in ``runtime.errors``) through TorchServe's one error table. Registration reads a model
from a local folder (its model-settings.json) or an archive of one (.tar.gz, .tgz, .tar, .zip), or
from a TorchServe archive (a ``.mar``, its unpacked folder, or the archiver's tgz) as the model
repository reads those at start; only from where ``allowed_urls`` allows (by default: inside the
model repository).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.core.model_table import ModelEntry
from runtime.core.registry import Registry
from runtime.errors import Conflict, Forbidden, InvalidInput, ModelFailed, ModelNotFound
from runtime.repository import find_model_settings
from runtime.settings import MODEL_SETTINGS_FILENAME, ModelSettings, Settings
from runtime.types import State

if TYPE_CHECKING:
    from runtime.scheduling.worker_executor import WorkerExecutor

logger = logging.getLogger(__name__)

ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip", ".mar")
PAGE_LIMIT = 100
TORCHSERVE_KEYS = (
    "responseTimeout",
    "startupTimeout",
    "maxRetryTimeoutInSec",
    "clientTimeoutInMills",
    "deviceType",
)
"""model-config.yaml keys a TorchServe archive's model is described with as they were given (this
server keeps them but does not act on them)."""


@dataclass
class Registered:
    """What ``register`` did: the model's name and version, its workers, and whether it is loaded yet."""

    name: str
    version: str | None
    workers: int
    loaded: bool

    def status(self) -> str:
        """TorchServe's sentence for it."""
        version = self.version or "None"
        if not self.loaded:
            return f'Model "{self.name}" Version: {version} registration started'
        where = f"{self.workers} initial workers" if self.workers else "in the server process (0 workers)"
        return f'Model "{self.name}" Version: {version} registered with {where}'


# TorchServe's sentences for what the other operations did (both management front ends answer them)


def scaled(name: str, version: str | None, count: int, synchronous: bool) -> str:
    if not synchronous:
        return "Processing worker updates..."
    which = f", version: {version}" if version else ""
    return f"Workers scaled to {count} for model: {name}{which}"


def default_set(name: str, version: str) -> str:
    return f'Default version successfully updated for model "{name}" to "{version}"'


def unregistered(name: str, version: str | None) -> str:
    which = f" version {version}" if version else ""
    return f'Model "{name}"{which} unregistered'


def executor_of(entry: ModelEntry) -> WorkerExecutor | None:
    """The worker executor serving ``entry``, if it runs in worker processes."""
    return entry.workers


class Management:
    """The operations of the management API on one server's registry."""

    def __init__(self, settings: Settings, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry
        self.started = datetime.now(timezone.utc)
        self._store: Path | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ reading

    def list_models(self, limit: int = PAGE_LIMIT, next_page_token: int = 0) -> dict[str, Any]:
        """One page of the models, by name: ``{"models": [...], "nextPageToken": ...}`` (at most
        100 a page; a limit of 0 gives an empty page, as TorchServe)."""
        if limit < 0 or next_page_token < 0:
            raise InvalidInput("limit and next_page_token must not be negative")
        limit = min(limit, PAGE_LIMIT)
        names = sorted({entry.name for entry in self.registry.entries()})
        page = names[next_page_token : next_page_token + limit]
        models = [{"modelName": name, "modelUrl": self._url(self.registry.find(name))} for name in page]
        answer: dict[str, Any] = {"models": models}
        if page and next_page_token + limit < len(names):
            answer["nextPageToken"] = str(next_page_token + limit)
        return answer

    def describe(self, name: str, version: str | None = None, every: bool = False) -> list[dict[str, Any]]:
        """The model (its default version, ``version``, or ``every`` version), TorchServe's fields."""
        if every:
            self.registry.find(name)
            entries = [e for e in self.registry.entries() if e.name == name]
        else:
            entries = [self.registry.find(name, version)]
        default = self.registry.default_version(name)
        return [self._describe(entry, entry.version == default) for entry in entries]

    def _describe(self, entry: ModelEntry, is_default: bool) -> dict[str, Any]:
        s = entry.settings
        executor = executor_of(entry)
        workers = executor.describe() if executor is not None else self._in_process(entry)
        count = len([w for w in workers if w["status"] != "STOPPED"]) if executor is not None else 0
        scheduler = entry.scheduler.describe() if entry.scheduler is not None else {}
        from runtime.torchserve.archive import kept  # not at start-up: archives may never be described

        config = kept(entry.settings).get("config") or {}
        return {
            "modelName": entry.name,
            "modelVersion": entry.version,
            "modelUrl": self._url(entry),
            "runtime": "python",
            "implementation": s.implementation
            if isinstance(s.implementation, str)
            else s.implementation.__qualname__,
            "state": entry.state.value,
            **({"reason": entry.reason} if entry.reason else {}),
            "isDefault": is_default,
            "minWorkers": count,
            "maxWorkers": count,
            "parallelType": "workers" if executor is not None else "in_process",
            "batchSize": s.max_batch_size,
            "maxBatchDelay": int(s.max_batch_time * 1000),
            "continuousBatching": s.continuous_batching,
            "stateful": s.sequence_batching,
            "sequenceMaxIdleMSec": s.max_sequence_idle_ms,
            "sequenceTimeoutMSec": s.sequence_timeout_ms,
            "maxNumSequence": s.max_sequences,
            "maxSequenceJobQueueSize": s.max_sequence_queue_size,
            **{key: config[key] for key in TORCHSERVE_KEYS if key in config},
            "scheduler": scheduler,
            "workers": workers,
            "jobQueueStatus": {
                "pendingRequests": sum(int(w.get("busy", 0)) for w in workers),
                "remainingCapacity": s.max_queue_size,
            },
        }

    def _in_process(self, entry: ModelEntry) -> list[dict[str, Any]]:
        """The server process itself, as the one "worker" of an in-process model."""
        status = "READY" if entry.ready else entry.state.value
        memory: int | None
        try:
            with open("/proc/self/statm") as statm:
                memory = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            memory = None
        return [
            {
                "id": "0",
                "pid": os.getpid(),
                "status": status,
                "memoryUsage": memory,
                "startTime": self.started.isoformat(),
            }
        ]

    @staticmethod
    def _url(entry: ModelEntry) -> str:
        """A TorchServe archive's file name (as TorchServe lists ``squeezenet1_1.mar``), else the
        model's folder."""
        from runtime.torchserve.archive import kept

        archive = kept(entry.settings).get("archive")
        if archive:
            return Path(archive).name
        folder = entry.settings.folder
        return str(folder) if folder is not None else ""

    # ------------------------------------------------------------------ changing

    async def register(
        self,
        url: str,
        name: str | None = None,
        workers: int | None = None,
        synchronous: bool = False,
    ) -> Registered:
        """Register the model at ``url`` (a folder or an archive); with ``synchronous``, return once
        it has loaded (raise if it could not)."""
        if not url:
            raise InvalidInput("Parameter url is required.")
        if workers is not None and workers < 0:
            raise InvalidInput("initial_workers must not be negative")
        settings = await asyncio.to_thread(self._settings_at, url)
        updates: dict[str, Any] = {}
        if name:
            updates["name"] = name
        if workers is not None:
            updates["workers"] = workers
        if updates:
            source = settings._source
            settings = settings.model_copy(update=updates)
            settings._source = source
        try:
            existing = self.registry.find(settings.name, settings.version)
        except ModelNotFound:
            existing = None
        if existing is not None and (existing.version == settings.version):
            raise Conflict(f"Model version {settings.version} for model {settings.name} already registered.")
        count = self.registry.workers_for(settings)
        registered = Registered(settings.name, settings.version, count, synchronous)
        if synchronous:
            entry = await self.registry.load(settings)
            if entry.state is State.UNAVAILABLE:
                await self._forget_failed(entry)
                raise ModelFailed(f"Model {settings.name!r} could not be loaded: {entry.reason}")
            return registered
        self._in_background(self.registry.load(settings), f"Registering model {settings.name!r}")
        return registered

    async def _forget_failed(self, entry: ModelEntry) -> None:
        try:
            current = self.registry.find(entry.name, entry.version)
        except ModelNotFound:
            return
        if current is entry:
            await self.registry.unload(entry.name, entry.version or None)

    def _settings_at(self, url: str) -> ModelSettings:
        """The settings of the model at ``url``, after checking it is allowed: a TorchServe archive's
        from its manifest and model-config.yaml, else a folder's (an archive of one is extracted
        into a private folder) from its model-settings.json."""
        from runtime.torchserve.archive import ArchiveError, archive_settings, is_archive

        path = self._local(url)
        try:
            if is_archive(path):
                return archive_settings(path)
        except (ArchiveError, OSError) as exc:
            raise InvalidInput(f"cannot read {path.name}: {exc}") from exc
        if path.is_dir():
            return _read_settings(path)
        if not path.name.lower().endswith(ARCHIVES):
            raise InvalidInput(f"{url!r} is neither a folder nor an archive ({', '.join(ARCHIVES)})")
        return _read_settings(self._extract(path))

    def _local(self, url: str) -> Path:
        """The local path ``url`` names, once it is known to be allowed and to exist."""
        if re.match(r"^[a-z][a-z0-9+.-]*://", url, re.IGNORECASE) and not url.lower().startswith("file://"):
            raise InvalidInput(f"Only local folders and archives can be registered, not {url!r}")
        path_text = url[len("file://") :] if url.lower().startswith("file://") else url
        if ".." in Path(path_text).parts:
            raise Forbidden(f"Given URL {url} does not match any allowed URL(s)")
        path = Path(path_text)
        if not path.is_absolute():
            path = Path(self.settings.model_repository_root) / path
        path = path.resolve()
        if not self._allowed(url, path):
            raise Forbidden(f"Given URL {url} does not match any allowed URL(s)")
        if not path.exists():
            raise ModelNotFound(url)
        return path

    def _allowed(self, url: str, path: Path) -> bool:
        if self.settings.allowed_urls:
            return any(re.fullmatch(p, url, re.IGNORECASE) for p in self.settings.allowed_urls)
        root = Path(self.settings.model_repository_root).resolve()
        return path == root or root in path.parents

    def _extract(self, archive: Path) -> Path:
        import tarfile  # imported by the first archive registered, not at start-up
        import zipfile

        if self._store is None:
            self._store = Path(tempfile.mkdtemp(prefix="mlserver-like-models-"))
        target = Path(tempfile.mkdtemp(dir=self._store, prefix=archive.name.split(".")[0] + "-"))
        try:
            if archive.name.lower().endswith((".zip", ".mar")):
                with zipfile.ZipFile(archive) as zf:
                    for member in zf.namelist():
                        dest = (target / member).resolve()
                        if target.resolve() not in dest.parents and dest != target.resolve():
                            raise InvalidInput(f"archive member {member!r} lies outside the archive")
                    zf.extractall(target)
            else:
                with tarfile.open(archive) as tf:
                    tf.extractall(target, filter="data")
        except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
            raise InvalidInput(f"cannot extract {archive.name}: {exc}") from exc
        return target

    async def scale(
        self, name: str, version: str | None, min_worker: int, max_worker: int | None, synchronous: bool
    ) -> int:
        """Run ``min_worker`` workers for the model (0: in the server process)."""
        if min_worker < 0:
            raise InvalidInput("min_worker must not be negative")
        if max_worker is not None and max_worker < min_worker:
            raise InvalidInput("max_worker cannot be less than min_worker")
        entry = self.registry.find(name, version)
        job = self.registry.scale(entry, min_worker)
        if synchronous:
            await job
        else:
            self._in_background(job, f"Scaling model {entry.name!r} to {min_worker} worker(s)")
        return min_worker

    def set_default(self, name: str, version: str) -> None:
        self.registry.set_default(name, version)

    async def unregister(self, name: str, version: str | None = None) -> None:
        """Unload the model (or one version of it); its workers drain first."""
        if version:
            entry = self.registry.find(name, version)
            versions = [e for e in self.registry.entries() if e.name == name]
            if len(versions) > 1 and self.registry.default_version(name) == entry.version:
                raise Forbidden(f"Cannot remove default version for model {name}")
        await self.registry.unload(name, version)

    def _in_background(self, job: Coroutine[Any, Any, Any], what: str) -> None:
        """Run ``job`` after the call was answered (``synchronous=false``). No caller is left to
        tell of its failure, so the failure is logged, naming ``what`` and why."""
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._finished, what))

    def _finished(self, what: str, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("%s failed: %s", what, error)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _read_settings(folder: Path) -> ModelSettings:
    own = folder / MODEL_SETTINGS_FILENAME
    if own.is_file():
        return ModelSettings.from_file(own)
    found = find_model_settings(folder)
    if len(found) != 1:
        raise InvalidInput(
            f"{folder.name} holds {len(found)} {MODEL_SETTINGS_FILENAME} files; it must hold one"
        )
    return ModelSettings.from_file(found[0])
