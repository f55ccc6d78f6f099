"""The REST application: every route (unary, streams, repository) and the error handlers, on Starlette.

``POST /v2/models/{model_name}[/versions/{model_version}]/infer``, the hot path, goes from the
app straight to its handler: the path is split, not matched against every route's regex, and the
two middlewares Starlette puts before the router (one per error handler) are replaced by one
``try``. What the request sees is the same: the scope gets the ``app``, ``router``, ``endpoint``
and ``path_params`` the router would have set (the access log and metrics label requests by
them), and a failure is answered by the same handler Starlette would have picked (an unexpected
one is also re-raised, as Starlette's ServerErrorMiddleware does, so that uvicorn logs it and
closes the connection). Every other request, and an infer request under a ``root_path``, goes
through Starlette as usual. TorchServe's ``POST|PUT /predictions/{model_name}[/{model_version}]``,
its users' hot path, is dispatched the same way. When the metrics alone watch requests, these
requests are counted here too (:meth:`RestApp.count_requests`), rather than through a wrapper
around the whole app.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.core.dataplane import DataPlane
from runtime.errors import ServerError
from runtime.frontends.docs.pages import docs_routes
from runtime.frontends.kserve.v1 import KServeV1
from runtime.frontends.mlflow.scoring import MLflowScoring
from runtime.frontends.openai.openai_routes import OpenAIApi
from runtime.frontends.rest.app import RestApi, _http_error, _server_error, _unexpected
from runtime.frontends.rest.custom_routes import CustomHandlerRoutes
from runtime.frontends.rest.middleware import wants_middleware, with_middleware
from runtime.frontends.rest.repository_routes import repository_routes
from runtime.frontends.rest.sse_routes import StreamingApi
from runtime.frontends.torchserve.rest_api import TorchServeRest
from runtime.settings import Settings

_PREFIX = "/v2/models/"
_SUFFIX = "/infer"
_TS_PREFIX = "/predictions/"  # TorchServe's inference route, the hot path of its users
_TS_MODEL = "/predictions/{model_name}"
_TS_VERSIONED = "/predictions/{model_name}/{model_version}"
_INFER = "/v2/models/{model_name}/infer"
_INFER_VERSIONED = "/v2/models/{model_name}/versions/{model_version}/infer"
_INNER = "runtime.behind_middleware"  # in the scope of a request the middleware has seen

Count = Callable[[int, float], None]
"""Counts one answered request of a known route: its status and its seconds."""


class RestApp(Starlette):
    """Starlette, with infer requests dispatched straight to their handler (see the module docstring)."""

    def __init__(
        self, api: RestApi, torchserve: TorchServeRest, routes: list[BaseRoute], handlers: dict[Any, Any]
    ) -> None:
        super().__init__(routes=routes, exception_handlers=handlers)
        self._api = api
        self._torchserve = torchserve
        infer = [r for r in routes if isinstance(r, Route) and r.path.endswith(_SUFFIX)]
        self._endpoint, self._versioned_endpoint = infer[0].endpoint, infer[1].endpoint
        predictions = {r.path: r.endpoint for r in routes if isinstance(r, Route)}
        self._predictions = predictions[_TS_MODEL], predictions[_TS_VERSIONED]
        self._handled = {k: v for k, v in handlers.items() if k is not Exception}
        self._infer_count: Count | None = None
        self._versioned_count: Count | None = None
        self._ts_counts: dict[tuple[str, str], Count] = {}
        self._other: ASGIApp = super().__call__
        self._middleware: ASGIApp | None = None
        self._cors = False

    def use_middleware(self, settings: Settings) -> None:
        """Put the CORS and gzip middleware that ``settings`` turn on before every route (see
        runtime/frontends/rest/middleware.py); a request they have nothing to do with skips them."""
        self._middleware = with_middleware(_Inner(self), settings)
        self._cors = settings.cors_settings is not None

    def count_requests(
        self, counter: Callable[[str, str], Count], wrap: Callable[[ASGIApp], ASGIApp]
    ) -> None:
        """Count every request (the metrics alone: no access log, no traces): a directly dispatched
        request by its route's ``counter(method, route)`` once it is answered, here, with no
        wrapper around the hot path; every other request through ``wrap(app)``."""
        self._infer_count = counter("POST", _INFER)
        self._versioned_count = counter("POST", _INFER_VERSIONED)
        self._ts_counts = {
            (method, route): counter(method, route)
            for method in ("POST", "PUT")
            for route in (_TS_MODEL, _TS_VERSIONED)
        }
        self._other = wrap(self._other)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        middleware = self._middleware
        if (
            middleware is not None
            and _INNER not in scope
            and scope["type"] == "http"
            and wants_middleware(scope["headers"], self._cors)
        ):
            scope[_INNER] = True
            await middleware(scope, receive, send)
            return
        if scope["type"] == "http" and not scope.get("root_path"):
            method, path = scope["method"], scope["path"]
            if method == "POST" and path.startswith(_PREFIX) and path.endswith(_SUFFIX):
                parts = path[len(_PREFIX) : -len(_SUFFIX)].split("/")
                if len(parts) == 1 and parts[0]:
                    endpoint, params, count = self._endpoint, {"model_name": parts[0]}, self._infer_count
                elif len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
                    endpoint, count = self._versioned_endpoint, self._versioned_count
                    params = {"model_name": parts[0], "model_version": parts[2]}
                else:
                    endpoint = None
                if endpoint is not None:  # the OIP's infer, answered here (no coroutine of its own)
                    self._routed(scope, endpoint, params)
                    began = perf_counter() if count is not None else 0.0
                    status = 500  # what the client gets when answering fails before the response starts
                    try:
                        try:
                            start, body = await self._api.answer(scope, receive)
                        except Exception as exc:
                            status = await self._failed(scope, receive, send, exc)
                            return
                        status = start["status"]
                        await send(start)
                        await send(body)
                    finally:
                        if count is not None:
                            count(status, perf_counter() - began)
                    return
            elif method in ("POST", "PUT") and path.startswith(_TS_PREFIX):  # `curl -T` sends a PUT
                parts = path[len(_TS_PREFIX) :].split("/")
                if len(parts) == 1 and parts[0]:
                    self._routed(scope, self._predictions[0], {"model_name": parts[0]})
                    await self._prediction(scope, receive, send, self._ts_counts.get((method, _TS_MODEL)))
                    return
                if len(parts) == 2 and parts[0] and parts[1]:
                    params = {"model_name": parts[0], "model_version": parts[1]}
                    self._routed(scope, self._predictions[1], params)
                    await self._prediction(scope, receive, send, self._ts_counts.get((method, _TS_VERSIONED)))
                    return
        await self._other(scope, receive, send)

    def _routed(self, scope: Scope, endpoint: Any, params: dict[str, str]) -> None:
        """Give ``scope`` what Starlette's router would have (the access log and metrics read it)."""
        scope["app"] = self
        scope.setdefault("router", self.router)
        scope["endpoint"] = endpoint
        scope["path_params"] = params

    async def _prediction(self, scope: Scope, receive: Receive, send: Send, count: Count | None) -> None:
        """TorchServe's ``/predictions/{model_name}[/{model_version}]``, straight to its handler as
        an infer request is (a longer path, with segments for the handler, goes through the router)."""
        began = perf_counter() if count is not None else 0.0
        status: list[int] = []  # the status sent, once sent
        try:
            try:
                await self._torchserve.predictions(scope, receive, send, status=status)
            except Exception as exc:
                if status:  # the answer has started: nothing more can be sent
                    raise
                status.append(await self._failed(scope, receive, send, exc))
        finally:
            if count is not None:
                count(status[0] if status else 500, perf_counter() - began)

    async def _failed(self, scope: Scope, receive: Receive, send: Send, exc: Exception) -> int:
        """Answer ``exc`` as Starlette's two error middlewares would (nothing was sent yet); return
        the status sent."""
        request = Request(scope, receive, send)
        for cls in type(exc).__mro__:
            handler = self._handled.get(cls)
            if handler is not None:
                response = await handler(request, exc)
                await response(scope, receive, send)
                status: int = response.status_code
                return status
        await (await _unexpected(request, exc))(scope, receive, send)
        raise exc


