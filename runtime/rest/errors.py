"""Core errors to HTTP statuses: the REST transport's one table."""

from __future__ import annotations

from .. import errors

# most specific first: the first class an error is an instance of decides
STATUS: tuple[tuple[type[errors.ServerError], int], ...] = (
    (errors.PayloadTooLarge, 413),
    (errors.InvalidInput, 400),
    (errors.ModelNotFound, 404),
    (errors.Unavailable, 503),
    (errors.ModelFailed, 500),
    (errors.Cancelled, 499),
)


def status_of(error: errors.ServerError) -> int:
    for cls, status in STATUS:
        if isinstance(error, cls):
            return status
    return 500
