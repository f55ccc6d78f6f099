"""MLflow's scoring routes on the main REST port, translated onto the DataPlane, so that clients of
``mlflow models serve`` (and of mlserver-mlflow) work unchanged.

- ``POST /invocations``: MLflow's JSON formats and CSV (``runtime.frontends.mlflow.formats``) in,
  ``{"predictions": ...}`` out. The request is an ordinary inference request of the scoring model
  (batching, workers, metrics and every check apply).
- ``GET /health``: 200 with mlflow's body (a newline, ``application/json``) when the scoring model
  is ready; its error otherwise (404 none, 503 not ready). TorchServe's ``GET /ping`` already
  answers 200 when the server is healthy.
- ``GET /version``: the installed mlflow's version, as mlflow answers it (bare text).

Which model scores: ``Settings.mlflow_model`` when set; else the only MLflow model loaded
(``runtime.mlflow.MLflowModel``, or MLServer's name for it); else the only model loaded; else 404.

Errors have mlflow's body, ``{"error_code": "BAD_REQUEST", "message": "..."}``, with the REST
transport's status for the error (400 bad input naming the input, 404, 503...) and 415 for a
content type or charset the route does not read (mlflow sends that one as text; here it is JSON
like every other error). A model that raised is 500 ``INTERNAL_ERROR`` (mlflow answers 400 for
any failure of the model).
"""

from __future__ import annotations

import sys
from importlib import metadata as package_metadata

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime.core.dataplane import DataPlane
from runtime.core.model_table import ModelEntry
from runtime.errors import ServerError
from runtime.frontends.mlflow.formats import (
    CSV,
    UnsupportedContentType,
    content_type_of,
    parse_csv,
    parse_json,
    to_predictions,
    to_request,
)
from runtime.frontends.rest.app import read_body
from runtime.frontends.rest.disconnect import cancel_on_disconnect
from runtime.frontends.rest.status import headers_of, status_of
from runtime.types import MetadataTensor

MLFLOW_NAMES = frozenset({"runtime.mlflow.MLflowModel", "mlserver_mlflow.MLflowRuntime"})
"""The implementations that make a model an MLflow model, before it is loaded."""

ERROR_CODES = {
    400: "BAD_REQUEST",
    404: "RESOURCE_DOES_NOT_EXIST",
    409: "RESOURCE_CONFLICT",
    413: "BAD_REQUEST",
    415: "BAD_REQUEST",
    499: "CANCELLED",
    503: "TEMPORARILY_UNAVAILABLE",
}
"""mlflow's error code for each status (anything else: INTERNAL_ERROR)."""


class NoScoringModel(ServerError):
    """No model, or more than one, could answer /invocations (404)."""


def _error(exc: ServerError) -> Response:
    if isinstance(exc, UnsupportedContentType):
        status = 415
    elif isinstance(exc, NoScoringModel):
        status = 404
    else:
        status = status_of(exc)
    body = orjson.dumps({"error_code": ERROR_CODES.get(status, "INTERNAL_ERROR"), "message": exc.message})
    return Response(body, status, headers=headers_of(exc), media_type="application/json")


def is_mlflow_model(entry: ModelEntry) -> bool:
    """Whether ``entry`` serves an MLflow model (by its class once made, else by its implementation)."""
    module = sys.modules.get("runtime.mlflow.mlflow_model")
    if module is not None and entry.model is not None:
        return isinstance(entry.model, module.MLflowModel)
    return isinstance(entry.settings.implementation, str) and entry.settings.implementation in MLFLOW_NAMES


def _version() -> str | None:
    for name in ("mlflow", "mlflow-skinny"):
        try:
            return package_metadata.version(name)
        except package_metadata.PackageNotFoundError:
            continue
    return None


class MLflowScoring:
    """The three routes over one DataPlane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/invocations", self.invocations, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
        ]

    def scoring_model(self) -> str:
        """The name of the model that answers /invocations (see the module docstring)."""
        chosen = self.dataplane.settings.mlflow_model
        if chosen:
            return chosen
        entries = self.dataplane.registry.entries()
        for candidates in ([e for e in entries if is_mlflow_model(e)], entries):
            names = sorted({e.name for e in candidates})
            if len(names) == 1:
                return names[0]
            if len(names) > 1:
                raise NoScoringModel(
                    f"Several models could answer /invocations ({', '.join(names)}); name one with the "
                    "setting mlflow_model (MLSERVER_MLFLOW_MODEL)"
                )
        raise NoScoringModel("No model is loaded to answer /invocations")

    async def _shape(self, name: str, entry: ModelEntry) -> tuple[list[MetadataTensor], bool, bool]:
        """The model's declared inputs, whether it takes columns, whether its one output is 2-D."""
        model = entry.model
        signature = getattr(model, "signature", None) if is_mlflow_model(entry) else None
        if signature is not None:
            declared = list(entry.settings.inputs) or [spec.metadata() for spec in signature.inputs]
            outputs = signature.outputs
            two_d = len(outputs) == 1 and not signature.columns and len(outputs[0].shape) == 2
            return declared, bool(signature.columns), two_d
        meta = await self.dataplane.model_metadata(name, entry.version)
        content_type = meta.parameters.content_type if meta.parameters else None
        return list(meta.inputs or []), content_type == "pd", False

    async def invocations(self, request: Request) -> Response:
        try:
            name = self.scoring_model()
            entry = self.dataplane.check_model(name)
            mime = content_type_of(request.headers.get("content-type", ""))
            body = await read_body(request, self.dataplane.settings.max_request_size)
            declared, columns_model, two_d = await self._shape(name, entry)
            if mime == CSV:
                inference = to_request(parse_csv(body), None, None, declared, columns_model, from_csv=True)
            else:
                names = [spec.name for spec in declared]
                columns, tensor, params = parse_json(body, columns_model, names)
                inference = to_request(columns, tensor, params, declared, columns_model)
            response = await cancel_on_disconnect(request, self.dataplane.infer(inference, name))
            document = {"predictions": to_predictions(response, two_d)}
        except ServerError as exc:
            return _error(exc)
        return Response(
            orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
        )

    async def health(self, request: Request) -> Response:
        try:
            name = self.scoring_model()
            self.dataplane.check_model(name)
        except ServerError as exc:
            return _error(exc)
        return Response("\n", media_type="application/json")

    async def version(self, request: Request) -> Response:
        version = _version()
        if version is None:
            return _error(NoScoringModel("mlflow is not installed: pip install 'mlserver-like[mlflow]'"))
        return Response(version, media_type="application/json")
