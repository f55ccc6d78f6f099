"""Core errors to gRPC status codes: the gRPC transport's one table.

``PayloadTooLarge`` maps to RESOURCE_EXHAUSTED, the code gRPC itself gives a message over
``grpc_max_message_length``, so a client sees one code for "too big" whichever layer noticed.
"""

from __future__ import annotations

import grpc

from .. import errors

# most specific first: the first class an error is an instance of decides
STATUS: tuple[tuple[type[errors.ServerError], grpc.StatusCode], ...] = (
    (errors.PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.ModelFailed, grpc.StatusCode.INTERNAL),
    (errors.Cancelled, grpc.StatusCode.CANCELLED),
)


def code_of(error: errors.ServerError) -> grpc.StatusCode:
    for cls, code in STATUS:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL
