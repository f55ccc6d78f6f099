"""The OpenAPI 3.0 document of the REST API, and one model's.

Built from the Open Inference Protocol's own documents, shipped beside this module
(``open_inference_rest.yaml`` and ``generate_rest.yaml``, KServe's, Apache-2.0): their schemas as
they are, their operations on every route this server serves (each with and without
``/versions/{model_version}``), plus the extensions the server implements (``infer_stream``,
``generate_stream`` as Server-Sent Events, the model repository), with MLServer's paths. A model's
document keeps the model's routes with its name (and version) written in, and gives its infer
operation an example request made from the model's metadata (its declared inputs, -1 sizes as 1),
so that Swagger UI's "Try it out" sends a request the model accepts.
"""

from __future__ import annotations

import copy
import functools
from math import prod
from pathlib import Path
from typing import Any

from runtime.types import MetadataModelResponse

HERE = Path(__file__).parent
MODEL = "/v2/models/{model_name}"
VERSIONED = "/v2/models/{model_name}/versions/{model_version}"
ERROR = {"$ref": "#/components/schemas/error_response"}
_ZERO = {"BOOL": False, "BYTES": "", "FP16": 0.0, "FP32": 0.0, "FP64": 0.0, "BF16": 0.0}


@functools.cache
def _specs() -> tuple[dict[str, Any], dict[str, Any]]:
    import yaml  # on first use: not on the server's start

    oip = yaml.safe_load((HERE / "open_inference_rest.yaml").read_text())
    generate = yaml.safe_load((HERE / "generate_rest.yaml").read_text())
    return oip, generate


def _param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: str) -> dict[str, Any]:
    meaning = {
        "400": "Bad request (the message names what is wrong)",
        "404": "No such model or version",
        "503": "Not ready, or overloaded: try again after Retry-After seconds",
    }
    return {status: {"description": meaning[status], "content": _json(ERROR)} for status in statuses}


def _operation(template: dict[str, Any], operation_id: str, **changes: Any) -> dict[str, Any]:
    op = {k: v for k, v in copy.deepcopy(template).items() if k != "parameters"}
    op["operationId"] = operation_id
    op.update(changes)
    return op


@functools.cache
def _document() -> dict[str, Any]:
    oip, generate = _specs()
    paths_in = oip["paths"]
    infer = paths_in["/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer"]["post"]
    metadata = paths_in["/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}"]["get"]
    ready = paths_in["/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/ready"]["get"]
    gen = generate["paths"]["/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/generate"]["post"]
    gen_stream = generate["paths"]["/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/generate_stream"]["post"]
    stream_events = {
        "description": "One Server-Sent Event per answer, its data an inference response; a failure after "
        "the first event is an `event: error` whose data is an error response",
        "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/inference_response"}}},
    }
    infer_stream = {
        "summary": "Inference, streamed",
        "description": "An inference request whose answers come back as Server-Sent Events as the model "
        "produces them (MLServer's infer_stream).",
        "requestBody": infer["requestBody"],
        "responses": {"200": stream_events, **_errors("400", "404", "503")},
    }
    model_ops: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
        ("", "get", metadata, {"tags": ["model"]}),
        (
            "/ready",
            "get",
            ready,
            {"tags": ["model"], "responses": {**ready["responses"], **_errors("404", "503")}},
        ),
        (
            "/infer",
            "post",
            infer,
            {"tags": ["inference"], "responses": {**infer["responses"], **_errors("404", "503")}},
        ),
        ("/infer_stream", "post", infer_stream, {"tags": ["inference"]}),
        ("/generate", "post", gen, {"tags": ["generate"]}),
        ("/generate_stream", "post", gen_stream, {"tags": ["generate"]}),
    ]
    paths: dict[str, Any] = {
        "/v2/health/live": {"get": _operation(paths_in["/v2/health/live"]["get"], "live", tags=["server"])},
        "/v2/health/ready": {
            "get": _operation(paths_in["/v2/health/ready"]["get"], "ready", tags=["server"])
        },
        "/v2": {"get": _operation(paths_in["/v2/"]["get"], "server-metadata", tags=["server"])},
    }
    for prefix, params, kind in (
        (MODEL, ["model_name"], "model"),
        (VERSIONED, ["model_name", "model_version"], "version"),
    ):
        for suffix, method, template, changes in model_ops:
            name = suffix.strip("/") or "metadata"
            op = _operation(template, f"{name}-{kind}", parameters=[_param(p) for p in params], **changes)
            paths[prefix + suffix] = {method: op}
    paths.update(_repository())
    schemas = {**oip["components"]["schemas"], **generate["components"]["schemas"]}
    schemas["error_response"] = {
        "type": "object",
        "properties": {"error": {"type": "string"}},
        "required": ["error"],
    }
    schemas["repository_index_request"] = {"type": "object", "properties": {"ready": {"type": "boolean"}}}
    schemas["repository_index_response"] = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "state": {
                    "type": "string",
                    "enum": ["UNKNOWN", "READY", "UNAVAILABLE", "LOADING", "UNLOADING"],
                },
                "reason": {"type": "string"},
            },
            "required": ["name"],
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Data Plane",
            "version": "2.0",
            "description": "The Open Inference Protocol's REST API (KServe V2), with this server's extensions: "
            "generate and generate_stream, infer_stream, the model repository. From the protocol's own "
            "OpenAPI documents (https://github.com/kserve/open-inference-protocol, Apache-2.0).",
            "license": {"name": "Apache 2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"},
        },
        "tags": [
            {"name": "server", "description": "Health and server metadata"},
            {"name": "model", "description": "Model metadata and readiness"},
            {"name": "inference", "description": "Inference, unary and streamed"},
            {"name": "generate", "description": "The text generation extension"},
            {"name": "repository", "description": "The model repository extension"},
        ],
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _repository() -> dict[str, Any]:
    index = {
        "summary": "Repository index",
        "operationId": "repository-index",
        "tags": ["repository"],
        "description": "The models of the repository and their states (only the ready ones with "
        '`{"ready": true}`).',
        "requestBody": {"content": _json({"$ref": "#/components/schemas/repository_index_request"})},
        "responses": {
            "200": {
                "description": "OK",
                "content": _json({"$ref": "#/components/schemas/repository_index_response"}),
            }
        },
    }
    paths: dict[str, Any] = {"/v2/repository/index": {"post": index}}
    for action in ("load", "unload"):
        paths[f"/v2/repository/models/{{model_name}}/{action}"] = {
            "post": {
                "summary": f"Model {action}",
                "operationId": f"repository-{action}",
                "tags": ["repository"],
                "parameters": [_param("model_name")],
                "responses": {"200": {"description": "OK"}, **_errors("400", "404")},
            }
        }
    return paths


