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
``runtime.core.generate``); these handlers only translate. Errors before the first event are JSON errors
with the status of ``runtime.frontends.rest.status``; after it, ``event: error`` (see ``runtime.frontends.rest.sse``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime.core.generate import GenerateRequest, GenerateResponse, is_generate_body
from runtime.errors import InvalidInput
from runtime.frontends.rest.app import RestApi, _model, json_response, read_request
from runtime.frontends.rest.codec import dumps, encode_response, parse_json, validation_message
from runtime.frontends.rest.disconnect import cancel_on_disconnect
from runtime.frontends.rest.sequence import sequence_headers
from runtime.frontends.rest.sse import message_event, sse_response
from runtime.sequences.identity import apply_headers
from runtime.streams.pipeline import one
from runtime.types import InferenceRequest, InferenceResponse

Answer = Callable[[InferenceResponse], GenerateResponse]
"""Turns a response into a generate answer (None: the body was a tensor request, answered as such)."""


def _response_event(response: InferenceResponse) -> bytes:
    body, _ = encode_response(response, None)  # events are JSON: binary outputs cannot ride in SSE
    return message_event(body)


def _generate_event(answer: GenerateResponse) -> bytes:
    return message_event(dumps(answer))


async def _answers(
    responses: AsyncGenerator[InferenceResponse, None], answer: Answer
) -> AsyncGenerator[GenerateResponse, None]:
    """The generate answers of a stream of responses (closing this closes the model's stream)."""
    async with aclosing(responses) as items:
        async for response in items:
            yield answer(response)


class StreamingApi:
    """The streaming and generate handlers, on top of the REST API's body parsing.

    ``generate`` is served as ``/infer`` and ``generate_stream`` as ``/infer_stream``: the same
    request reading (TorchServe's sequence headers included), the same core calls, the same
    cancellation when the client goes away; only the body and the answers are translated.
    """

    def __init__(self, api: RestApi) -> None:
        self.api = api
        self.dataplane = api.dataplane

    async def infer_stream(self, request: Request) -> Response:
        name, version = _model(request)
        inference_request = await self.api.read_inference_request(
            request.scope, request.receive, name, version
        )
        return await self._stream(request, inference_request, name, version, None)

    async def generate(self, request: Request) -> Response:
        name, version = _model(request)
        inference_request, answer = await self._read_generate(request, name, version)
        work = self.dataplane.infer(inference_request, name, version)
        response = await cancel_on_disconnect(request, work)
        headers = sequence_headers(response)
        if answer is not None:
            return json_response(answer(response), headers=headers)
        encoded, binary = encode_response(response, inference_request)
        media = "application/octet-stream" if binary else "application/json"
        return Response(encoded, media_type=media, headers={**binary, **headers})

    async def generate_stream(self, request: Request) -> Response:
        name, version = _model(request)
        inference_request, answer = await self._read_generate(request, name, version)
        return await self._stream(request, inference_request, name, version, answer)

    async def _stream(
        self,
        request: Request,
        inference_request: InferenceRequest,
        name: str,
        version: str | None,
        answer: Answer | None,
    ) -> Response:
        """One request streamed back as Server-Sent Events (infer_stream and generate_stream)."""
        streams = self.dataplane.streams
        responses = self.dataplane.infer_stream(one(inference_request), name, version)
        if answer is None:
            return await sse_response(request, responses, _response_event, streams)
        return await sse_response(request, _answers(responses, answer), _generate_event, streams)

    async def _read_generate(
        self, request: Request, name: str, version: str | None
    ) -> tuple[InferenceRequest, Answer | None]:
        """The request a generate body stands for and how to answer it; or a tensor
        InferenceRequest (JSON or binary tensor data), answered as ``/infer`` answers it."""
        self.dataplane.check_model(name, version)
        raw, header_length, sequence = await read_request(
            request.scope, request.receive, self.api.max_request_size
        )
        answer: Answer | None = None
        if header_length is None:
            document = parse_json(raw)
            if is_generate_body(document):
                try:
                    body = GenerateRequest.model_validate(document)
                except ValidationError as exc:
                    raise InvalidInput(validation_message(exc)) from None
                inference_request, answer = self.dataplane.generate_request(body, name, version)
            elif not isinstance(document, dict) or "inputs" not in document:
                raise InvalidInput("A generate request needs text_input (or, as a tensor request, inputs)")
        if answer is None:
            inference_request = self.api.parse_inference_request(raw, header_length, name, version)
        if sequence is not None:
            apply_headers(inference_request, sequence)
        return inference_request, answer

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = []
        for prefix in ("/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"):
            routes += [
                Route(prefix + "/infer_stream", self.infer_stream, methods=["POST"]),
                Route(prefix + "/generate", self.generate, methods=["POST"]),
                Route(prefix + "/generate_stream", self.generate_stream, methods=["POST"]),
            ]
        return routes
