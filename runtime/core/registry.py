"""The registry: loading and unloading model versions, and loading them on demand.

Its table of entries is ``runtime.core.model_table``'s. Loading a model that is already loaded
builds and loads the new one first, then swaps it in and retires the old one after its work, so
reloads drop no traffic. A model that fails to load keeps an entry in state UNAVAILABLE with the
reason, so that its ready endpoint and the repository index say why, while the other models serve on.

With a limit on the loaded models (``runtime.core.residency``), every model of the repository has an
entry, and one not loaded (UNAVAILABLE, "not loaded") is loaded by the first request naming it
(``acquire``): concurrent requests wait for one load, loads run one at a time, and the least
recently used idle model is unloaded first to make room. A request counts itself on its entry
(``busy``) from the moment it takes it until its answer, so that a model with work in flight is
never unloaded. Each load runs the model's warm-up requests (``warm``) before it is READY.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from runtime.core.model_table import NOT_LOADED, ModelEntry, ModelTable
from runtime.core.residency import Residency, resident_bytes
from runtime.core.response_cache import ResponseCache
from runtime.errors import InvalidInput, ModelFailed, ModelNotFound, ModelNotReady, Overloaded
from runtime.model import MLModel
from runtime.repository import forget_local_modules, import_model_class, relative_paths
from runtime.scheduling import make_scheduler
from runtime.settings import ModelSettings
from runtime.types import State

logger = logging.getLogger(__name__)

ROOM_CHECK = 0.25
"""Seconds between two looks for room while every loaded model is busy (an ending sequence does
not signal; a request that ends does)."""


def _retrieved(task: asyncio.Task[None]) -> None:
    """A load's failure is its waiters' (they may all have timed out): retrieved, not logged twice."""
    if not task.cancelled():
        task.exception()


class Registry(ModelTable):
    """Model versions by name and version: loaded, unloaded, loaded on demand."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        parallel_workers: int = 0,
        grace: float = 30.0,
        residency: Residency | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        super().__init__()
        self.root = root
        """The model repository's folder: paths under it are shown relative to it in reasons."""
        self.parallel_workers = parallel_workers
        """Worker processes per model for models whose settings do not set ``workers``."""
        self.grace = grace
        """Seconds a worker gets to finish its work when its model is unloaded or scaled down."""
        self._locks: dict[str, asyncio.Lock] = {}
        self.residency = residency if residency is not None else Residency()
        """The limits on loaded models, and the counts of loads and unloads."""
        self.cache = cache
        """The response cache (None: off); a model's entries are dropped when it reloads."""
        self.warm: Callable[[ModelEntry], Awaitable[None]] | None = None
        """Serves a model's warm-up requests before it is READY (set by the DataPlane)."""
        self.clock = itertools.count(1)
        """Ticks that order the entries by their last use."""
        self._one_load = asyncio.Lock()
        """Held by each load under a residency limit: loads run one at a time."""
        self._room = asyncio.Event()
        """Set when a loaded model becomes idle while a load waits for room."""

    # ------------------------------------------------------------------ loading on demand

    async def acquire(self, entry: ModelEntry, timeout: float | None = None) -> ModelEntry:
        """The ready entry of ``entry``'s model, counted as busy (the caller releases it): loaded
        now if it is not (one load, however many requests wait; at most ``timeout`` seconds, and
        at most the residency's wait). The model's current entry is taken: a request that found an
        entry since replaced is served by its successor."""
        current = self.find(entry.name, entry.version)
        if current.ready:
            current.busy += 1
            current.used = next(self.clock)
            return current
        if not current.on_demand:
            self.get(current.name, current.version)  # raises ModelNotReady, with the reason
        current.busy += 1
        try:
            if current.loading is None:
                current.loading = asyncio.get_running_loop().create_task(self._load_on_demand(current))
                current.loading.add_done_callback(_retrieved)
            wait = self.residency.wait if timeout is None else min(timeout, self.residency.wait)
            try:
                async with asyncio.timeout(wait):
                    await asyncio.shield(current.loading)
            except TimeoutError:
                raise ModelNotReady(
                    f"Model {current.name!r} is not loaded yet: its load did not end within {wait:g}s"
                ) from None
            if not current.ready:
                raise ModelNotReady(f"Model {current.name!r} is not ready ({current.state.value})")
        except BaseException:
            self.release(current)
            raise
        current.used = next(self.clock)
        return current

    @staticmethod
    def release(entry: ModelEntry) -> None:
        """What ``acquire`` took (the DataPlane calls it as ``release`` on its hot path)."""
        entry.busy -= 1
        if not entry.busy and entry.on_idle is not None:
            entry.on_idle()

    async def _load_on_demand(self, entry: ModelEntry) -> None:
        try:
            async with self._one_load:
                if entry.ready:
                    return
                if self._entries.get(entry.name, {}).get(entry.version) is not entry:
                    raise ModelNotReady(f"Model {entry.name!r} was unloaded and removed meanwhile")
                if entry.loaded:  # an unload asked for through the API is under way
                    raise ModelNotReady(f"Model {entry.name!r} is being unloaded; try again")
                await self._make_room(entry)
                entry.state, entry.reason = State.LOADING, ""
                try:
                    await self._start_measured(entry)
                except Exception as exc:
                    self._failed(entry, exc)
                    entry.on_demand = True  # a later request tries again
                    raise ModelNotReady(f"Model {entry.name!r} could not be loaded: {entry.reason}") from None
                logger.info("Model %r (version %s) loaded on demand", entry.name, entry.version)
                await self._settle(keep=entry)
        finally:
            entry.loading = None

    async def _make_room(self, entry: ModelEntry) -> None:
        """Unload the least recently used idle models until ``entry`` fits; wait (bounded) while
        every loaded model is busy, then give up with Overloaded."""
        residency = self.residency
        deadline = time.monotonic() + residency.wait
        while not residency.fits(self.resident(), entry):
            victim = residency.victim(self.resident(), keep=entry)
            if isinstance(victim, ModelEntry):
                await self._evict(victim)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise Overloaded(
                    f"No room to load model {entry.name!r}: every loaded model is busy or pinned "
                    f"(max_loaded_models {residency.max_loaded or 'unlimited'}, models_memory_limit "
                    f"{residency.memory_limit or 'unlimited'})"
                )
            await self._wait_for_room(min(left, ROOM_CHECK))

    async def _wait_for_room(self, seconds: float) -> None:
        busy = [e for e in self.resident() if e.busy]
        self._room.clear()
        for e in busy:
            e.on_idle = self._room.set
        try:
            async with asyncio.timeout(seconds):
                await self._room.wait()
        except TimeoutError:
            pass
        finally:
            for e in busy:
                if e.on_idle == self._room.set:
                    e.on_idle = None

    async def _settle(self, keep: ModelEntry | None = None) -> None:
        """After a load: unload idle models while the measured memory is over the limit."""
        residency = self.residency
        while not residency.fits(self.resident()):
            victim = residency.victim(self.resident(), keep=keep)
            if not isinstance(victim, ModelEntry):
                return
            await self._evict(victim)

    async def _evict(self, entry: ModelEntry) -> None:
        """Unload an idle model to make room; it stays registered, loaded again on demand."""
        entry.state, entry.reason = State.UNLOADING, ""
        await self._retire(entry, "evicted")
        self._unloaded_entry(entry)
        logger.info("Model %r (version %s) unloaded to make room", entry.name, entry.version)

    def _unloaded_entry(self, entry: ModelEntry) -> None:
        entry.model, entry.scheduler, entry.workers = None, None, None
        entry.state, entry.reason, entry.memory = State.UNAVAILABLE, NOT_LOADED, entry.memory
        entry.on_demand = True

    async def _start_measured(self, entry: ModelEntry) -> None:
        """``_start``, timed, with the memory the model took measured (see runtime.core.residency)."""
        before, began = resident_bytes(), time.perf_counter()
        await self._start(entry)
        self.residency.loaded(entry.name, entry.version, time.perf_counter() - began)
        if entry.workers is not None and entry.workers.pool is not None:
            entry.memory = sum(w["memoryUsage"] or 0 for w in entry.workers.pool.describe())
        else:
            entry.memory = max(0, resident_bytes() - before)

    def _failed(self, entry: ModelEntry, exc: BaseException) -> None:
        entry.state = State.UNAVAILABLE
        entry.reason = relative_paths(f"failed to load: {type(exc).__name__}: {exc}", self.root)
        logger.error("Model %r (version %s) %s", entry.name, entry.version, entry.reason)

    # ------------------------------------------------------------------ loading

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, settings: ModelSettings) -> ModelEntry:
        """Load (or reload) one model version; failures are recorded, not raised.

        Under a residency limit the load waits for the loads before it and unloads idle models
        to make room (a model that cannot get room fails to load, with the reason)."""
        if not settings.name:
            raise InvalidInput("A model needs a name")
        if not self.residency.on_demand:
            return await self._load(settings)
        async with self._one_load:
            return await self._load(settings)

    async def _load(self, settings: ModelSettings) -> ModelEntry:
        async with self._lock(settings.name):
            versions = self._entries.setdefault(settings.name, {})
            old = versions.get(settings.version)
            entry = ModelEntry(settings=settings, on_demand=self.residency.on_demand)
            if old is not None and not old.loaded:
                old.settings = settings  # a placeholder takes the new settings, loaded in place
                entry = old
            if old is None:
                versions[settings.version] = entry
            if old is not None and settings.folder is not None:
                forget_local_modules(settings.folder)  # a changed model file is read again
            try:
                if self.residency.on_demand:
                    await self._make_room(entry)
                entry.state, entry.reason = State.LOADING, ""
                await self._start_measured(entry)
            except Exception as exc:
                self._failed(entry, exc)
                if old is not None and old is not entry and old.ready:
                    return entry  # keep serving the old one
                versions[settings.version] = entry
                return entry
            versions[settings.version] = entry
            if old is not None and old is not entry:
                await self._retire(old, "replaced")
            if self.cache is not None:
                await self.cache.drop(settings.name, settings.version)
            logger.info("Model %r (version %s) loaded", settings.name, settings.version)
        if self.residency.on_demand:
            await self._settle(keep=entry)
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
        await self._warm_up(entry)
        entry.state, entry.reason = State.READY, ""

    async def _warm_up(self, entry: ModelEntry) -> None:
        """Serve the model's warm-up requests; on a failure unload it again and raise."""
        if self.warm is None or not entry.settings.warmup:
            return
        try:
            await self.warm(entry)
        except BaseException:
            await self._retire(entry, None, wait=False)
            entry.model, entry.scheduler, entry.workers = None, None, None
            raise

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
        await self._warm_up(entry)
        entry.state, entry.reason = State.READY, ""

    async def _retire(self, entry: ModelEntry, reason: str | None, wait: bool = True) -> None:
        """Unload ``entry``'s model once the requests and streams that hold it have ended (at most
        the grace period); ``reason`` is counted (None: a load that failed, not an unload)."""
        entry.state = State.UNLOADING
        if wait:
            if entry.scheduler is not None:
                entry.scheduler.hurry()  # a batch waiting to fill would hold the unload back
            await self._wait_idle(entry)
        if reason is not None and entry.model is not None:
            self.residency.unloaded(entry.name, entry.version, reason)
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

    async def _wait_idle(self, entry: ModelEntry) -> None:
        if not entry.busy:
            return
        went_idle = asyncio.Event()
        entry.on_idle = went_idle.set
        try:
            async with asyncio.timeout(self.grace):
                await went_idle.wait()
        except TimeoutError:
            logger.warning(
                "Model %r (version %s): %d request(s) or stream(s) still running after %gs; unloading",
                entry.name,
                entry.version,
                entry.busy,
                self.grace,
            )
        finally:
            entry.on_idle = None

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

    async def unload(
        self, name: str, version: str | None = None, reason: str = "requested", forget: bool | None = None
    ) -> None:
        """Unload one version (or every version of ``name`` when version is None), once its work
        has ended. A model loaded on demand stays registered ("not loaded") unless ``forget``
        (its folder was removed); others are forgotten."""
        async with self._lock(name):
            versions = self._entries.get(name)
            if not versions or (version and version not in versions):
                raise ModelNotFound(name, version)
            targets = [versions[version]] if version else list(versions.values())
            for entry in targets:
                keep = entry.on_demand if forget is None else not forget
                if not keep:
                    del versions[entry.version]
                if entry.loaded:
                    await self._retire(entry, reason)
                if keep:
                    self._unloaded_entry(entry)
                elif self.cache is not None:
                    await self.cache.drop(entry.name, entry.version)
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
            await self.unload(name, forget=True)
        if self.cache is not None:
            await self.cache.close()

    def models_held(self) -> dict[str, Any]:
        """The resident models' count and memory, for the metrics and docs."""
        resident = self.resident()
        return {"loaded": len(resident), "memory": sum(e.memory for e in resident)}
