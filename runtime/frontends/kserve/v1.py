"""KServe's V1 protocol on the main REST port, translated onto the DataPlane.

- ``GET /v1/models`` -> ``{"models": [names]}``; ``GET /v1/models/{m}`` -> ``{"name", "ready"}``
  (503 ``{"error": "Model with name m is not ready."}`` when it is not). The same paths are the
  OpenAI API's model list and model: each answer carries OpenAI's keys too (``object``,
  ``data``; ``id``, ``created``, ``owned_by``), so one answer serves both clients.
- ``POST /v1/models/{m}:predict`` with ``{"instances": [...]}`` (rows) or ``{"inputs": ...}``
  (columns) -> ``{"predictions": [...]}``. Rows map onto the model's declared inputs: with one
  input, the instances are its rows; with several, each instance is an object keyed by input name.
  ``inputs`` is a list (the single input) or an object keyed by input name. The datatype is the
  declared one (else inferred from the JSON). One output answers its rows; several answer one
  object per row keyed by output name.
- A TorchServe handler model (a ``.mar`` or an archive folder) is served as TorchServe's KServe
  envelope serves it: each instance is one row of the handler's batch, given to the handler as
  ``data[i]`` itself, and ``predictions`` are the handler's answers, one per instance, as it
  returned them. Request headers reach the handler.
- ``POST /v1/models/{m}:explain``: a handler model's explanations (the handler's
  ``explain_handle``, as TorchServe's ``:explain``), answered ``{"explanations": [...]}``. Other
  models have no explainer: 501 ``{"error": ...}``, as KServe answers a model without one.
- A model served with adaptive batching merges concurrent V1 calls (KServe's batcher does this in a
  sidecar); each answer then carries ``batchId``, the same for every call of one batch, and
  ``message: ""``, as the sidecar answers.
- Errors are KServe's ``{"error": "..."}``: 404 "Model with name m does not exist.", 400 for a
  malformed body, 503, 500, through the REST transport's status table.

The body is parsed as JSON whatever its Content-Type (KServe needs ``application/json``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime.core.dataplane import DataPlane
from runtime.errors import InvalidInput, ModelNotFound, ServerError
from runtime.frontends.rest.app import read_body
from runtime.frontends.rest.disconnect import cancel_on_disconnect
from runtime.frontends.rest.model_cards import model_card, models_list
from runtime.frontends.rest.status import headers_of, status_of
from runtime.frontends.torchserve.frontend import FrontEnd, is_handler
from runtime.tensors import output_array
from runtime.torchserve.payload import read_answers
from runtime.types import Datatype, InferenceRequest, InferenceResponse, MetadataTensor, RequestInput

_BATCHES = uuid.uuid4()
"""Batch ids are uuids derived from this process's token, the model and the scheduler's batch number."""


def _json(document: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY), status, media_type="application/json"
    )


def _error(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    response = _json({"error": message}, status)
    response.headers.update(headers or {})
    return response


def _datatype(array: np.ndarray) -> Datatype:
    kind = array.dtype.kind
    if kind == "b":
        return Datatype.BOOL
    if kind in "iu":
        return Datatype.INT64
    if kind == "f":
        return Datatype.FP64
    return Datatype.BYTES


def _tensor(name: str, rows: Any, spec: MetadataTensor | None) -> RequestInput:
    try:
        array = np.asarray(rows)
    except ValueError as exc:
        raise InvalidInput(f"The rows of {name!r} do not form a tensor: {exc}") from None
    if array.dtype.kind in "USO":
        flat = [v.encode() if isinstance(v, str) else v for v in array.reshape(-1).tolist()]
        data: Any = np.empty(len(flat), dtype=object)
        data[:] = flat
        datatype = Datatype.BYTES
    else:
        datatype = spec.datatype if spec is not None else _datatype(array)
        data = array.reshape(-1)
    return RequestInput(name=name, shape=list(array.shape) or [1], datatype=datatype, data=data)


def to_inference_request(body: Any, declared: list[MetadataTensor]) -> InferenceRequest:
    """The InferenceRequest for a V1 body, mapped onto the model's declared inputs."""
    if not isinstance(body, dict):
        raise InvalidInput("Unrecognized request format: the body must be a JSON object")
    specs = {t.name: t for t in declared}
    names = list(specs) or ["input-0"]
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list):
            raise InvalidInput('Expected "instances" to be a list')
        if len(names) == 1:
            inputs = [_tensor(names[0], instances, specs.get(names[0]))]
        else:
            if not all(isinstance(row, dict) for row in instances):
                raise InvalidInput(f"Each instance must be an object with the inputs {names}")
            inputs = [
                _tensor(n, [row.get(n) for row in instances], specs[n])
                for n in names
                if instances and n in instances[0]
            ]
    elif "inputs" in body:
        columns = body["inputs"]
        if isinstance(columns, dict):
            inputs = [_tensor(n, v, specs.get(n)) for n, v in columns.items()]
        elif isinstance(columns, list):
            inputs = [_tensor(names[0], columns, specs.get(names[0]))]
        else:
            raise InvalidInput('Expected "inputs" to be a list or an object')
    else:
        raise InvalidInput('Unrecognized request format: expected "instances" or "inputs"')
    return InferenceRequest(inputs=inputs)


