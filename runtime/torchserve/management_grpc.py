"""TorchServe's gRPC management API (``org.pytorch.serve.grpc.management.ManagementAPIsService``):
every call answers ``ManagementResponse{msg}``, ``msg`` being what TorchServe's management REST API
answers (a JSON document, or a status sentence).

- ``ListModels``: ``{"models": [{"modelName", "modelUrl"}], "nextPageToken"?}`` by name, ``limit``
  per page (0, unset: none, as TorchServe answers), ``next_page_token`` the offset.
- ``DescribeModel``: the list TorchServe describes a model with (its settings, one worker: models
  run in this process); unknown model: NOT_FOUND.
- ``RegisterModel``: ``url`` names a ``.mar`` (or an unpacked archive folder) in the model store (the
  server's model folder) or a path; it is loaded as at startup. Already loaded: ALREADY_EXISTS
  (TorchServe's 409). URLs of remote archives are refused (nothing is downloaded).
- ``UnregisterModel``: unloads the model (one version, or all of them).
- ``ScaleWorker`` and ``SetDefault``: the management core operations (``runtime.management``), as
  the management REST API calls them: worker processes for the model (zero fields are TorchServe's
  defaults: ``min_worker`` 1, ``max_worker`` = ``min_worker``), and its default version.

Token authorization (TorchServe 0.11.1+): with the management key on (``management_token_auth``,
the default), every call must carry the metadata ``authorization: Bearer <key>``, the key the
management REST API takes (the same key file); without it the call is refused with
PERMISSION_DENIED and TorchServe's sentence, before the method runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from ..dataplane import DataPlane
from ..errors import InvalidInput, ModelNotFound
from ..grpc.generated import ts_management_pb2 as pb
from ..management import Management, ManagementKey
from ..management.api import AUTH_FAILED
from ..registry import ModelEntry
from ..types import State
from .archive import ArchiveError, archive_settings

SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"
_STARTED = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def _torchserve(entry: ModelEntry) -> dict[str, Any]:
    extra = entry.settings.parameters.extra if entry.settings.parameters else {}
    found = extra.get("torchserve") if isinstance(extra, dict) else None
    return found if isinstance(found, dict) else {}


def model_url(entry: ModelEntry) -> str:
    archive = _torchserve(entry).get("archive")
    return Path(archive).name if archive else ""


def describe_entry(entry: ModelEntry) -> dict[str, Any]:
    """One model version as TorchServe's describe call shows it."""
    settings = entry.settings
    config = _torchserve(entry).get("config") or {}
    batch = max(settings.max_batch_size, 1)
    return {
        "modelName": entry.name,
        "modelVersion": entry.version or "",
        "modelUrl": model_url(entry),
        "runtime": "python",
        "minWorkers": config.get("minWorkers", 1),
        "maxWorkers": config.get("maxWorkers", 1),
        "batchSize": batch,
        "maxBatchDelay": int(settings.max_batch_time * 1000)
        if batch > 1
        else config.get("maxBatchDelay", 100),
        "responseTimeout": config.get("responseTimeout", 120),
        "startupTimeout": config.get("startupTimeout", 120),
        "maxRetryTimeoutInSec": config.get("maxRetryTimeoutInSec", 300),
        "clientTimeoutInMills": config.get("clientTimeoutInMills", 0),
        "parallelType": config.get("parallelType", ""),
        "parallelLevel": config.get("parallelLevel", 0),
        "deviceType": config.get("deviceType", "cpu"),
        "continuousBatching": settings.continuous_batching,
        "useJobTicket": bool(config.get("useJobTicket", False)),
        "useVenv": bool(config.get("useVenv", False)),
        "stateful": settings.sequence_batching,
        "sequenceMaxIdleMSec": settings.max_sequence_idle_ms if settings.sequence_batching else 0,
        "sequenceTimeoutMSec": settings.sequence_timeout_ms,
        "maxNumSequence": settings.max_sequences if settings.sequence_batching else 0,
        "maxSequenceJobQueueSize": settings.max_sequence_queue_size if settings.sequence_batching else 0,
        "loadedAtStartup": True,
        "workers": [
            {
                "id": "9000",
                "startTime": _STARTED,
                "status": "READY" if entry.state is State.READY else entry.state.value,
                "memoryUsage": 0,
                "pid": os.getpid(),
                "gpu": False,
                "gpuUsage": "N/A",
            }
        ],
        "jobQueueStatus": {"remainingCapacity": settings.max_queue_size, "pendingRequests": 0},
    }


def _json(document: Any) -> Any:
    return pb.ManagementResponse(msg=json.dumps(document, indent=2))


