"""The gRPC transport's table of core errors to status codes (``runtime.frontends.grpc.status_codes``), as
SEQUENCES.md's status table and ``runtime.errors``' tree give them."""

from __future__ import annotations

import grpc
import pytest

from runtime import errors
from runtime.frontends.grpc.status_codes import MAX_MESSAGE, RETRY_AFTER, code_of, status_message, trailers_of
from tests.frontends.rest.test_status import EXPECTED as HTTP_STATUS
from tests.frontends.rest.test_status import every_error_class, example

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

EXPECTED: dict[type[errors.ServerError], grpc.StatusCode] = {
    errors.ServerError: grpc.StatusCode.INTERNAL,
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.SequenceError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.SequenceNotOpen: grpc.StatusCode.INVALID_ARGUMENT,
    errors.PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Conflict: grpc.StatusCode.INVALID_ARGUMENT,
    errors.Forbidden: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
    errors.Unavailable: UNAVAILABLE,
    errors.ModelNotReady: UNAVAILABLE,
    errors.Overloaded: UNAVAILABLE,
    errors.RequestTimeout: UNAVAILABLE,
    errors.QueueTimeout: UNAVAILABLE,
    errors.WorkerLost: UNAVAILABLE,
    errors.ShuttingDown: UNAVAILABLE,
    errors.SequenceElsewhere: UNAVAILABLE,
    errors.SequenceStepConflict: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.ModelFailed: grpc.StatusCode.INTERNAL,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
}


def test_the_table_covers_every_core_error() -> None:
    assert every_error_class() == set(EXPECTED)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda cls: cls.__name__)
def test_every_core_error_has_its_code(cls: type[errors.ServerError]) -> None:
    assert code_of(example(cls)) is EXPECTED[cls]


def test_a_try_later_error_carries_retry_after_as_rest_does() -> None:
    for cls in EXPECTED:
        trailers = trailers_of(example(cls))
        assert (trailers == (("retry-after", RETRY_AFTER),)) is (EXPECTED[cls] is UNAVAILABLE)
        assert (EXPECTED[cls] is UNAVAILABLE) is (HTTP_STATUS[cls] == 503)


def test_status_message_is_cut_to_fit_the_trailing_metadata() -> None:
    assert status_message("short") == "short"
    exact = "x" * MAX_MESSAGE
    assert status_message(exact) == exact
    cut = status_message("y" * (MAX_MESSAGE * 5))
    assert len(cut) == MAX_MESSAGE and cut.endswith("…") and cut.startswith("y" * (MAX_MESSAGE - 1))
