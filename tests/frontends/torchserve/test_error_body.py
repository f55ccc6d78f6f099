"""TorchServe's error body ``{"code", "type", "message"}`` and its gRPC codes
(``runtime.frontends.torchserve.error_body``)."""

from __future__ import annotations

import grpc
import pytest

from runtime import errors
from runtime.frontends.torchserve.error_body import NO_WORKER, describe, grpc_code
from runtime.torchserve.handler import HandlerFailed


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (errors.InvalidInput("bad"), 400, "BadRequestException"),
        (errors.SequenceNotOpen("bad"), 400, "BadRequestException"),
        (errors.PayloadTooLarge("bad"), 413, "RequestEntityTooLargeException"),
        (errors.Conflict("bad"), 409, "ConflictStatusException"),
        (errors.Forbidden("bad"), 403, "ForbiddenException"),
        (errors.Overloaded("bad"), 503, "ServiceUnavailableException"),
        (errors.QueueTimeout("bad"), 503, "ServiceUnavailableException"),
        (errors.ModelFailed("bad"), 500, "InternalServerException"),
        (errors.Cancelled("bad"), 499, "RequestCancelledException"),
        (errors.ServerError("bad"), 500, "InternalServerException"),
    ],
)
def test_each_error_has_torchserves_status_and_exception_type(
    error: errors.ServerError, status: int, kind: str
) -> None:
    assert describe(error) == (status, kind, "bad")


def test_model_not_found_is_worded_as_torchserve_words_it() -> None:
    assert describe(errors.ModelNotFound("m")) == (404, "ModelNotFoundException", "Model not found: m")
    assert describe(errors.ModelNotFound("m", "2.0"), "m") == (
        404,
        "ModelVersionNotFoundException",
        "Model version: 2.0 does not exist for model: m",
    )


def test_an_inference_request_to_a_model_that_cannot_take_it_hears_of_no_worker() -> None:
    for error in (errors.Overloaded("full"), errors.ModelNotReady("loading")):
        assert describe(error, "m") == (503, "ServiceUnavailableException", NO_WORKER.format(name="m"))
    assert describe(errors.ShuttingDown("draining"), "m") == (503, "ServiceUnavailableException", "draining")


def test_a_handlers_own_status_is_kept() -> None:
    assert describe(HandlerFailed("out of memory", 507)) == (507, "InternalServerException", "out of memory")


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (403, grpc.StatusCode.PERMISSION_DENIED),
        (404, grpc.StatusCode.NOT_FOUND),
        (409, grpc.StatusCode.ABORTED),
        (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (503, grpc.StatusCode.UNAVAILABLE),
        (504, grpc.StatusCode.DEADLINE_EXCEEDED),
        (418, grpc.StatusCode.FAILED_PRECONDITION),
        (500, grpc.StatusCode.INTERNAL),
        (507, grpc.StatusCode.INTERNAL),
    ],
)
def test_http_statuses_map_to_torchserves_grpc_codes(status: int, code: grpc.StatusCode) -> None:
    assert grpc_code(status) is code
