"""Property-based checks of the REST API against the OIP's own OpenAPI files (schemathesis).

The files are schemas/open_inference_rest.yaml (the inference protocol) and
schemas/generate_rest.yaml (the generate extension), copied from KServe's open-inference-protocol.

Path parameters are pinned to a served model half of the time so that generated bodies reach the
inference path instead of stopping at 404. The server must never answer 5xx, every error must be
a JSON {"error": ...}, and the server must stay ready. Generate answers (JSON ones) must also match
the extension's response schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import response_schema_conformance

from tests.servers import RunningServer, start_server

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
TEST_MODELS = Path(__file__).resolve().parent / "models"

inference = schemathesis.openapi.from_path(str(SCHEMAS / "open_inference_rest.yaml"))
generate = schemathesis.openapi.from_path(str(SCHEMAS / "generate_rest.yaml"))


@pytest.fixture(scope="module")
def base_url(example_server: RunningServer) -> str:
    return example_server.http_url


@pytest.fixture(scope="module")
def generate_url() -> Iterator[str]:
    server = start_server(TEST_MODELS / "generate")
    yield server.http_url
    assert server.stop() == 0


def _check(response: schemathesis.Response, base_url: str) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert "error" in response.json(), response.text
    assert httpx.get(f"{base_url}/v2/health/ready").status_code == 200


@inference.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case[Any], base_url: str) -> None:
    if case.path_parameters and hash(repr(case.body)) % 2 == 0:
        case.path_parameters = {**case.path_parameters, "MODEL_NAME": "echo", "MODEL_VERSION": "1"}
    response = case.call(base_url=base_url)
    _check(response, base_url)


@generate.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_generate_no_server_errors(case: schemathesis.Case[Any], generate_url: str) -> None:
    if hash(repr(case.body)) % 4 != 0:
        case.path_parameters = {"MODEL_NAME": "spell", "MODEL_VERSION": "1"}
    response = case.call(base_url=generate_url)
    _check(response, generate_url)
    content_type = response.headers.get("content-type", [""])[0]
    if response.status_code == 200 and content_type.startswith("application/json"):
        case.validate_response(response, checks=[response_schema_conformance])
