"""The OpenAI API's errors: a bad request naming its field, and OpenAI's error document.

``{"error": {"message", "type", "param", "code"}}``: ``type`` from the status (which the REST
transport's table gives), ``param`` the request field a bad request concerns, ``code``
``model_not_found`` for an unknown model.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import InvalidInput, ModelNotFound, ServerError


class OpenAIError(InvalidInput):
    """A bad request, with the request field it concerns (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_body(exc: ServerError, status: int) -> dict[str, Any]:
    """OpenAI's error document for ``exc``, answered with ``status``."""
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
        499: "invalid_request_error",
        503: "service_unavailable_error",
    }.get(status, "server_error")
    code = "model_not_found" if isinstance(exc, ModelNotFound) else None
    return {
        "error": {"message": exc.message, "type": kind, "param": getattr(exc, "param", None), "code": code}
    }
