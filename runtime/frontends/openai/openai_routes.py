"""The OpenAI API's routes on the main REST port: ``/v1/...`` and, as KServe serves them, ``/openai/v1/...``.

``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/embeddings``, and under
``/openai/v1`` those and ``GET /openai/v1/models[/{model}]`` (``GET /v1/models`` is KServe V1's
route, whose one answer serves both protocols' clients: ``runtime.frontends.kserve.v1``). Each request is
translated (:mod:`.openai_requests`, :mod:`.openai_answers`) onto the DataPlane: a choice that does not stream is
``DataPlane.infer``, one that streams is ``DataPlane.infer_stream``, the same calls as OIP's
``generate`` and ``generate_stream``, through the same scheduler and stream pipeline.

Streams are Server-Sent Events: one ``data:`` chunk per model chunk, then the usage chunk (with
``stream_options.include_usage``) and ``data: [DONE]``. An error before the first chunk is
answered with its status; after it, as a ``data: {"error": {...}}`` event, and the stream ends.
A client that goes away cancels its streams: the scheduler drops them before its next step and
frees their slots (``runtime.frontends.rest.sse``). Errors are OpenAI's ``{"error": {"message", "type",
"param", "code"}}``, with the status of the REST transport's table.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from runtime.core.dataplane import DataPlane
from runtime.errors import ServerError
from runtime.frontends.openai.openai_answers import Chunks, answer, embeddings_answer
from runtime.frontends.openai.openai_errors import error_body
from runtime.frontends.openai.openai_requests import (
    Plan,
    chat_plan,
    completion_plan,
    embeddings_request,
    model_of,
    read_json,
)
from runtime.frontends.rest.app import read_body
from runtime.frontends.rest.disconnect import cancel_on_disconnect
from runtime.frontends.rest.model_cards import model_card, models_list
from runtime.frontends.rest.sse import message_event, sse_response
from runtime.frontends.rest.status import headers_of, status_of
from runtime.streams.pipeline import one
from runtime.types import InferenceResponse

PREFIXES = ("/v1", "/openai/v1")

DONE = b"[DONE]"


def _json(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(document), status, headers=headers, media_type="application/json")


def error_response(exc: ServerError) -> Response:
    status = status_of(exc)
    return _json(error_body(exc, status), status, headers_of(exc))


class OpenAIApi:
    """The OpenAI routes over one DataPlane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = [
            Route("/openai/v1/models", self.list_models, methods=["GET"]),
            Route("/openai/v1/models/{model_name}", self.model, methods=["GET"]),
        ]
        for prefix in PREFIXES:
            routes += [
                Route(prefix + "/completions", self.completions, methods=["POST"]),
                Route(prefix + "/chat/completions", self.chat_completions, methods=["POST"]),
                Route(prefix + "/embeddings", self.embeddings, methods=["POST"]),
            ]
        return routes

    async def list_models(self, request: Request) -> Response:
        names = sorted({item.name for item in self.dataplane.registry.index(ready_only=True)})
        return _json(models_list(names))

    async def model(self, request: Request) -> Response:
        name = request.path_params["model_name"]
        try:
            self.dataplane.check_model(name)
        except ServerError as exc:
            return error_response(exc)
        return _json(model_card(name))

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, completion_plan)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat_plan)

    async def _generate(self, request: Request, make_plan: Any) -> Response:
        try:
            body = read_json(await read_body(request, self.dataplane.settings.max_request_size))
            self.dataplane.check_model(model_of(body))
            plan: Plan = make_plan(body)
            if plan.stream:
                return await sse_response(request, self._chunks(plan), message_event, self.dataplane.streams)
            work = asyncio.gather(*(self.dataplane.infer(r, plan.model) for r in plan.requests))
            responses = await cancel_on_disconnect(request, work)
            return _json(answer(plan, list(responses)))
        except ServerError as exc:
            return error_response(exc)

    async def _chunks(self, plan: Plan) -> AsyncGenerator[bytes, None]:
        """The events of a streamed answer (their data documents)."""
        chunks = Chunks(plan)
        started = False
        try:
            async with aclosing(self._merged(plan)) as responses:
                async for index, response in responses:
                    started = True
                    yield orjson.dumps(chunks.chunk(index, response))
        except ServerError as exc:
            if not started:
                raise  # answered with its status
            yield orjson.dumps(error_body(exc, status_of(exc)))
            return
        if plan.include_usage:
            yield orjson.dumps(chunks.usage_chunk())
        yield DONE

    async def _merged(self, plan: Plan) -> AsyncGenerator[tuple[int, InferenceResponse], None]:
        """Every choice's chunks, as they come (one stream each); closing this closes them all."""
        streams = [self.dataplane.infer_stream(one(r), plan.model) for r in plan.requests]
        if len(streams) == 1:
            async with aclosing(streams[0]) as only:
                async for response in only:
                    yield 0, response
            return
        queue: asyncio.Queue[tuple[int, InferenceResponse | BaseException | None]] = asyncio.Queue(
            maxsize=len(streams)
        )

        async def pump(index: int, stream: AsyncGenerator[InferenceResponse, None]) -> None:
            try:
                async with aclosing(stream) as items:
                    async for item in items:
                        await queue.put((index, item))
                await queue.put((index, None))
            except Exception as exc:
                await queue.put((index, exc))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        try:
            running = len(tasks)
            while running:
                index, item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def embeddings(self, request: Request) -> Response:
        try:
            body = read_json(await read_body(request, self.dataplane.settings.max_request_size))
            model = model_of(body)
            self.dataplane.check_model(model)
            inference_request, encoding = embeddings_request(body)
            response = await cancel_on_disconnect(request, self.dataplane.infer(inference_request, model))
            return _json(embeddings_answer(model, response, encoding))
        except ServerError as exc:
            return error_response(exc)