def dataplane_document() -> dict[str, Any]:
    """The server's document (a fresh copy: callers may change it)."""
    return copy.deepcopy(_document())


def _example_input(tensor: Any) -> dict[str, Any]:
    shape = [1 if size < 0 else size for size in tensor.shape] or [1]
    zero = _ZERO.get(tensor.datatype, 0)
    return {"name": tensor.name, "shape": shape, "datatype": tensor.datatype, "data": [zero] * prod(shape)}


def model_document(meta: MetadataModelResponse, version: str | None) -> dict[str, Any]:
    """One model's document: its routes (versioned ones when ``version`` is given, unversioned
    ones otherwise), its name and version written in, and requests made from its inputs."""
    document = dataplane_document()
    prefix = VERSIONED if version else MODEL
    concrete = prefix.replace("{model_name}", meta.name).replace("{model_version}", version or "")
    paths = {}
    for path, item in document["paths"].items():
        if not path.startswith(prefix) or (not version and path.startswith(MODEL + "/versions/")):
            continue
        for op in item.values():
            op.pop("parameters", None)
            op["operationId"] = op["operationId"].rsplit("-", 1)[0]
        paths[concrete + path[len(prefix) :]] = item
    inputs = [_example_input(tensor) for tensor in meta.inputs or []]
    if not inputs:  # no declared inputs: a tensor any model can read
        inputs = [{"name": "input-0", "shape": [1], "datatype": "FP32", "data": [0.0]}]
    example = {"inputs": inputs}
    if meta.outputs:
        example["outputs"] = [{"name": tensor.name} for tensor in meta.outputs]
    for suffix in ("/infer", "/infer_stream"):
        body = paths[concrete + suffix]["post"]["requestBody"]["content"]["application/json"]
        body["example"] = example
    title = f"model {meta.name}" + (f", version {version}" if version else "")
    document["info"]["title"] = f"Data Plane of {title}"
    described = (
        ", ".join(f"{t.name} ({t.datatype} {list(t.shape)})" for t in meta.inputs or []) or "not declared"
    )
    outputs = (
        ", ".join(f"{t.name} ({t.datatype} {list(t.shape)})" for t in meta.outputs or []) or "not declared"
    )
    document["info"]["description"] = (
        f"The REST API of {title} (platform {meta.platform or 'unset'}). Inputs: {described}. Outputs: {outputs}."
    )
    document["paths"] = paths
    document["tags"] = [tag for tag in document["tags"] if tag["name"] in ("model", "inference", "generate")]
    return document
