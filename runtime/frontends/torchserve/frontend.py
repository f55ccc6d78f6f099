"""What TorchServe's REST and gRPC front ends share: a request from entries, headers and a sequence
id, and its answers from the DataPlane (translation only; the core decides).

- Sequences: for a sequence model (``sequenceBatching``) the id (header ``ts_request_sequence_id``
  or gRPC ``sequence_id``) and the start/end headers become the OIP sequence parameters; a request
  without an id starts a new sequence (TorchServe makes one), and an id the server has not seen
  opens one (TorchServe does): a request the core refuses as not open (``SequenceNotOpen``, before
  anything ran) is sent again with START. A sequence that ended is still refused. For any other
  model the headers only reach the handler.
- Explanations (``/explanations``, KServe's ``:explain``): the request carries the header
  ``explain: True``, which TorchServe's ``BaseHandler`` reads to call ``explain_handle``, and the
  request parameter ``explain``, so that explanations and predictions never share a batch (the
  handler reads the header of a batch's first request only).
- KServe V1 instances (:meth:`FrontEnd.instances_requests`): one row per instance; a model served by the
  sequence engine or continuous batching takes one row per request, so there each instance is a
  request of its own (for the sequence engine, a sequence of one step).
- Answers: a continuous-batching model, or a plain model served without adaptive batching, is
  served as a stream, so that intermediate answers (``ts_stream_next: true``) reach the client as
  they come; a batched or sequence-batched model answers once (intermediate answers need
  batchSize 1, as TorchServe's StreamPredictions does).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from runtime.core.dataplane import DataPlane
from runtime.errors import SequenceNotOpen
from runtime.sequences.identity import END, ID, START, apply_transport_fields
from runtime.settings import ModelSettings
from runtime.streams.pipeline import one
from runtime.torchserve import PLATFORM
from runtime.torchserve.payload import Answer, Entry, build_instances_request, build_request, read_answers
from runtime.types import InferenceRequest, InferenceResponse, Parameters

HEADER_ID = "ts_request_sequence_id"
HEADER_START = "ts_request_sequence_start"
HEADER_END = "ts_request_sequence_end"
EXPLAIN = "explain"

Answers = AsyncGenerator[tuple[Answer, InferenceResponse], None]


class FrontEnd:
    """TorchServe's request and answer rules over one DataPlane."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    @staticmethod
    def request(
        settings: ModelSettings,
        entries: list[Entry],
        headers: dict[str, str],
        sequence_id: str | None,
        explain: bool = False,
    ) -> InferenceRequest:
        """The InferenceRequest for one TorchServe request to the model of ``settings``;
        ``headers`` has lower-case names (as HTTP/2, ASGI and gRPC metadata give them)."""
        if sequence_id and headers.get(HEADER_ID) != sequence_id:
            headers = {**headers, HEADER_ID: sequence_id}
        if explain:
            headers = {**headers, EXPLAIN: "True"}
        request = build_request(entries, headers)
        if explain:
            _mark_explain(request)
        if settings.sequence_batching:
            fields: dict[str, object] = {ID: sequence_id} if sequence_id else {START: True}
            for header, field in ((HEADER_START, START), (HEADER_END, END)):
                if header in headers:
                    fields[field] = headers[header]
            apply_transport_fields(request, fields)
        return request

    def instances_requests(
        self, name: str, version: str | None, instances: list[Any], headers: dict[str, str], explain: bool
    ) -> list[InferenceRequest]:
        """The InferenceRequests for the instances of one KServe V1 request: one request of one
        row per instance, or one request for a model that takes one row per request."""
        settings = self.dataplane.registry.serving(name, version).settings
        if explain:
            headers = {**headers, EXPLAIN: "True"}
        if settings.sequence_batching or settings.continuous_batching:
            groups = [[instance] for instance in instances]
        else:
            groups = [instances]
        requests = []
        for group in groups:
            request = build_instances_request(group, headers)
            if explain:
                _mark_explain(request)
            if settings.sequence_batching:  # V1 has no sequences: each instance is one of its own
                apply_transport_fields(request, {START: True, END: True})
            requests.append(request)
        return requests

    async def answer(
        self, request: InferenceRequest, name: str, version: str | None
    ) -> tuple[Answer, InferenceResponse]:
        """The one answer of a model that does not stream (see ``streamed``)."""
        try:
            response = await self.dataplane.infer(request, name, version)
        except SequenceNotOpen:
            apply_transport_fields(request, {START: True})
            response = await self.dataplane.infer(request, name, version)
        return read_answers(response)[0], response

    async def answers(
        self, request: InferenceRequest, name: str, version: str | None, settings: ModelSettings
    ) -> Answers:
        """The answers to one request: one, or several for a streamed answer."""
        if not streamed(settings):
            yield await self.answer(request, name, version)
            return
        answers = self._stream(request, name, version)
        try:
            first = await anext(answers)
        except SequenceNotOpen:
            await answers.aclose()
            apply_transport_fields(request, {START: True})
            answers = self._stream(request, name, version)
            first = await anext(answers)
        async with aclosing(answers):
            yield first
            async for item in answers:
                yield item

    async def _stream(self, request: InferenceRequest, name: str, version: str | None) -> Answers:
        async with aclosing(self.dataplane.infer_stream(one(request), name, version)) as responses:
            async for response in responses:
                for answer in read_answers(response):
                    yield answer, response


def is_handler(settings: ModelSettings) -> bool:
    """Whether the model is a TorchServe handler (from an archive or its folder)."""
    return settings.platform == PLATFORM


def streamed(settings: ModelSettings) -> bool:
    """Whether the model's answers are served as a stream (they may come in several parts)."""
    batched = settings.max_batch_size > 1 and settings.max_batch_time > 0
    return settings.continuous_batching or not (settings.sequence_batching or batched)


def _mark_explain(request: InferenceRequest) -> None:
    if request.parameters is None:
        request.parameters = Parameters(**{EXPLAIN: True})
    else:
        setattr(request.parameters, EXPLAIN, True)
