"""The REST transport's table of core errors to HTTP statuses (``runtime.frontends.rest.status``), as
SEQUENCES.md's status table and ``runtime.errors``' tree give them."""

from __future__ import annotations

import pytest

from runtime import errors
from runtime.frontends.rest.status import RETRY_AFTER, headers_of, status_of

EXPECTED: dict[type[errors.ServerError], int] = {
    errors.ServerError: 500,
    errors.InvalidInput: 400,
    errors.SequenceError: 400,
    errors.SequenceNotOpen: 400,
    errors.PayloadTooLarge: 413,
    errors.Conflict: 400,  # 409 on the management API only (runtime.frontends.torchserve.error_body)
    errors.Forbidden: 400,  # 403 there
    errors.ModelNotFound: 404,
    errors.Unavailable: 503,
    errors.ModelNotReady: 503,
    errors.Overloaded: 503,
    errors.RequestTimeout: 503,
    errors.QueueTimeout: 503,
    errors.WorkerLost: 503,
    errors.ShuttingDown: 503,
    errors.SequenceElsewhere: 503,
    errors.SequenceStepConflict: 409,
    errors.Unauthenticated: 401,
    errors.ModelFailed: 500,
    errors.Cancelled: 499,
}


def every_error_class() -> set[type[errors.ServerError]]:
    """``ServerError`` and every class below it in ``runtime.errors``."""
    found: set[type[errors.ServerError]] = set()
    pending = [errors.ServerError]
    while pending:
        cls = pending.pop()
        if cls.__module__ == errors.__name__:
            found.add(cls)
        pending.extend(cls.__subclasses__())
    return found


def example(cls: type[errors.ServerError]) -> errors.ServerError:
    if cls is errors.ModelNotFound:
        return errors.ModelNotFound("m")
    if cls is errors.SequenceStepConflict:
        return errors.SequenceStepConflict("step 3 is not the next one", expected=2)
    return cls("what went wrong")


def test_the_table_covers_every_core_error() -> None:
    assert every_error_class() == set(EXPECTED)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda cls: cls.__name__)
def test_every_core_error_has_its_status(cls: type[errors.ServerError]) -> None:
    assert status_of(example(cls)) == EXPECTED[cls]


def test_only_a_try_later_error_carries_retry_after() -> None:
    for cls in EXPECTED:
        headers = headers_of(example(cls))
        if EXPECTED[cls] == 503:
            assert headers == {"Retry-After": RETRY_AFTER}
        elif EXPECTED[cls] == 401:
            assert headers == {"WWW-Authenticate": "Bearer"}
        else:
            assert headers is None, cls
    assert int(RETRY_AFTER) > 0