def handler_instances(body: Any) -> list[Any]:
    """The instances of a V1 body for a TorchServe handler (``instances``, or ``inputs`` as a list)."""
    if not isinstance(body, dict):
        raise InvalidInput("Unrecognized request format: the body must be a JSON object")
    key = "instances" if "instances" in body else "inputs"
    if key not in body:
        raise InvalidInput('Unrecognized request format: expected "instances" or "inputs"')
    instances = body[key]
    if not isinstance(instances, list):
        raise InvalidInput(f'Expected "{key}" to be a list')
    if not instances:
        raise InvalidInput(f'No instances in the request: "{key}" is empty')
    return instances


class HandlerAnswered(ServerError):
    """A handler answered an instance with an error status of its own (``set_response_status``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _plain(value: Any) -> Any:
    """JSON-ready: numpy arrays and scalars as lists and numbers, bytes as text."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return [_plain(v) for v in value.tolist()] if value.ndim else _plain(value.item())
        return value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def predictions(response: InferenceResponse) -> list[Any]:
    """The V1 predictions of a response: one output's rows, or one object per row."""
    arrays = {out.name: output_array(out) for out in response.outputs}
    if len(arrays) == 1:
        (only,) = arrays.values()
        return [_plain(row) for row in only] if only.ndim else [_plain(only)]
    rows = min((len(a) for a in arrays.values() if a.ndim), default=1)
    return [{name: _plain(a[i] if a.ndim else a) for name, a in arrays.items()} for i in range(rows)]


class KServeV1:
    """The V1 routes over one DataPlane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.front = FrontEnd(dataplane)
        """TorchServe's request rules, for handler models."""

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/models/{model_name}:predict", self.predict, methods=["POST"]),
            Route("/v1/models/{model_name}:explain", self.explain, methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model_name}", self.model, methods=["GET"]),
        ]

    async def list_models(self, request: Request) -> Response:
        names = sorted({item.name for item in self.dataplane.registry.index(ready_only=True)})
        return _json(models_list(names))

    async def model(self, request: Request) -> Response:
        name = request.path_params["model_name"]
        try:
            ready = self.dataplane.model_ready(name)
        except ModelNotFound:
            return _error(f"Model with name {name} does not exist.", 404)
        if not ready:
            return _error(f"Model with name {name} is not ready.", 503)
        return _json({"name": name, "ready": True, **model_card(name)})

    async def predict(self, request: Request) -> Response:
        return await self._serve(request, explain=False)

    async def explain(self, request: Request) -> Response:
        return await self._serve(request, explain=True)

    async def _serve(self, request: Request, explain: bool) -> Response:
        name = request.path_params["model_name"]
        try:
            handler = is_handler(self.dataplane.check_model(name).settings)
            if explain and not handler:
                return _error(
                    f"Model {name} has no explainer: explanations need a TorchServe handler model", 501
                )
            raw = await read_body(request, self.dataplane.settings.max_request_size)
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"Unrecognized request format: {exc}") from None
            if handler:
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]}
                work = self._handler_answers(name, body, headers, explain)
                answers, response = await cancel_on_disconnect(request, work)
            else:
                inference_request = to_inference_request(body, self.dataplane.model_inputs(name))
                response = await cancel_on_disconnect(request, self.dataplane.infer(inference_request, name))
                answers = predictions(response)
            document: dict[str, Any] = {"explanations" if explain else "predictions": answers}
        except ModelNotFound:
            return _error(f"Model with name {name} does not exist.", 404)
        except ServerError as exc:
            status = getattr(exc, "status", None)  # a handler's own code (runtime.torchserve.handler)
            if isinstance(status, int):
                return _error(exc.message, status)
            return _error(exc.message, status_of(exc), headers_of(exc))
        extra = response.parameters.model_extra if response.parameters is not None else None
        if extra and "batch_id" in extra:
            batch = uuid.uuid5(_BATCHES, f"{name}:{response.model_version}:{extra['batch_id']}")
            document = {"message": "", "batchId": str(batch), **document}
        return _json(document)

    async def _handler_answers(
        self, name: str, body: Any, headers: dict[str, str], explain: bool
    ) -> tuple[list[Any], InferenceResponse]:
        """A TorchServe handler's answers to the instances, one each, and the (last) response."""
        instances = handler_instances(body)
        requests = self.front.instances_requests(name, None, instances, headers, explain)
        responses = await asyncio.gather(*(self.dataplane.infer(r, name) for r in requests))
        answers: list[Any] = []
        for response in responses:
            for answer in read_answers(response):
                try:
                    value = orjson.loads(answer.body)
                except orjson.JSONDecodeError:
                    value = answer.body.decode("utf-8", "replace")
                if answer.status >= 400:
                    message = value if isinstance(value, str) else orjson.dumps(value).decode()
                    raise HandlerAnswered(message, answer.status)
                answers.append(value)
        return answers, responses[-1]
