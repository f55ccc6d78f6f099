"""``@custom_handler``: a model's own methods served as extra REST routes (MLServer's ``mlserver.handlers``).

    class Explainer(MLModel):
        @custom_handler(rest_path="/explain", rest_method="POST")
        async def explain(self, payload: dict) -> dict:
            ...

While the model is loaded and ready, ``POST /explain`` calls ``explain`` with the request's JSON
body and answers its return value as JSON (``runtime.frontends.rest.custom_routes`` translates). The path is
the server's, not under ``/v2/models/...``, as in MLServer; two ready models claiming the same
method and path: the first loaded answers. The decorator only marks the method: it is neither
wrapped nor replaced.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

ATTRIBUTE = "__custom_handler__"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class CustomHandler:
    """Where a model's method is served: an HTTP method and an absolute path."""

    rest_path: str
    rest_method: str = "POST"


def custom_handler(rest_path: str, rest_method: str = "POST") -> Callable[[F], F]:
    """Serve the decorated method at ``rest_method rest_path`` while its model is ready."""
    if not rest_path.startswith("/"):
        raise ValueError(f"custom_handler: rest_path must start with '/', got {rest_path!r}")
    handler = CustomHandler(rest_path=rest_path, rest_method=rest_method.upper())

    def mark(method: F) -> F:
        setattr(method, ATTRIBUTE, handler)
        return method

    return mark


def get_custom_handlers(model: object) -> list[tuple[CustomHandler, Callable[..., Any]]]:
    """The marked methods of ``model`` (bound), with where each is served."""
    found = []
    cls = type(model)
    for name in dir(cls):
        handler = getattr(inspect.getattr_static(cls, name), ATTRIBUTE, None)
        if isinstance(handler, CustomHandler):
            found.append((handler, getattr(model, name)))
    return found
