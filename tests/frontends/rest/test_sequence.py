"""TorchServe's sequence headers on REST (``runtime.frontends.rest.sequence``): read into a request's
sequence parameters, and echoed on a sequence's responses."""

from __future__ import annotations

import pytest

from runtime.errors import InvalidInput
from runtime.frontends.rest.sequence import raw_sequence_headers, read_sequence_headers, sequence_headers
from runtime.types import InferenceRequest, InferenceResponse, Parameters


def test_the_sequence_headers_become_the_sequence_parameters() -> None:
    request = InferenceRequest(inputs=[])
    read_sequence_headers(
        request,
        [
            (b"content-type", b"application/json"),
            (b"ts_request_sequence_id", b"abc"),
            (b"ts_request_sequence_start", b"true"),
            (b"ts_request_sequence_end", b"0"),
            (b"sequence_step", b"4"),
            (b"ts_request_sequence_other", b"x"),  # the prefix alone names nothing
        ],
    )
    assert request.parameters is not None
    assert request.parameters.model_extra == {
        "sequence_id": "abc",
        "sequence_start": True,
        "sequence_end": False,
        "sequence_step": 4,
    }


def test_a_request_without_them_is_left_as_it_is() -> None:
    request = InferenceRequest(inputs=[])
    read_sequence_headers(request, [(b"content-type", b"application/json"), (b"x-request-id", b"r")])
    assert request.parameters is None


def test_a_header_that_disagrees_with_the_body_is_refused() -> None:
    request = InferenceRequest(inputs=[], parameters=Parameters.model_validate({"sequence_id": "a"}))
    with pytest.raises(InvalidInput):
        read_sequence_headers(request, [(b"ts_request_sequence_id", b"b")])


def test_a_sequence_response_echoes_its_id_end_and_replica() -> None:
    assert sequence_headers(InferenceResponse(model_name="m")) == {}
    going_on = InferenceResponse(parameters=Parameters.model_validate({"sequence_id": 7}))
    assert sequence_headers(going_on) == {"ts_request_sequence_id": "7"}
    ended = InferenceResponse(
        parameters=Parameters.model_validate(
            {"sequence_id": "s", "sequence_end": True, "sequence_replica": "r1"}
        )
    )
    assert sequence_headers(ended) == {
        "ts_request_sequence_id": "s",
        "ts_request_sequence_end": "true",
        "sequence_replica": "r1",
    }


@pytest.mark.parametrize(
    "parameters",
    [
        None,
        Parameters(),
        Parameters(content_type="np"),
        Parameters(sequence_id="abc"),
        Parameters(sequence_id=7, sequence_end=True),
        Parameters(sequence_id="é", sequence_end=False, sequence_replica="r1"),
        Parameters(sequence_id="s", sequence_end="true", sequence_replica=3),
        Parameters(sequence_end=True),
    ],
)
def test_the_raw_headers_are_the_sequence_headers_encoded(parameters: Parameters | None) -> None:
    response = InferenceResponse(model_name="m", outputs=[], parameters=parameters)
    expected = [(k.encode(), v.encode()) for k, v in sequence_headers(response).items()]
    assert raw_sequence_headers(response) == expected
