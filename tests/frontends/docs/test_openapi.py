"""The OpenAPI documents (``runtime.frontends.docs.openapi``) pass an OpenAPI validator, cover every
REST route of the protocol and its extensions, and a model's gives a request its model accepts."""

from __future__ import annotations

import pytest

from runtime.frontends.docs.openapi import dataplane_document, model_document
from runtime.types import MetadataModelResponse, MetadataTensor

validator = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator (the test extra)")

META = MetadataModelResponse(
    name="iris",
    platform="sklearn",
    inputs=[
        MetadataTensor(name="features", datatype="FP64", shape=[-1, 4]),
        MetadataTensor(name="tag", datatype="BYTES", shape=[1]),
        MetadataTensor(name="mask", datatype="BOOL", shape=[2]),
    ],
    outputs=[MetadataTensor(name="label", datatype="INT64", shape=[-1])],
)


def test_the_servers_document_is_valid_openapi_with_every_route() -> None:
    document = dataplane_document()
    validator.validate(document)
    paths = document["paths"]
    for suffix in ("", "/ready", "/infer", "/infer_stream", "/generate", "/generate_stream"):
        assert f"/v2/models/{{model_name}}{suffix}" in paths
        assert f"/v2/models/{{model_name}}/versions/{{model_version}}{suffix}" in paths
    for path in ("/v2", "/v2/health/live", "/v2/health/ready", "/v2/repository/index"):
        assert path in paths
    assert "/v2/repository/models/{model_name}/unload" in paths
    stream = paths["/v2/models/{model_name}/infer_stream"]["post"]["responses"]["200"]["content"]
    assert "text/event-stream" in stream
    ids = [op["operationId"] for item in paths.values() for op in item.values()]
    assert len(ids) == len(set(ids))
    assert "Apache" in document["info"]["license"]["name"]


@pytest.mark.parametrize("version", [None, "2"])
def test_a_models_document_is_valid_and_its_example_fits_the_model(version: str | None) -> None:
    document = model_document(META, version)
    validator.validate(document)
    prefix = "/v2/models/iris" + (f"/versions/{version}" if version else "")
    assert sorted(document["paths"]) == sorted(
        prefix + s for s in ("", "/ready", "/infer", "/infer_stream", "/generate", "/generate_stream")
    )
    example = document["paths"][prefix + "/infer"]["post"]["requestBody"]["content"]["application/json"][
        "example"
    ]
    assert example == {
        "inputs": [
            {"name": "features", "shape": [1, 4], "datatype": "FP64", "data": [0.0] * 4},
            {"name": "tag", "shape": [1], "datatype": "BYTES", "data": [""]},
            {"name": "mask", "shape": [2], "datatype": "BOOL", "data": [False, False]},
        ],
        "outputs": [{"name": "label"}],
    }
    assert "features (FP64 [-1, 4])" in document["info"]["description"]
    assert dataplane_document()["paths"] != document["paths"]  # the server's document is left alone


def test_a_model_without_declared_inputs_gets_an_example_any_model_reads() -> None:
    document = model_document(MetadataModelResponse(name="echo", platform=""), None)
    validator.validate(document)
    body = document["paths"]["/v2/models/echo/infer"]["post"]["requestBody"]["content"]["application/json"]
    assert body["example"]["inputs"][0]["datatype"] == "FP32"
