"""OpenAI's error body (``runtime.frontends.openai.openai_errors``): type by status, param, code."""

from __future__ import annotations

from runtime.errors import InvalidInput, ModelNotFound, Unavailable
from runtime.frontends.openai.openai_errors import OpenAIError, error_body


def test_errors_in_openai_shape() -> None:
    assert error_body(ModelNotFound("gone"), 404)["error"] == {
        "message": "Model 'gone' not found",
        "type": "not_found_error",
        "param": None,
        "code": "model_not_found",
    }
    assert error_body(OpenAIError("bad", "n"), 400)["error"]["param"] == "n"
    assert error_body(Unavailable("busy"), 503)["error"]["type"] == "service_unavailable_error"
    assert error_body(InvalidInput("x"), 500)["error"]["type"] == "server_error"


def test_a_bad_request_is_invalid_input_naming_its_field() -> None:
    error = OpenAIError("n must be an integer from 1 to 128", "n")
    assert isinstance(error, InvalidInput) and error.param == "n"
    assert error_body(error, 400)["error"]["type"] == "invalid_request_error"