class _Inner:
    """The app behind the middleware: the RestApp itself, told by the scope that it is behind it."""

    __slots__ = ("app",)

    def __init__(self, app: RestApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def create_app(dataplane: DataPlane, extra_routes: list[BaseRoute] | None = None) -> Starlette:
    """The ASGI application serving the OIP REST API over ``dataplane``."""
    api = RestApi(dataplane)
    torchserve = TorchServeRest(dataplane)
    oip = api.routes()
    # the two OIP infer routes first (RestApp finds them by their suffix and dispatches them
    # straight), then TorchServe's, KServe's and the OpenAI API's inference routes, then everything else
    hot, other = oip[:2], oip[2:]
    app = RestApp(
        api,
        torchserve,
        hot
        + torchserve.routes()
        + KServeV1(dataplane).routes()
        + OpenAIApi(dataplane).routes()
        + docs_routes(dataplane)
        + other
        + StreamingApi(api).routes()
        + repository_routes(dataplane)
        + MLflowScoring(dataplane).routes()
        + (extra_routes or [])
        + [CustomHandlerRoutes(dataplane)],  # models' @custom_handler methods, after every fixed route
        {ServerError: _server_error, HTTPException: _http_error, Exception: _unexpected},
    )
    app.use_middleware(dataplane.settings)
    return app
