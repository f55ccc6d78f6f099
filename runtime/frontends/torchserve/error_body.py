"""Core errors to TorchServe's error body ``{"code", "type", "message"}``: the one table of every
TorchServe-shaped front end (inference REST and gRPC, management REST and gRPC)."""

from __future__ import annotations

import grpc

from runtime import errors

NO_WORKER = (
    'Model "{name}" has no worker to serve inference request. Please use scale workers API to add workers.'
)

# most specific first: the first class an error is an instance of decides
TABLE: tuple[tuple[type[errors.ServerError], int, str], ...] = (
    (errors.PayloadTooLarge, 413, "RequestEntityTooLargeException"),
    (errors.Conflict, 409, "ConflictStatusException"),
    (errors.Forbidden, 403, "ForbiddenException"),
    (errors.InvalidInput, 400, "BadRequestException"),
    (errors.ModelNotFound, 404, "ModelNotFoundException"),
    (errors.Overloaded, 503, "ServiceUnavailableException"),
    (errors.ModelNotReady, 503, "ServiceUnavailableException"),
    (errors.Unavailable, 503, "ServiceUnavailableException"),
    (errors.Unauthenticated, 400, "InvalidKeyException"),  # TorchServe's answer to a missing key
    (errors.ModelFailed, 500, "InternalServerException"),
    (errors.Cancelled, 499, "RequestCancelledException"),
)


def describe(error: errors.ServerError, model: str | None = None) -> tuple[int, str, str]:
    """The status, exception type and message TorchServe would answer with (``model``: the model
    an inference request named, for TorchServe's "no worker" sentence)."""
    status = getattr(error, "status", None)  # a handler's own code (runtime.torchserve.handler)
    if isinstance(status, int) and isinstance(error, errors.ModelFailed):
        return status, "InternalServerException", error.message
    if isinstance(error, errors.ModelNotFound):
        if error.version:
            return (
                404,
                "ModelVersionNotFoundException",
                f"Model version: {error.version} does not exist for model: {error.name}",
            )
        return 404, "ModelNotFoundException", f"Model not found: {error.name}"
    if model is not None and isinstance(error, errors.Overloaded | errors.ModelNotReady):
        return 503, "ServiceUnavailableException", NO_WORKER.format(name=model)
    for cls, code, kind in TABLE:
        if isinstance(error, cls):
            return code, kind, error.message
    return 500, "InternalServerException", error.message


CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""A handler's (or the server's) HTTP status to TorchServe's gRPC code; other 4xx are
FAILED_PRECONDITION, other 5xx INTERNAL."""


def grpc_code(status: int) -> grpc.StatusCode:
    if status in CODES:
        return CODES[status]
    if 400 <= status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL
