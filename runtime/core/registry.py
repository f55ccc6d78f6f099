"""The registry: which model versions are loaded, in what state, and how to reach them.

Each (name, version) has an entry holding its settings, its model, its scheduler and its state.
Loading a model that is already loaded builds and loads the new one first, then swaps it in and
retires the old one after its work, so reloads drop no traffic. A model that fails to load keeps
an entry in state UNAVAILABLE with the reason, so that its ready endpoint and the repository
index say why, while the other models serve on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.errors import InvalidInput, ModelFailed, ModelNotFound, ModelNotReady
from runtime.model import MLModel
from runtime.repository import import_model_class, relative_paths
from runtime.scheduling import Scheduler, make_scheduler
from runtime.settings import ModelSettings
from runtime.types import RepositoryIndexResponseItem, State

if TYPE_CHECKING:
    from runtime.scheduling.worker_executor import WorkerExecutor

logger = logging.getLogger(__name__)


@dataclass
class ModelEntry:
    """One model version as the registry holds it."""

    settings: ModelSettings
    state: State = State.LOADING
    reason: str = ""
    model: MLModel | None = None
    scheduler: Scheduler | None = field(default=None, repr=False)
    workers: WorkerExecutor | None = field(default=None, repr=False)
    """The worker processes running the model (None: it runs in the server process)."""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def version(self) -> str | None:
        return self.settings.version

    @property
    def ready(self) -> bool:
        if self.workers is not None and not self.workers.ready:
            return False  # every worker is dead or restarting
        return self.state is State.READY and self.model is not None and self.model.ready


def _version_key(version: str | None) -> tuple[int, ...] | tuple[int, str]:
    if version is None:
        return (-1, "")
    parts = re.findall(r"\d+", version)
    return (1, *map(int, parts)) if parts else (0, version)


class Registry:
    """Loaded models by name and version."""

    def __init__(
        self, root: str | os.PathLike[str] | None = None, parallel_workers: int = 0, grace: float = 30.0
    ) -> None:
        self.root = root
        """The model repository's folder: paths under it are shown relative to it in reasons."""
        self.parallel_workers = parallel_workers
        """Worker processes per model for models whose settings do not set ``workers``."""
        self.grace = grace
        """Seconds a worker gets to finish its work when its model is unloaded or scaled down."""
        self._entries: dict[str, dict[str | None, ModelEntry]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._defaults: dict[str, str | None] = {}
        """Default versions chosen through the management API (``set_default``)."""

    # ------------------------------------------------------------------ lookups

    def get(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry to serve ``name`` (at ``version``, or the default one); raises if none is ready."""
        entry = self.find(name, version)
        if not entry.ready:
            reason = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReady(f"Model {name!r} is not ready ({entry.state.value}){reason}")
        return entry

    def find(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry of ``name`` at ``version`` (default version if None), whatever its state."""
        versions = self._entries.get(name)
        if not versions:
            raise ModelNotFound(name)
        if version:
            entry = versions.get(version)
            if entry is None:
                raise ModelNotFound(name, version)
            return entry
        chosen = self._defaults.get(name, "")
        if chosen != "" and chosen in versions:
            return versions[chosen]
        return self._default(versions)

    def default_version(self, name: str) -> str | None:
        """The version that requests naming no version go to."""
        return self.find(name).version

    def set_default(self, name: str, version: str) -> None:
        """Make ``version`` the one that requests naming no version of ``name`` go to."""
        self.find(name, version)  # raises ModelNotFound
        self._defaults[name] = version

    @staticmethod
    def _default(versions: dict[str | None, ModelEntry]) -> ModelEntry:
        # unversioned settings win; else the highest ready version; else the highest version
        if len(versions) == 1:
            return next(iter(versions.values()))
        if None in versions:
            return versions[None]
        ordered = sorted(versions.values(), key=lambda e: _version_key(e.version), reverse=True)
        return next((e for e in ordered if e.ready), ordered[0])

    def versions(self, name: str) -> list[str]:
        return sorted((v for v in self._entries.get(name, {}) if v is not None), key=_version_key)

    def entries(self) -> list[ModelEntry]:
        return [entry for versions in self._entries.values() for entry in versions.values()]

    def index(self, ready_only: bool = False) -> list[RepositoryIndexResponseItem]:
        return [
            RepositoryIndexResponseItem(name=e.name, version=e.version, state=e.state, reason=e.reason)
            for e in self.entries()
            if e.ready or not ready_only
        ]

    # ------------------------------------------------------------------ loading

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, settings: ModelSettings) -> ModelEntry:
        """Load (or reload) one model version; failures are recorded, not raised."""
        if not settings.name:
            raise InvalidInput("A model needs a name")
        async with self._lock(settings.name):
            versions = self._entries.setdefault(settings.name, {})
            old = versions.get(settings.version)
            entry = ModelEntry(settings=settings)
            if old is None:
                versions[settings.version] = entry
            try:
                await self._start(entry)
            except Exception as exc:
                entry.state = State.UNAVAILABLE
                entry.reason = relative_paths(f"failed to load: {type(exc).__name__}: {exc}", self.root)
                logger.error("Model %r (version %s) %s", settings.name, settings.version, entry.reason)
                if old is not None and old.ready:
                    return entry  # keep serving the old one
                versions[settings.version] = entry
                return entry
            versions[settings.version] = entry
            if old is not None:
                await self._retire(old)
            logger.info("Model %r (version %s) loaded", settings.name, settings.version)
            return entry

    def workers_for(self, settings: ModelSettings) -> int:
        """How many worker processes run a model with these settings (0: the server process)."""
        return settings.workers if settings.workers is not None else self.parallel_workers

    async def _start(self, entry: ModelEntry) -> None:
        cls = import_model_class(entry.settings)
        if not issubclass(cls, MLModel):
            raise TypeError(f"{cls.__qualname__} is not a subclass of runtime.MLModel")
        model = cls(entry.settings)
        workers = self.workers_for(entry.settings)
        if workers and entry.settings.sequence_batching and entry.settings.sequence_store != "memory":
            raise ValueError(
                f"sequence_store {entry.settings.sequence_store!r} cannot serve a model in worker "
                f"processes (workers: {workers}): a sequence's state lives in the worker that runs its "
                "steps, not in the server process that writes the store; use workers: 0 (one replica "
                'per process, more replicas behind the proxy) or sequence_store: "memory"'
            )
        if workers:
            await self._start_in_workers(entry, model, workers)
            return
        loaded = await model.load()
        if loaded is False:
            raise RuntimeError("load() returned False")
        model.ready = True
        try:
            scheduler = make_scheduler(model, entry.settings)
            await scheduler.start()
        except BaseException:
            model.ready = False
            await model.unload()
            raise
        entry.model, entry.scheduler = model, scheduler
        entry.state, entry.reason = State.READY, ""

    async def _start_in_workers(self, entry: ModelEntry, model: MLModel, workers: int) -> None:
        """Each of ``workers`` processes loads its own copy of the model; the instance here is not
        loaded: it only tells the scheduler what kind of model it is."""
        from runtime.scheduling.worker_executor import WorkerExecutor

        executor = WorkerExecutor(entry.settings, workers, grace=self.grace)
        await executor.start()
        model.ready = True
        try:
            scheduler = make_scheduler(model, entry.settings, executor)
            await scheduler.start()
        except BaseException:
            model.ready = False
            await executor.stop()
            raise
        entry.model, entry.scheduler, entry.workers = model, scheduler, executor
        entry.state, entry.reason = State.READY, ""

    async def _retire(self, entry: ModelEntry) -> None:
        entry.state = State.UNLOADING
        try:
            if entry.scheduler is not None:
                await entry.scheduler.stop()
            if entry.workers is not None:  # they drain, unload their copies and exit
                await entry.workers.stop()
            if entry.scheduler is not None:
                entry.scheduler.executor.close()
            if entry.workers is not None:  # the instance here was never loaded
                if entry.model is not None:
                    entry.model.ready = False
                return
            if entry.model is not None:
                entry.model.ready = False
                await entry.model.unload()
        except Exception:
            logger.exception("Model %r (version %s) failed to unload", entry.name, entry.version)

    async def scale(self, entry: ModelEntry, workers: int) -> None:
        """Run ``entry``'s model in ``workers`` worker processes (0: in the server process).

        A model already in workers scales in place: new workers start, or the idlest retire after
        their work and their open sequences. Moving between the server process and workers
        reloads the model (the registry swaps the new instance in once it is ready).
        """
        executor = entry.workers
        if workers >= 1 and executor is not None:
            try:
                await executor.scale(workers)
            except Exception as exc:  # a new worker could not load the model (it is gone again)
                raise ModelFailed(
                    f"Model {entry.name!r} could not scale to {workers} workers: {exc}"
                ) from exc
            entry.settings.workers = workers
            return
        source = entry.settings._source
        settings = entry.settings.model_copy(update={"workers": workers})
        settings._source = source
        reloaded = await self.load(settings)
        if reloaded.state is State.UNAVAILABLE:
            raise ModelFailed(f"Model {entry.name!r} could not be reloaded: {reloaded.reason}")

    async def unload(self, name: str, version: str | None = None) -> None:
        """Unload one version (or every version of ``name`` when version is None)."""
        async with self._lock(name):
            versions = self._entries.get(name)
            if not versions or (version and version not in versions):
                raise ModelNotFound(name, version)
            targets = [versions[version]] if version else list(versions.values())
            for entry in targets:
                del versions[entry.version]
                await self._retire(entry)
            if not versions:
                del self._entries[name]
                self._defaults.pop(name, None)
            elif self._defaults.get(name, "") not in versions:
                self._defaults.pop(name, None)
            logger.info("Model %r unloaded", name)

    async def hand_over(self) -> None:
        """The server drains: each model's scheduler hands over what other replicas may take now."""
        for entry in self.entries():
            if entry.scheduler is None:
                continue
            try:
                await entry.scheduler.hand_over()
            except Exception:
                logger.exception("Model %r failed to hand its sequences over", entry.name)

    async def unload_all(self) -> None:
        for name in list(self._entries):
            await self.unload(name)
