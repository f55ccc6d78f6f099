"""Following the model repository while the server runs (``repository_poll_interval``; Triton's
POLL mode).

Every interval the repository's model folders (those holding a model-settings.json) are listed,
each with a fingerprint of its files (path, size and modification time of every file of the
folder, those of nested model folders and ``__pycache__`` left out), and compared with the last
look:

- a new folder registers its model: loaded now, or, when models load on demand (a residency
  limit), listed "not loaded" until a request names it (a pinned one is loaded now);
- a changed folder (model-settings.json or any model file) reloads its model: the registry loads
  the new copy while the old one serves, swaps, and unloads the old one after its work; a model
  not loaded just takes the new settings;
- a removed folder unloads its model once its requests, streams and sequences have ended, and
  the model is forgotten.

Files are read off the event loop (a thread). TorchServe archives (``.mar``) are not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from runtime.core.registry import Registry
from runtime.errors import ModelNotFound
from runtime.repository import RepositoryError, find_model_settings, forget_local_modules
from runtime.settings import MODEL_SETTINGS_FILENAME, ModelSettings

logger = logging.getLogger(__name__)

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(folder: Path) -> Fingerprint:
    """What changes when a file of the model's folder changes (nested model folders left out)."""
    found: list[tuple[str, int, int]] = []
    for base, dirs, files in os.walk(folder):
        here = Path(base)
        if here != folder and (here / MODEL_SETTINGS_FILENAME).is_file():
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            try:
                stat = (here / name).stat()
            except OSError:  # removed meanwhile: the next look sees it
                continue
            found.append((str((here / name).relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return tuple(found)


def look(root: str | os.PathLike[str]) -> dict[Path, Fingerprint]:
    """Each model-settings.json under ``root`` with its folder's fingerprint."""
    try:
        paths = find_model_settings(root)
    except RepositoryError as exc:
        logger.warning("Cannot read the model repository: %s", exc)
        return {}
    return {path: fingerprint(path.parent) for path in paths}


class RepositoryPoll:
    """Looks at the repository every ``interval`` seconds and brings the registry in line with it."""

    def __init__(
        self,
        registry: Registry,
        root: str | os.PathLike[str],
        interval: float,
        removed: Callable[[str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.root = root
        self.interval = interval
        self.removed = removed
        """Told the name of each model whose folder went away."""
        self.seen: dict[Path, Fingerprint] = {}
        self.names: dict[Path, tuple[str, str | None]] = {}
        self.looks = 0
        """Looks taken so far."""
        self._looked: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._work: set[asyncio.Task[None]] = set()
        """Loads and unloads under way: a look does not wait for them (an unload waits for the
        model's work to end, a reload for the new copy)."""

    async def start(self) -> None:
        """Take the first look (what the server loaded at start) and follow from there."""
        self.seen = await asyncio.to_thread(look, self.root)
        for path in self.seen:
            settings = self._read(path)
            if settings is not None:
                self.names[path] = (settings.name, settings.version)
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.settled()

    async def settled(self) -> None:
        """Wait until the loads and unloads that the looks so far started have ended."""
        while self._work:
            await asyncio.gather(*self._work, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._work.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._work.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("Following the model repository failed", exc_info=task.exception())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.poll()
            except Exception:
                logger.exception("Following the model repository failed; trying again")

    async def poll(self) -> None:
        """One look: register, reload and unload what changed since the last one."""
        now = await asyncio.to_thread(look, self.root)
        before, self.seen = self.seen, now
        for path in before.keys() - now.keys():
            await self._remove(path)
        for path, print_ in now.items():
            if path not in before:
                await self._add(path)
            elif before[path] != print_:
                await self._change(path)
        self.looks += 1
        if self._looked is not None:
            self._looked.set()
            self._looked = None

    async def next_look(self) -> None:
        """Wait until the next look has been taken and acted upon (a change made now is seen)."""
        if self._looked is None:
            self._looked = asyncio.Event()
        await self._looked.wait()

    def _read(self, path: Path) -> ModelSettings | None:
        try:
            return ModelSettings.from_file(path)
        except Exception as exc:
            logger.error("Cannot read %s: %s", path, exc)
            return None

    async def _add(self, path: Path) -> None:
        settings = await asyncio.to_thread(self._read, path)
        if settings is None:
            return
        self.names[path] = (settings.name, settings.version)
        logger.info("Model folder added: %s (model %r)", path.parent.name, settings.name)
        if self.registry.residency.on_demand and not settings.pinned:
            self.registry.register(settings)
        else:
            self._spawn(self._load(settings))

    async def _load(self, settings: ModelSettings) -> None:
        await self.registry.load(settings)

    async def _change(self, path: Path) -> None:
        settings = await asyncio.to_thread(self._read, path)
        if settings is None:
            return
        if self.names.get(path) != (settings.name, settings.version):
            await self._remove(path)
            await self._add(path)
            return
        logger.info("Model folder changed: %s (model %r): reloading", path.parent.name, settings.name)
        try:
            entry = self.registry.find(settings.name, settings.version)
        except ModelNotFound:
            entry = None
        if entry is not None and entry.on_demand and not entry.loaded and not settings.pinned:
            entry.settings = settings  # loaded with these by its next request
            forget_local_modules(path.parent)
            return
        self._spawn(self._load(settings))

    async def _remove(self, path: Path) -> None:
        named = self.names.pop(path, None)
        if named is None:
            return
        logger.info(
            "Model folder removed: %s (model %r): unloading after its work", path.parent.name, named[0]
        )
        self._spawn(self._unload(*named))

    async def _unload(self, name: str, version: str | None) -> None:
        if self.removed is not None:
            self.removed(name)
        try:
            await self.registry.unload(name, version, reason="removed", forget=True)
        except ModelNotFound:
            return
