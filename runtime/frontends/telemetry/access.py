"""The transports' entry: per-request counts, the access log and the request's span.

One ASGI wrapper for REST (:class:`ObservedApp`), which sees every request once, from arrival to
the end of its response (a stream's end, for SSE), and what the access log writes for every
transport (:func:`log_access`, :func:`trace_id_of`); gRPC's calls are observed in
:mod:`.grpc_access`. They observe only: statuses, bodies and errors are the transports' own.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.ids import new_id
from runtime.telemetry.counts import DURATION_BUCKETS, Histogram, Recorder

if TYPE_CHECKING:
    from runtime.telemetry.tracing import Tracing

access_logger = logging.getLogger("runtime.access")

REQUEST_ID = "x-request-id"
SEQUENCE_HEADER = b"ts_request_sequence_id"
UNMATCHED = "<unmatched>"


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (version-traceid-parentid-flags), if well formed."""
    if not traceparent:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1].lower()


def log_access(
    transport: str,
    route: str,
    model: str | None,
    version: str | None,
    status: int | str,
    seconds: float,
    request_id: str | None,
    sequence_id: str | None,
    trace_id: str | None,
) -> None:
    duration_ms = round(seconds * 1000, 3)
    access_logger.info(
        "%s %s %s %.3fms",
        transport,
        route,
        status,
        duration_ms,
        extra={
            "transport": transport,
            "route": route,
            "model": model,
            "version": version,
            "status": status,
            "duration_ms": duration_ms,
            "request_id": request_id,
            "sequence_id": sequence_id,
            "trace_id": trace_id,
        },
    )


_ROUTES: dict[str, str] = {}
_ROUTES_KEPT = 4096  # paths whose template is remembered (paths name models: a bounded set, mostly)


def route_of(scope: dict[str, Any]) -> str:
    """The route's template (``/v2/models/{model_name}/infer``): a bounded label, unlike the path."""
    if "endpoint" not in scope:
        return UNMATCHED
    path: str = scope["path"]
    route = _ROUTES.get(path)
    if route is not None:
        return route
    params: dict[str, Any] = scope.get("path_params") or {}
    found = _template(scope, path, params) if params else None
    if found is not None:
        route = found
    elif params:
        # not a route of the scope's router (one inside a Mount): the path with each parameter's
        # value named (a value that is also a literal segment of the route is named too)
        head, tail = path, ""
        for name, value in params.items():  # a {name:path} parameter holds several segments
            text = str(value)
            if "/" in text and path.endswith("/" + text):
                head, tail = path[: -len(text) - 1], "/{" + name + "}"
                break
        values = {str(v): k for k, v in params.items()}
        route = "/".join("{" + values[s] + "}" if s in values else s for s in head.split("/")) + tail
    else:
        route = path
    if len(_ROUTES) < _ROUTES_KEPT:
        _ROUTES[path] = route
    return route


def _template(scope: dict[str, Any], path: str, params: dict[str, Any]) -> str | None:
    """The path with each parameter's part replaced by its name, where the route that matched is
    one of the scope's router's (None otherwise): the parameters' places come from the route's
    own pattern, so a model named like a literal segment (``infer``) does not change the label."""
    endpoint = scope.get("endpoint")
    root = scope.get("root_path") or ""
    relative = path[len(root) :] if root and path.startswith(root) else path
    for candidate in getattr(scope.get("router"), "routes", ()):
        if getattr(candidate, "endpoint", None) is not endpoint:
            continue
        pattern = getattr(candidate, "path_regex", None)
        match = pattern.match(relative) if pattern is not None else None
        if match is None or match.groupdict().keys() != params.keys():
            continue
        route = relative
        for name in sorted(params, key=match.start, reverse=True):
            route = route[: match.start(name)] + "{" + name + "}" + route[match.end(name) :]
        return path[: len(path) - len(relative)] + route
    return None


def route_counter(recorder: Recorder) -> Callable[[str, str], Callable[[int, float], None]]:
    """For an app that reports its requests itself (``RestApp.count_requests``): what gives, for a
    method and route template, what counts one answered request of it into ``recorder`` (by
    status; each status's histogram found once)."""

    def counter(method: str, route: str) -> Callable[[int, float], None]:
        histograms: dict[int, Histogram] = {}

        def count(status: int, seconds: float) -> None:
            histogram = histograms.get(status)
            if histogram is None:
                histogram = histograms[status] = recorder.rest_histogram(method, route, status)
            histogram.counts[bisect_left(DURATION_BUCKETS, seconds)] += 1
            histogram.sum += seconds

        return count

    return counter


class ObservedApp:
    """Wraps the REST app: counts every request, logs it, traces it."""

    def __init__(
        self, app: Any, recorder: Recorder | None, access_log: bool, tracing: Tracing | None
    ) -> None:
        self.app = app
        self.recorder = recorder
        self.access_log = access_log
        self.tracing = tracing

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets when the app fails before it answers
        sequence_id: str | None = None

        async def observed_send(message: dict[str, Any]) -> None:
            nonlocal status, sequence_id
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name == SEQUENCE_HEADER:
                        sequence_id = value.decode("latin-1")
            await send(message)

        headers: dict[bytes, bytes] | None = None
        if self.access_log or self.tracing is not None:
            headers = dict(scope["headers"])
        span = None
        if self.tracing is not None and headers is not None:
            traceparent = headers.get(b"traceparent")
            span = self.tracing.server_span(
                f"{scope['method']} {scope['path']}",
                {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()},
                {"http.request.method": scope["method"], "url.path": scope["path"], "rpc.system": "http"},
            )
            del traceparent
        try:
            await self.app(scope, receive, observed_send)
        finally:
            seconds = time.perf_counter() - start
            route = route_of(scope)
            if span is not None:
                span.finish(route=f"{scope['method']} {route}", status=status, error=status >= 500)
            if self.recorder is not None:
                self.recorder.rest_request(scope["method"], route, status, seconds)
            if self.access_log and headers is not None:
                params = scope.get("path_params") or {}
                request_id = headers.get(REQUEST_ID.encode())
                trace_id = (
                    span.trace_id if span is not None else trace_id_of(_text(headers.get(b"traceparent")))
                )
                log_access(
                    "rest",
                    f"{scope['method']} {route}",
                    params.get("model_name"),
                    params.get("model_version"),
                    status,
                    seconds,
                    request_id.decode("latin-1") if request_id else new_id(),
                    sequence_id,
                    trace_id,
                )


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None
