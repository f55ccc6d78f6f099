"""The REST application: every route (unary, streams, repository) and the error handlers, on Starlette."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute

from ..dataplane import DataPlane
from ..errors import ServerError
from ..kserve.v1 import KServeV1
from ..torchserve.rest_api import TorchServeRest
from .app import RestApi, _http_error, _server_error, _unexpected
from .repository_routes import repository_routes
from .sse_routes import StreamingApi


def create_app(dataplane: DataPlane, extra_routes: list[BaseRoute] | None = None) -> Starlette:
    """The ASGI application serving the OIP REST API over ``dataplane``."""
    api = RestApi(dataplane)
    oip = api.routes()
    # Starlette tries routes in order: the hot paths first, OIP's two infer routes (RestApi.routes
    # puts them first) then TorchServe's and KServe's inference routes, then everything else
    hot, other = oip[:2], oip[2:]
    return Starlette(
        routes=hot
        + TorchServeRest(dataplane).routes()
        + KServeV1(dataplane).routes()
        + other
        + StreamingApi(api).routes()
        + repository_routes(dataplane)
        + (extra_routes or []),
        exception_handlers={
            ServerError: _server_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
