"""Which tests need more than this process: the ``server`` marker, set at collection.

A test is marked ``server`` when it, or a fixture it uses (fixtures of fixtures included), starts
another process or a real server: a subprocess, a server on a port (``start_server``,
``launch_server``, ``serving``), a worker pool, redis-server, a gRPC server. The test suite's
helpers that they call are followed: a function or class of ``tests/`` that does one of those
makes its callers do it too. A test that starts one only through its settings (``workers``) or a
parameter says so itself (``pytest.mark.server``). What is left runs in this process (the
in-process ASGI app, the schedulers, codecs, types) and is the fast loop: ``./scripts/test
--fast`` runs ``-m "not server"``.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from types import FunctionType, ModuleType
from typing import Any

import pytest

# calls that start another process or listen on a port
_STARTS = re.compile(
    r"\b(start_server|start_servers|launch_server|serving|subprocess\.\w+|Popen|create_subprocess_exec"
    r"|grpc\.aio\.server|GrpcServer|WorkerPool|WorkerProcess|WorkerExecutor|redis_server|start_redis|uvicorn\.Server|serve_in_thread"
    r"|run_server|_server_process|Pool|Process)\s*\("
)
# the names a piece of code calls: ``name(`` and ``module.name(``
_CALLS = re.compile(r"\b(?:([A-Za-z_]\w*)\.)?([A-Za-z_]\w*)\s*\(")


@cache
def _starts_something(source: str) -> bool:
    return _STARTS.search(source) is not None


@cache
def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _own(obj: Any) -> bool:
    """Whether ``obj`` is a function or class of the test suite (whose code is followed)."""
    return isinstance(obj, (FunctionType, type)) and getattr(obj, "__module__", "").startswith("tests")


def _called(function: Any, source: str) -> list[Any]:
    """The suite's functions and classes that ``source`` (``function``'s) calls by name."""
    names = getattr(inspect.unwrap(function), "__globals__", None) or {}
    found = []
    for owner, name in _CALLS.findall(source):
        target = names.get(owner) if owner else names.get(name)
        if owner:
            target = getattr(target, name, None) if isinstance(target, (ModuleType, type)) else None
        if target is not None and _own(target):
            found.append(target)
    return found


@cache
def _starts(function: Any) -> bool:
    """Whether ``function`` (or a class), or a suite helper it calls, starts a process or server."""
    seen: set[Any] = set()
    todo = [function]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        source = _source(current)
        if _starts_something(source):
            return True
        if isinstance(current, type):
            todo.extend(v for v in vars(current).values() if isinstance(v, FunctionType))
        todo.extend(_called(current, source))
    return False


def needs_more_than_this_process(item: pytest.Item) -> bool:
    """Whether the test's own body or any fixture it uses starts a process or a server."""
    function = getattr(item, "function", None)
    if function is not None and _starts(function):
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for definitions in info.name2fixturedefs.values():
        for definition in definitions:
            if _starts(definition.func):
                return True
    return False


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_more_than_this_process(item):
            item.add_marker(pytest.mark.server)
