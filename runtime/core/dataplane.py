"""The DataPlane: the transport-free core that REST and gRPC both call.

It checks requests (tensors become numpy arrays of their shape, once: ``runtime.core.request_checks``),
hands them to the model's scheduler, checks what the model returned, and sorts errors at one
place: client errors pass through, cancellation re-raises, anything else the model raised becomes
``ModelFailed`` with the cause chained. Its stream serving is ``runtime.core.stream_serving``'s.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from runtime.core.fairness import LoopTurns
from runtime.core.generate import (
    GenerateRequest,
    GenerateResponse,
    to_generate_response,
    to_inference_request,
    wants_details,
)
from runtime.core.model_config import model_config
from runtime.core.model_table import ModelEntry
from runtime.core.observer import Observer
from runtime.core.registry import Registry
from runtime.core.request_checks import finish_response, prepare_request
from runtime.core.response_cache import ResponseCache, answer_from, request_digest
from runtime.core.stream_serving import StreamServing
from runtime.core.warmup import WarmupError, warmup_requests
from runtime.errors import (
    ModelFailed,
    ModelNotFound,
    RequestTimeout,
    ServerError,
    ShuttingDown,
    Unauthenticated,
)
from runtime.handlers import CustomHandler, get_custom_handlers
from runtime.model import MLModel
from runtime.repository import RepositoryError, relative_paths, settings_in_repository
from runtime.scheduling.queueing import queue_timeout
from runtime.settings import ModelSettings, Settings
from runtime.streams.pipeline import sort_error
from runtime.streams.stream_counter import StreamCounter
from runtime.types import (
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataServerResponse,
    MetadataTensor,
    Parameters,
    RepositoryIndexResponseItem,
    State,
)

logger = logging.getLogger(__name__)

release = Registry.release
"""What a request took of its model's entry, given back (one name, looked up once)."""

_READY = State.READY

EXTENSIONS = ("binary_tensor_data", "model_repository", "generate", "sequence")

E = TypeVar("E", bound=Exception)


class Key(Protocol):
    """A key a request's ``Authorization`` value is checked against (the management key)."""

    def allows(self, authorization: str | None) -> bool: ...


