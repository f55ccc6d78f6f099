"""Core errors to gRPC status codes: the gRPC transport's one table.

``PayloadTooLarge`` maps to RESOURCE_EXHAUSTED, the code gRPC itself gives a message over
``grpc_max_message_length``, so a client sees one code for "too big" whichever layer noticed.

A status message travels in the trailing metadata, which clients cap (16 KiB by default, and the
message is percent-encoded there): ``status_message`` cuts it to ``MAX_MESSAGE`` characters.
A "try again later" error (``Unavailable``) also carries a ``retry-after`` trailer (seconds), as
REST's ``Retry-After`` header.
"""

from __future__ import annotations

import grpc

from runtime import errors

# most specific first: the first class an error is an instance of decides
STATUS: tuple[tuple[type[errors.ServerError], grpc.StatusCode], ...] = (
    (errors.PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ModelNotFound, grpc.StatusCode.NOT_FOUND),
    # a sequence_step out of order: the request conflicts with the sequence's state, and the client
    # must not retry it as it is (it must send the expected step), hence not ABORTED
    (errors.SequenceStepConflict, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.ModelFailed, grpc.StatusCode.INTERNAL),
    (errors.Cancelled, grpc.StatusCode.CANCELLED),
)


MAX_MESSAGE = 1000
"""Most characters of a status message (at most 12 KB once percent-encoded)."""

RETRY_AFTER = "1"
"""Seconds a client told to try again later (503 / UNAVAILABLE) is asked to wait."""


def status_message(message: str) -> str:
    """``message`` cut to ``MAX_MESSAGE`` characters, so that it fits in the trailing metadata."""
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


def trailers_of(error: errors.ServerError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata sent with ``error``'s status: ``retry-after`` for a "try later" error."""
    return (("retry-after", RETRY_AFTER),) if isinstance(error, errors.Unavailable) else ()


def code_of(error: errors.ServerError) -> grpc.StatusCode:
    for cls, code in STATUS:
        if isinstance(error, cls):
            return code
    return grpc.StatusCode.INTERNAL
