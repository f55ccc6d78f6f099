"""The REST application: every route (unary, streams, repository) and the error handlers, on Starlette."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from ..dataplane import DataPlane
from ..errors import ServerError
from ..kserve.v1 import KServeV1
from ..torchserve.rest import TorchServeRest
from .app import RestApi, _http_error, _server_error, _unexpected
from .repository import repository_routes
from .sse_routes import StreamingApi


def create_app(dataplane: DataPlane, extra_routes: list[BaseRoute] | None = None) -> Starlette:
    """The ASGI application serving the OIP REST API over ``dataplane``."""
    api = RestApi(dataplane)
    return Starlette(
        routes=api.routes()
        + StreamingApi(api).routes()
        + repository_routes(dataplane)
        + TorchServeRest(dataplane).routes()
        + KServeV1(dataplane).routes()
        + (extra_routes or []),
        exception_handlers={
            ServerError: _server_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
