"""REST routes for streaming and the generate extension: infer_stream, generate, generate_stream.

- ``POST .../infer_stream``: one InferenceRequest (JSON, or with binary tensor data) in; Server-Sent
  Events out, one InferenceResponse (JSON) per ``data:`` event.
- ``POST .../generate``: the unary twin. A generate body ``{"text_input", "parameters"?, "id"?}``
  gets a generate answer ``{"text_output", "model_name", "model_version"?, "details"?}``; a tensor
  InferenceRequest body gets what ``/infer`` would answer (as MLServer, which treats generate as
  an alias of infer).
- ``POST .../generate_stream``: the streamed twin: generate answers (or InferenceResponses, for a
  tensor body) as Server-Sent Events.

Everything protocol-related happens in the core (``DataPlane.infer_stream``, ``DataPlane.generate``,
``runtime.generate``); these handlers only translate. Errors before the first event are JSON errors
with the status of ``runtime.rest.errors``; after it, ``event: error`` (see ``runtime.rest.sse``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import InvalidInput
from ..generate import GenerateRequest, GenerateResponse, is_generate_body
from ..types import InferenceRequest, InferenceResponse
from .app import RestApi, _model, json_response, read_body
from .codec import HEADER_LENGTH, dumps, encode_response, parse_json, validation_message
from .sse import message_event, sse_response


async def _one(request: InferenceRequest) -> AsyncGenerator[InferenceRequest, None]:
    yield request


def _response_event(response: InferenceResponse) -> bytes:
    body, _ = encode_response(response, None)  # events are JSON: binary outputs cannot ride in SSE
    return message_event(body)


def _generate_event(answer: GenerateResponse) -> bytes:
    return message_event(dumps(answer))


class StreamingApi:
    """The streaming and generate handlers, on top of the REST API's body parsing."""

    def __init__(self, api: RestApi) -> None:
        self.api = api
        self.dataplane = api.dataplane

    async def infer_stream(self, request: Request) -> Response:
        name, version = _model(request)
        inference_request = await self.api.read_inference_request(request, name, version)
        responses = self.dataplane.infer_stream(_one(inference_request), name, version)
        return await sse_response(request, responses, _response_event, self.dataplane.streams)

    async def generate(self, request: Request) -> Response:
        name, version = _model(request)
        body = await self._read_generate(request, name, version)
        if isinstance(body, GenerateRequest):
            return json_response(await self.dataplane.generate(body, name, version))
        response = await self.dataplane.infer(body, name, version)
        encoded, headers = encode_response(response, body)
        media = "application/octet-stream" if headers else "application/json"
        return Response(encoded, media_type=media, headers=headers)

    async def generate_stream(self, request: Request) -> Response:
        name, version = _model(request)
        body = await self._read_generate(request, name, version)
        if isinstance(body, GenerateRequest):
            answers = self.dataplane.generate_stream(body, name, version)
            return await sse_response(request, answers, _generate_event, self.dataplane.streams)
        responses = self.dataplane.infer_stream(_one(body), name, version)
        return await sse_response(request, responses, _response_event, self.dataplane.streams)

    async def _read_generate(
        self, request: Request, name: str, version: str | None
    ) -> GenerateRequest | InferenceRequest:
        """A generate body, or a tensor InferenceRequest (JSON or binary tensor data)."""
        self.dataplane.check_model(name, version)
        raw = await read_body(request, self.api.max_request_size)
        header_length = request.headers.get(HEADER_LENGTH)
        if header_length is None:
            document = parse_json(raw)
            if is_generate_body(document):
                try:
                    return GenerateRequest.model_validate(document)
                except ValidationError as exc:
                    raise InvalidInput(validation_message(exc)) from None
            if not isinstance(document, dict) or "inputs" not in document:
                raise InvalidInput("A generate request needs text_input (or, as a tensor request, inputs)")
        return self.api.parse_inference_request(raw, header_length, name, version)

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = []
        for prefix in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
            routes += [
                Route(prefix + "/infer_stream", self.infer_stream, methods=["POST"]),
                Route(prefix + "/generate", self.generate, methods=["POST"]),
                Route(prefix + "/generate_stream", self.generate_stream, methods=["POST"]),
            ]
        return routes