class DataPlane(StreamServing):
    """Health, metadata and inference, whatever the transport."""

    def __init__(self, settings: Settings, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry
        self.started = False
        self.draining = False
        self.streams = StreamCounter()
        """Streams being served now (every transport, every model)."""
        self.turns = LoopTurns(settings.transport_fairness)
        """REST and gRPC's fair turns in the one event loop (see runtime.core.fairness)."""
        self.observer: Observer | None = None
        self.repository_key: Key | None = None
        """The key the repository's load and unload need (``repository_token_auth``): the server
        gives it the management key; without one, they are refused while the setting is on."""
        """Metrics and traces of requests and streams (None: both off); see runtime.server.observability."""
        self.expected: set[tuple[str, str | None]] = set()
        """The models (name, version) asked for at startup, which strict readiness waits for."""
        self.unreadable: set[str] = set()
        """Folders whose model-settings.json could not be read at startup (strict readiness fails)."""
        self._unary: set[asyncio.Task[Any]] = set()
        """The tasks serving a unary request now (``infer``)."""
        self._cut: set[asyncio.Task[Any]] = set()
        """Those of them that ``cut_unary`` cancelled."""
        self._handlers: weakref.WeakKeyDictionary[MLModel, list[tuple[CustomHandler, Callable[..., Any]]]] = (
            weakref.WeakKeyDictionary()
        )
        """Each loaded model's ``@custom_handler`` methods, found on first use."""
        self._clock = registry.clock
        self.cache: ResponseCache | None = registry.cache
        """Answers of the models with ``response_cache`` (None: the server keeps none)."""
        registry.warm = self._warm_up

    # ------------------------------------------------------------------ health and metadata

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Whether the server takes traffic: see ``Settings.strict_readiness`` and the README's Health."""
        return self.not_ready_because() is None

    def not_ready_because(self) -> str | None:
        """Why the server is not ready, in words (None when it is)."""
        if not self.started:
            return "it is starting"
        if self.draining:
            return "it is shutting down"
        if not self.settings.strict_readiness:
            return None
        entries = self.registry.entries()
        if not entries and self.settings.load_models_at_startup:
            return "no model is loaded"  # an empty repository, or every model unloaded
        if self.unreadable:
            return f"the settings of {', '.join(sorted(self.unreadable))} could not be read"
        for entry in entries:
            if not entry.ready and not (entry.on_demand and (entry.name, entry.version) not in self.expected):
                name = f"{entry.name} {entry.version}" if entry.version else entry.name
                reason = f": {entry.reason}" if entry.reason else ""
                return f"model {name!r} is {entry.state.value}{reason}"
        missing = self.expected - {(entry.name, entry.version) for entry in entries}
        if missing:
            names = ", ".join(sorted(f"{n} {v}" if v else n for n, v in missing))
            return f"model(s) asked for at startup are not loaded: {names}"
        return None

    def expect(self, models: list[ModelSettings], unreadable: list[str]) -> None:
        """Record the models asked for at startup (and the folders whose settings could not be read)."""
        self.expected = {(m.name, m.version) for m in models}
        self.unreadable = set(unreadable)

    def forget(self, name: str) -> None:
        """Strict readiness stops waiting for ``name`` (its folder was removed, or it was unloaded)."""
        self.expected = {key for key in self.expected if key[0] != name}
        self.unreadable.discard(name)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Whether the model can serve; raises ModelNotFound for an unknown name or version."""
        return self.registry.find(name, version).ready and not self.draining

    def metadata(self) -> MetadataServerResponse:
        extensions = list(EXTENSIONS) + [e for e in self.settings.extensions if e not in EXTENSIONS]
        return MetadataServerResponse(
            name=self.settings.server_name, version=self.settings.server_version, extensions=extensions
        )

    async def model_metadata(self, name: str, version: str | None = None) -> MetadataModelResponse:
        entry = await self.registry.acquire(self.registry.serving(name, version))
        try:
            assert entry.model is not None
            meta = await entry.model.metadata()
        finally:
            Registry.release(entry)
        if not meta.versions:
            meta.versions = self.registry.versions(name) or ([entry.version] if entry.version else [])
        if entry.scheduler is not None:  # how the model is scheduled, with every batching setting
            own = meta.parameters.model_dump(exclude_none=True) if meta.parameters else {}
            meta.parameters = Parameters(**{**entry.scheduler.describe(), **own})
        return meta

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's model configuration JSON, for clients such as perf_analyzer."""
        entry = self.registry.get(name, version)
        assert entry.scheduler is not None
        return model_config(entry.settings, entry.scheduler.describe())

    def model_inputs(self, name: str, version: str | None = None) -> list[MetadataTensor]:
        """The declared inputs of a model (empty when its settings declare none)."""
        return list(self.registry.serving(name, version).settings.inputs)

    # ------------------------------------------------------------------ inference

    def check_model(self, name: str, version: str | None = None) -> ModelEntry:
        """Raise now if the model cannot take a request, before a transport reads the body (a
        refusal is counted as ``infer`` counts one); return the model's entry, whose settings a
        transport may read to translate the request."""
        try:
            if self.draining:
                raise ShuttingDown("The server is shutting down")
            return self.registry.serving(name, version)
        except ServerError as exc:
            if self.observer is not None:
                self.observer.refused(name, version, exc)
            raise

    async def infer(
        self,
        request: InferenceRequest,
        name: str,
        version: str | None = None,
        entry: ModelEntry | None = None,
    ) -> InferenceResponse:
        """Serve one request through the model's scheduler and return its checked response.

        ``entry``: what ``check_model(name, version)`` returned for this request, which spares
        looking the model up again. The transport may have awaited since (reading the body):
        ``_serve`` takes the model's current entry when that one is no longer ready, and a
        server that began to drain meanwhile refuses the request as ``check_model`` would."""
        if entry is None or self.draining:
            entry = self.check_model(name, version)  # found once, for the observer and the request alike
        observer = self.observer
        if observer is None:
            return await self._serve(request, entry)
        watch = observer.begin(entry, name, version)
        if watch is None:
            return await self._serve(request, entry)
        try:  # counted and traced here, in this frame: no wrapper coroutine on the hot path
            response = await self._serve(request, entry)
        except BaseException as exc:
            Observer.done(watch, exc)
            raise
        Observer.done(watch, None)
        return response

    async def _serve(self, request: InferenceRequest, entry: ModelEntry) -> InferenceResponse:
        prepare_request(request, entry.settings)
        limit = queue_timeout(request, entry.settings.request_timeout)
        digest = None
        if self.cache is not None and entry.settings.response_cache and not entry.settings.sequence_batching:
            digest = request_digest(request)
            if digest is not None:
                cached = await self.cache.get(entry.name, entry.version, digest)
                if cached is not None:  # answered without the model (loaded or not)
                    return finish_response(answer_from(cached), request, entry.settings)
        task = asyncio.current_task()
        assert task is not None
        if entry.state is _READY:  # taken in this turn of the loop: it cannot be unloaded meanwhile
            entry.busy += 1
            entry.used = next(self._clock)
        else:  # loaded on demand, or replaced since the transport found it
            entry = await self.registry.acquire(entry, limit)
        self._unary.add(task)
        try:
            assert entry.scheduler is not None
            if limit is None:
                response = await entry.scheduler.infer(request)
            else:
                async with asyncio.timeout(limit) as deadline:
                    response = await entry.scheduler.infer(request)
        except asyncio.CancelledError:
            if task not in self._cut:
                raise
            task.uncancel()
            logger.warning(
                "Request %s for model %r cancelled: still running when the shutdown grace period ended",
                request.id or "(no id)",
                entry.name,
            )
            raise ShuttingDown(
                f"The server is shutting down: the request for model {entry.name!r} was cancelled "
                "when the shutdown grace period ended"
            ) from None
        except Exception as exc:
            if isinstance(exc, TimeoutError) and limit is not None and deadline.expired():
                raise RequestTimeout(
                    f"The request to model {entry.name!r} timed out: it took longer than its timeout of "
                    f"{limit:g}s, and its work was cancelled"
                ) from None
            error = self._shown(sort_error(entry.name, exc))
            if error is exc:
                raise
            raise error from exc
        finally:
            self._unary.discard(task)
            self._cut.discard(task)
            release(entry)
        response = finish_response(response, request, entry.settings)
        if digest is not None and self.cache is not None:
            await self.cache.put(entry.name, entry.version, digest, response)
        return response

    async def _warm_up(self, entry: ModelEntry) -> None:
        """Serve ``entry``'s warm-up requests (``runtime.core.warmup``) through its scheduler, before
        the registry makes it READY; the first failure raises ``WarmupError`` with its reason."""
        assert entry.scheduler is not None
        requests = warmup_requests(entry.settings)
        for number, request in enumerate(requests, 1):
            try:
                prepare_request(request, entry.settings)
                finish_response(await entry.scheduler.infer(request), request, entry.settings)
            except Exception as exc:
                error = sort_error(entry.name, exc)
                raise WarmupError(f"warm-up request {number} of {len(requests)} failed: {error}") from exc
        if requests:
            logger.info(
                "Model %r (version %s) warmed up: %d request(s)", entry.name, entry.version, len(requests)
            )

    def _shown(self, error: E) -> E:
        """``error`` as a client may see it: a model's failure names files relative to the model
        repository (what a model raised may hold absolute paths), as load errors do."""
        if isinstance(error, ModelFailed):
            error.message = relative_paths(error.message, self.settings.model_repository_root)
            error.args = (error.message,)
        return error

    def in_flight(self) -> int:
        """Requests and streams being served now (over every transport)."""
        return len(self._unary) + self.streams.active

    def cut_unary(self) -> int:
        """Cancel the unary requests still running (the shutdown grace period is over): each one's
        caller gets ``ShuttingDown``. Return how many were cancelled."""
        for task in self._unary:
            self._cut.add(task)
            task.cancel()
        return len(self._unary)

    # ------------------------------------------------------------------ generate extension

    def generate_request(
        self, body: GenerateRequest, name: str, version: str | None = None
    ) -> tuple[InferenceRequest, Callable[[InferenceResponse], GenerateResponse]]:
        """The inference request a generate request stands for, and what turns each of its
        responses into a generate answer. The request is served like any other (``infer`` or
        ``infer_stream``), so generate and infer share one path: sequences, cancellation, errors."""
        settings = self.check_model(name, version).settings
        details = wants_details(body)
        request = to_inference_request(body, settings)
        return request, lambda response: to_generate_response(response, settings, details)

    # ------------------------------------------------------------------ custom handlers

    def custom_handler(self, method: str, path: str) -> Callable[..., Any] | None:
        """The ready model method marked ``@custom_handler`` for ``method path`` (None: no model's).

        Models served by worker processes are not asked: their methods run in the workers, and
        only ``predict`` crosses to them."""
        for entry in self.registry.entries():
            model = entry.model
            if model is None or entry.workers is not None or not entry.ready:
                continue
            handlers = self._handlers.get(model)
            if handlers is None:
                handlers = self._handlers[model] = get_custom_handlers(model)
            for handler, bound in handlers:
                if handler.rest_method == method and handler.rest_path == path:
                    return bound
        return None

    async def call_handler(self, method: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        """What a model's custom handler returns for ``arguments``; errors sorted as inference's are
        (the error tree's pass through, anything else becomes ModelFailed with the cause chained)."""
        try:
            result = method(**arguments)
            if inspect.isawaitable(result):
                result = await result
        except ServerError:
            raise
        except Exception as exc:
            owner = getattr(getattr(method, "__self__", None), "name", "?")
            raise ModelFailed(
                f"Model {owner!r} failed in its handler {method.__name__}: {type(exc).__name__}: {exc}"
            ) from exc
        return result

    # ------------------------------------------------------------------ model repository

    async def repository_index(self, ready_only: bool = False) -> list[RepositoryIndexResponseItem]:
        """Every model version that is loaded, then those of the repository folder that are not."""
        items = self.registry.index(ready_only)
        if not ready_only:
            loaded = {(item.name, item.version) for item in items}
            found = await self._read_repository(None)
            items += [
                RepositoryIndexResponseItem(
                    name=s.name, version=s.version, state=State.UNAVAILABLE, reason="not loaded"
                )
                for s in found
                if (s.name, s.version) not in loaded
            ]
        return items

    def _authorize(self, authorization: str | None) -> None:
        """Raise Unauthenticated unless ``authorization`` (an ``Authorization`` header's value,
        ``Bearer <key>``) carries the key the repository's load and unload need."""
        if not self.settings.repository_token_auth:
            return
        key = self.repository_key
        if key is None or not key.allows(authorization):
            raise Unauthenticated(
                "Loading and unloading models needs the management key: send 'Authorization: Bearer "
                "<key>' (the key in the server's management key file; repository_token_auth=false opens them)"
            )

    async def repository_load(self, name: str, authorization: str | None = None) -> None:
        """(Re)load every version of ``name`` from its model-settings.json in the repository folder.

        A model that is loaded keeps serving until its new instance is ready (the registry swaps).
        ``authorization``: the request's ``Authorization`` value (see ``repository_token_auth``).
        """
        self._authorize(authorization)
        found = await self._read_repository(name)
        if not found:
            raise ModelNotFound(name)
        for model_settings in found:
            entry = await self.registry.load(model_settings)
            if entry.state is State.UNAVAILABLE:
                raise ModelFailed(f"Model {name!r} could not be loaded: {entry.reason}")
        self.unreadable.discard(name)

    async def repository_unload(self, name: str, authorization: str | None = None) -> None:
        """Unload every version of ``name``; ModelNotFound when none is loaded.

        Strict readiness stops waiting for it: the model was asked to leave. ``authorization``: as
        for :meth:`repository_load`.
        """
        self._authorize(authorization)
        await self.registry.unload(name)
        self.forget(name)

    async def _read_repository(self, name: str | None) -> list[ModelSettings]:
        root = self.settings.model_repository_root
        try:
            return await asyncio.to_thread(settings_in_repository, root, name)
        except RepositoryError as exc:
            raise ModelFailed(f"Cannot read the model repository: {relative_paths(str(exc), root)}") from exc