class ManagementApi:
    """The ManagementAPIsService methods over one DataPlane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.ops = Management(dataplane.settings, dataplane.registry)
        """The management core operations (scale, set-default), as the management REST API uses them."""

    async def ListModels(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        entries = {e.name: e for e in sorted(self.dataplane.registry.entries(), key=lambda e: e.name)}
        names = sorted(entries)
        start = max(request.next_page_token, 0)
        page = names[start : start + max(request.limit, 0)]
        document: dict[str, Any] = {}
        if start + len(page) < len(names) and page:
            document["nextPageToken"] = str(start + len(page))
        document["models"] = [{"modelName": n, "modelUrl": model_url(entries[n])} for n in page]
        return _json(document)

    async def DescribeModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        name, version = request.model_name, request.model_version or None
        entries = [e for e in self.dataplane.registry.entries() if e.name == name]
        if version == "all":
            chosen = entries
        else:
            try:
                chosen = [self.dataplane.registry.find(name, version)]
            except ModelNotFound:
                chosen = []
        if not chosen:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {name}")
        return _json([describe_entry(e) for e in chosen])

    async def RegisterModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        url = request.url
        if not url:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Parameter url is required.")
        if "://" in url and not url.startswith("file://"):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Cannot register {url}: this server loads archives from its model store or a path only",
            )
        path = Path(url.removeprefix("file://"))
        if ".." in path.parts:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found in model store: {url}")
        if not path.is_absolute():
            path = Path(self.dataplane.settings.model_repository_root) / path
        if not path.exists():
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found in model store: {url}")
        try:
            settings = await asyncio.to_thread(archive_settings, path)
        except ArchiveError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if request.model_name:
            settings.name = request.model_name
        if any(
            e.name == settings.name and e.version == settings.version
            for e in self.dataplane.registry.entries()
        ):
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"Model version {settings.version} is already registered for model {settings.name}",
            )
        entry = await self.dataplane.registry.load(settings)
        if entry.state is State.UNAVAILABLE:
            await context.abort(
                grpc.StatusCode.INTERNAL, f"Model {settings.name!r} failed to load: {entry.reason}"
            )
        return pb.ManagementResponse(
            msg=f'Model "{settings.name}" Version: {settings.version or ""} registered with 1 initial workers'
        )

    async def UnregisterModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        name = request.model_name
        try:
            await self.dataplane.registry.unload(name, request.model_version or None)
        except ModelNotFound:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {name}")
        return pb.ManagementResponse(msg=f'Model "{name}" unregistered')

    async def ScaleWorker(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        name, version = request.model_name, request.model_version or None
        minimum = request.min_worker or 1  # zero fields are TorchServe's defaults
        maximum = request.max_worker or minimum
        try:
            count = await self.ops.scale(name, version, minimum, maximum, request.synchronous)
        except ModelNotFound:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {name}")
        except InvalidInput as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        if not request.synchronous:
            return pb.ManagementResponse(msg="Processing worker updates...")
        suffix = f", version: {version}" if version else ""
        return pb.ManagementResponse(msg=f"Workers scaled to {count} for model: {name}{suffix}")

    async def SetDefault(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        name, version = request.model_name, request.model_version
        try:
            self.ops.set_default(name, version)
        except ModelNotFound:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"Model version: {version} does not exist for model: {name}"
            )
        return pb.ManagementResponse(
            msg=f'Default version successfully updated for model "{name}" to "{version}"'
        )


Method = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


def _authorized(method: Method, key: ManagementKey) -> Method:
    """``method``, refused with PERMISSION_DENIED (as TorchServe's gRPC interceptor) unless the
    call's metadata ``authorization`` carries the key."""

    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        metadata = context.invocation_metadata() or ()
        sent = next((v for k, v in metadata if k == "authorization"), None)
        if not key.allows(sent.decode("latin-1") if isinstance(sent, bytes) else sent):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, AUTH_FAILED)
        return await method(request, context)

    return guarded


def management_handlers(
    dataplane: DataPlane, key: ManagementKey | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """The ManagementAPIsService method handlers, by method name; each needs ``key`` unless it is None."""
    api = ManagementApi(dataplane)
    requests: dict[str, Any] = {
        "ListModels": pb.ListModelsRequest,
        "DescribeModel": pb.DescribeModelRequest,
        "RegisterModel": pb.RegisterModelRequest,
        "UnregisterModel": pb.UnregisterModelRequest,
        "ScaleWorker": pb.ScaleWorkerRequest,
        "SetDefault": pb.SetDefaultRequest,
    }
    return {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(api, name) if key is None else _authorized(getattr(api, name), key),
            request_deserializer=message.FromString,
            response_serializer=pb.ManagementResponse.SerializeToString,
        )
        for name, message in requests.items()
    }
