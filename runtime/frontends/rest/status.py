"""Core errors to HTTP statuses: the REST transport's one table.

A "try again later" error (``Unavailable``, 503) also carries a ``Retry-After`` header (seconds);
a 401 (``Unauthenticated``) carries ``WWW-Authenticate: Bearer``, the scheme the key is sent in.
"""

from __future__ import annotations

from runtime import errors

# most specific first: the first class an error is an instance of decides
STATUS: tuple[tuple[type[errors.ServerError], int], ...] = (
    (errors.PayloadTooLarge, 413),
    (errors.InvalidInput, 400),
    (errors.ModelNotFound, 404),
    (errors.SequenceStepConflict, 409),
    (errors.Unauthenticated, 401),
    (errors.Unavailable, 503),
    (errors.ModelFailed, 500),
    (errors.Cancelled, 499),
)


def status_of(error: errors.ServerError) -> int:
    for cls, status in STATUS:
        if isinstance(error, cls):
            return status
    return 500


RETRY_AFTER = "1"
"""Seconds a client told to try again later (503) is asked to wait."""


def headers_of(error: errors.ServerError) -> dict[str, str] | None:
    """Headers sent with ``error``'s status: ``Retry-After`` for a "try later" error,
    ``WWW-Authenticate`` for a missing key."""
    if isinstance(error, errors.Unavailable):
        return {"Retry-After": RETRY_AFTER}
    if isinstance(error, errors.Unauthenticated):
        return {"WWW-Authenticate": "Bearer"}
    return None
