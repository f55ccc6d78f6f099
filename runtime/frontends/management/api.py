"""The management REST front end, in TorchServe's shape, on its own port.

Routes (``name`` a model, ``version`` one of its versions)::

    GET    /models?limit=L&next_page_token=T          list (by name, pages of at most 100)
    GET    /models/{name}[/{version}|/all]            describe
    POST   /models?url=U&model_name=&initial_workers=&synchronous=   register a folder or archive
    PUT    /models/{name}[/{version}]?min_worker=N&max_worker=M&synchronous=   scale
    PUT    /models/{name}/{version}/set-default       make a version the default
    DELETE /models/{name}[/{version}]                 unregister (its workers drain)

It only translates: query strings and JSON bodies to :class:`~.operations.Management` calls, core
errors to TorchServe's ``{"code", "type", "message"}`` through the TorchServe front ends' one table
(``runtime.frontends.torchserve.error_body``). Every request needs
``Authorization: Bearer <key>`` unless token authorization is off.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime import errors
from runtime.core.management import Management, default_set, scaled, unregistered
from runtime.core.management_key import AUTH_FAILED, ManagementKey
from runtime.frontends.torchserve.error_body import describe

logger = logging.getLogger(__name__)


def _answer(document: Any, status: int = 200) -> Response:
    return Response(json.dumps(document, indent=2) + "\n", status_code=status, media_type="application/json")


def _error(status: int, kind: str, message: str) -> Response:
    return _answer({"code": status, "type": kind, "message": message}, status)


def error_body(exc: errors.ServerError) -> Response:
    return _error(*describe(exc))


def _int(request: Request, name: str, body: dict[str, Any], default: int | None = None) -> int | None:
    value = request.query_params.get(name, body.get(name))
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise errors.InvalidInput(f"Parameter {name} must be an integer, not {value!r}") from None


def _bool(request: Request, name: str, body: dict[str, Any], default: bool) -> bool:
    value = request.query_params.get(name, body.get(name))
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise errors.InvalidInput(f"Parameter {name} must be true or false, not {value!r}")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        document = json.loads(raw)
    except ValueError:
        raise errors.InvalidInput("The body must be a JSON object") from None
    if not isinstance(document, dict):
        raise errors.InvalidInput("The body must be a JSON object")
    return document


Handler = Callable[[Request], Awaitable[Response]]


class ManagementApi:
    """The routes of the management API over one :class:`Management`."""

    def __init__(self, management: Management, key: ManagementKey | None) -> None:
        self.management = management
        self.key = key

    def _route(self, handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except errors.ServerError as exc:
                return error_body(exc)

        return endpoint

    async def list_models(self, request: Request) -> Response:
        body: dict[str, Any] = {}
        limit = _int(request, "limit", body, 100) or 100
        token = _int(request, "next_page_token", body, 0) or 0
        return _answer(self.management.list_models(limit, token))

    async def describe(self, request: Request) -> Response:
        name = request.path_params["model_name"]
        version = request.path_params.get("model_version")
        every = version == "all"
        return _answer(self.management.describe(name, None if every else version, every))

    async def register(self, request: Request) -> Response:
        body = await _body(request)
        url = request.query_params.get("url", body.get("url", ""))
        name = request.query_params.get("model_name", body.get("model_name")) or None
        workers = _int(request, "initial_workers", body)
        synchronous = _bool(request, "synchronous", body, False)
        done = await self.management.register(str(url or ""), name, workers, synchronous)
        return _answer({"status": done.status()}, 200 if synchronous else 202)

    async def scale(self, request: Request) -> Response:
        name = request.path_params["model_name"]
        version = request.path_params.get("model_version")
        body = await _body(request)
        min_worker = _int(request, "min_worker", body, 1)
        max_worker = _int(request, "max_worker", body)
        synchronous = _bool(request, "synchronous", body, False)
        assert min_worker is not None
        count = await self.management.scale(name, version, min_worker, max_worker, synchronous)
        return _answer({"status": scaled(name, version, count, synchronous)}, 200 if synchronous else 202)

    async def set_default(self, request: Request) -> Response:
        name, version = request.path_params["model_name"], request.path_params["model_version"]
        self.management.set_default(name, version)
        return _answer({"status": default_set(name, version)})

    async def unregister(self, request: Request) -> Response:
        name = request.path_params["model_name"]
        version = request.path_params.get("model_version")
        await self.management.unregister(name, version)
        return _answer({"status": unregistered(name, version)})

    def app(self) -> ASGIApp:
        r = self._route
        routes = [
            Route("/models", r(self.list_models), methods=["GET"]),
            Route("/models", r(self.register), methods=["POST"]),
            Route("/models/{model_name}", r(self.describe), methods=["GET"]),
            Route("/models/{model_name}", r(self.scale), methods=["PUT"]),
            Route("/models/{model_name}", r(self.unregister), methods=["DELETE"]),
            Route("/models/{model_name}/{model_version}/set-default", r(self.set_default), methods=["PUT"]),
            Route("/models/{model_name}/{model_version}", r(self.describe), methods=["GET"]),
            Route("/models/{model_name}/{model_version}", r(self.scale), methods=["PUT"]),
            Route("/models/{model_name}/{model_version}", r(self.unregister), methods=["DELETE"]),
        ]

        async def not_found(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            if exc.status_code == 405:
                return _error(405, "MethodNotAllowedException", "Requested method is not allowed")
            return _error(404, "ResourceNotFoundException", "Requested resource is not found")

        starlette = Starlette(routes=routes, exception_handlers={HTTPException: not_found})
        return _Authorized(starlette, self.key)


class _Authorized:
    """Refuses (400, as TorchServe) every request without the management key."""

    def __init__(self, app: ASGIApp, key: ManagementKey | None) -> None:
        self.inner = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.key is not None:
            headers = dict(scope.get("headers") or [])
            authorization = headers.get(b"authorization")
            if not self.key.allows(authorization.decode("latin-1") if authorization else None):
                await _error(400, "InvalidKeyException", AUTH_FAILED)(scope, receive, send)
                return
        await self.inner(scope, receive, send)


def create_management_app(management: Management, key: ManagementKey | None) -> ASGIApp:
    return ManagementApi(management, key).app()
