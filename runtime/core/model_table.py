"""The registry's table: each model version's entry, found by name and version.

Each (name, version) has an entry (:class:`ModelEntry`) holding its settings, its model, its
scheduler and its state. :class:`ModelTable` finds them: the entry to serve a request with (a
version asked for, the default one chosen through the management API, else the unversioned or the
highest one), the repository index, readiness. Loading, unloading and loading on demand are the
registry's (``runtime.core.registry``), on top of this table.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.errors import InvalidInput, ModelNotFound, ModelNotReady
from runtime.model import MLModel
from runtime.scheduling import Scheduler
from runtime.settings import ModelSettings
from runtime.types import RepositoryIndexResponseItem, State

if TYPE_CHECKING:
    from runtime.scheduling.worker_executor import WorkerExecutor

NOT_LOADED = "not loaded"
"""The reason an entry gives while its model is not loaded (loaded on demand by a request)."""


_READY = State.READY  # (read per request: a global, not an attribute of the enum class)


@dataclass(eq=False)
class ModelEntry:
    """One model version as the registry holds it."""

    settings: ModelSettings
    state: State = State.LOADING
    reason: str = ""
    model: MLModel | None = None
    scheduler: Scheduler | None = field(default=None, repr=False)
    workers: WorkerExecutor | None = field(default=None, repr=False)
    """The worker processes running the model (None: it runs in the server process)."""
    on_demand: bool = False
    """Loaded by the first request that names it when not loaded (models under a residency limit)."""
    busy: int = 0
    """Requests and streams that hold this entry now (the DataPlane counts them in and out)."""
    on_idle: Callable[[], None] | None = field(default=None, repr=False)
    """Called when ``busy`` falls to 0, while someone waits for that."""
    used: int = 0
    """When the entry was last taken by a request (a tick of the registry's clock)."""
    memory: int = 0
    """Resident bytes the model took when it last loaded."""
    loading: asyncio.Task[None] | None = field(default=None, repr=False)
    """The load on demand in progress, which every request for the model waits on."""

    @property
    def pinned(self) -> bool:
        return self.settings.pinned

    @property
    def loaded(self) -> bool:
        """Whether a model instance is held (ready, warming up or unloading)."""
        return self.model is not None

    @property
    def idle(self) -> bool:
        """No request in flight, no open stream, no live sequence."""
        if self.busy:
            return False
        return self.scheduler is None or not self.scheduler.open_sequences()

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
        return self.state is _READY and self.model is not None and self.model.ready


def _version_key(version: str | None) -> tuple[int, ...] | tuple[int, str]:
    if version is None:
        return (-1, "")
    parts = re.findall(r"\d+", version)
    return (1, *map(int, parts)) if parts else (0, version)


class ModelTable:
    """The entries of the model versions by name and version (the registry is one)."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str | None, ModelEntry]] = {}
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

    def serving(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry to serve ``name`` with: ready, or not loaded and loaded on demand by
        ``acquire``; raises as ``get`` does otherwise."""
        entry = self.find(name, version)
        if entry.ready or entry.on_demand:
            return entry
        return self.get(name, version)

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
        if len(versions) == 1:  # the only version, whatever was chosen (a choice names it or one gone)
            return next(iter(versions.values()))
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
        # (of several) unversioned settings win; else the highest ready version; else the highest
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

    def all_ready(self) -> bool:
        """True when every model that loaded successfully is ready (failed loads are reported apart)."""
        return all(e.ready for e in self.entries() if e.state is not State.UNAVAILABLE)

    def resident(self) -> list[ModelEntry]:
        """The entries whose model is loaded (or loading, or unloading)."""
        return [e for e in self.entries() if e.loaded]

    # ------------------------------------------------------------------ loading on demand

    def register(self, settings: ModelSettings) -> ModelEntry:
        """Add a model that the first request naming it loads (state UNAVAILABLE, "not loaded");
        an entry of that name and version already there is kept."""
        if not settings.name:
            raise InvalidInput("A model needs a name")
        versions = self._entries.setdefault(settings.name, {})
        entry = versions.get(settings.version)
        if entry is None:
            entry = versions[settings.version] = ModelEntry(
                settings=settings, state=State.UNAVAILABLE, reason=NOT_LOADED, on_demand=True
            )
        return entry
