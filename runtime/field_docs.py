"""Fields documented by the string literal under them, read from one parse of their module.

pydantic's ``use_attribute_docstrings`` does the same for each class it builds, but finds the
class's source through ``inspect.getmodule`` on every frame of the call stack, which resolves the
real path of every module imported so far: for the four settings classes, 9 % of the echo server's
instructions from start to ready (50 to 100 ms of wall time, the more the more modules are
imported first). Here each module's source is parsed once.

A class that uses :func:`documented` declares ``defer_build=True`` (its schema must be built after
the descriptions are set, or the JSON Schema misses them) instead of ``use_attribute_docstrings``;
the decorator then sets ``use_attribute_docstrings=True`` and ``defer_build=False`` in its config,
so that subclasses (a user's ``ModelSettings`` subclass) inherit what the class declared before:
their own attribute docstrings read by pydantic, and a schema built at once.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import sys
from typing import TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


def documented(cls: type[M]) -> type[M]:
    """Set the description of each field of ``cls`` that has none from the string literal right
    under its annotation in the class body (what ``use_attribute_docstrings`` reads); then
    restore ``use_attribute_docstrings=True`` and ``defer_build=False`` in its config for
    subclasses."""
    docs = _module_docs(getattr(sys.modules.get(cls.__module__), "__file__", None)).get(cls.__qualname__, {})
    for name, field in cls.model_fields.items():
        if field.description is None and name in docs:
            field.description = docs[name]
    cls.model_config["use_attribute_docstrings"] = True
    cls.model_config["defer_build"] = False
    return cls


@functools.cache
def _module_docs(path: str | None) -> dict[str, dict[str, str]]:
    """Attribute docstrings of the top-level classes of the module at ``path``, by class name
    (none when its source cannot be read, as pydantic does)."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}
    return {node.name: attribute_docstrings(node) for node in tree.body if isinstance(node, ast.ClassDef)}


def attribute_docstrings(node: ast.ClassDef) -> dict[str, str]:
    """``{name: docstring}`` for each ``name: annotation [= value]`` of the class body directly
    followed by a string literal (cleaned as ``inspect.cleandoc`` does)."""
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(node.body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs
