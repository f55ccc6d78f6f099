"""Which tests need more than this process: the ``server`` marker, set at collection.

A test is marked ``server`` when it, or a fixture it uses (fixtures of fixtures included), starts
another process or a real server: a subprocess, a server on a port (``start_server``,
``launch_server``, ``serving``), a worker pool, redis-server, a gRPC server. What is left runs in
this process (the in-process ASGI app, the schedulers, codecs, types) and is the fast loop:
``./scripts/test --fast`` runs ``-m "not server"``.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import Any

import pytest

# calls that start another process or listen on a port
_STARTS = re.compile(
    r"\b(start_server|start_servers|launch_server|serving|subprocess\.\w+|Popen|create_subprocess_exec"
    r"|grpc\.aio\.server|GrpcServer|WorkerPool|WorkerProcess|WorkerExecutor|redis_server|start_redis|uvicorn\.Server|serve_in_thread"
    r"|run_server|_server_process)\s*\("
)


@cache
def _starts_something(source: str) -> bool:
    return _STARTS.search(source) is not None


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def needs_more_than_this_process(item: pytest.Item) -> bool:
    """Whether the test's own body or any fixture it uses starts a process or a server."""
    function = getattr(item, "function", None)
    if function is not None and _starts_something(_source(function)):
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for definitions in info.name2fixturedefs.values():
        for definition in definitions:
            if _starts_something(_source(definition.func)):
                return True
    return False


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_more_than_this_process(item):
            item.add_marker(pytest.mark.server)
