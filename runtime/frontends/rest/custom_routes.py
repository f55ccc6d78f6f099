"""The REST side of ``@custom_handler``: a model's marked methods answered at their own paths.

One route, last in the app, asks the data plane which ready model's method serves the request's
method and path (``DataPlane.custom_handler``), and translates: the method's parameters are filled
from the request (one annotated ``starlette.requests.Request`` gets the request itself; a single
other parameter gets the JSON body, ``None`` when there is none; several get the fields of a JSON
object body by name, and query parameters fill those the body does not), and its return value is
answered as JSON (a Starlette ``Response`` is sent as is). Errors of the error tree are answered
by the app's one table; a body that is not JSON, or that lacks a parameter with no default, is 400.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import Receive, Scope, Send

from runtime.core.dataplane import DataPlane
from runtime.errors import InvalidInput
from runtime.frontends.rest.app import json_response, read_body

MAX_BODY = 64 * 1024 * 1024


class CustomHandlerRoutes(BaseRoute):
    """Matches a request when a ready model's ``@custom_handler`` method serves its method and path."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http":
            return Match.NONE, {}
        method = self.dataplane.custom_handler(scope["method"], scope["path"])
        if method is None:
            return Match.NONE, {}
        return Match.FULL, {"endpoint": method, "path_params": {}}

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        from starlette.routing import NoMatchFound

        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        method = scope["endpoint"]
        result = await self.dataplane.call_handler(method, await _arguments(method, request))
        response = result if isinstance(result, Response) else json_response(result)
        await response(scope, receive, send)


async def _arguments(method: Callable[..., Any], request: Request) -> dict[str, Any]:
    try:
        hints = get_type_hints(method)
    except Exception:
        hints = {}
    parameters = [
        p
        for p in inspect.signature(method).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    arguments: dict[str, Any] = {}
    rest = []
    for parameter in parameters:
        hint = hints.get(parameter.name, parameter.annotation)
        if hint is Request or hint == "Request":
            arguments[parameter.name] = request
        else:
            rest.append(parameter)
    if not rest:
        return arguments
    body = await read_body(request, MAX_BODY)
    try:
        document = orjson.loads(body) if body.strip() else None
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"The body of {request.method} {request.url.path} is not JSON: {exc}") from None
    if len(rest) == 1 and (document is not None or rest[0].name not in request.query_params):
        arguments[rest[0].name] = document
        return arguments
    fields = document if isinstance(document, dict) else {}
    for parameter in rest:
        if parameter.name in fields:
            arguments[parameter.name] = fields[parameter.name]
        elif parameter.name in request.query_params:
            arguments[parameter.name] = request.query_params[parameter.name]
        elif parameter.default is inspect.Parameter.empty:
            raise InvalidInput(
                f"{request.method} {request.url.path} needs {parameter.name!r} (in a JSON object body)"
            )
    return arguments
