"""TorchServe handlers as models of this server (``implementation`` of an archive's settings).

- ``HandlerModel``: a plain handler. ``predict`` runs a batch (the adaptive batcher merges
  requests when the archive's ``batchSize`` > 1); ``predict_stream`` runs one request and yields
  every intermediate answer the handler sends (``send_intermediate_predict_response``) before its
  last one, which is how streamed (chunked) answers reach the client.
- ``HandlerSequenceModel``: ``sequenceBatching``; one request per sequence per batch; the handler
  reads the sequence from ``ctx.get_sequence_id(idx)`` and the start header, and keeps its own
  state, as in TorchServe.
- ``HandlerContinuousModel``: ``continuousBatching`` (with or without sequences): every step runs
  the handler on all running requests; an answer marked ``ts_stream_next: true`` (by the
  handler's stopping criteria or by an intermediate send) is a chunk and the request stays for
  the next step; a handler's response header ``ts_request_sequence_end`` ends its sequence.

Handlers are synchronous; each model runs its handler on one thread of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from runtime.continuous import ContinuousModel, StepResult, Stream
from runtime.errors import ModelFailed
from runtime.ids import assign_id
from runtime.model import MLModel
from runtime.sequences.sequence_model import SequenceModel, SequenceStep
from runtime.settings import ModelSettings
from runtime.torchserve.archive import kept, read_manifest
from runtime.torchserve.handler import HandlerRunner
from runtime.torchserve.payload import Answer, Row, answers_response, read_rows
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

SEQUENCE_ID = "ts_request_sequence_id"
SEQUENCE_START = "ts_request_sequence_start"
SEQUENCE_END = "ts_request_sequence_end"


def _model_dir(settings: ModelSettings) -> Path:
    uri = settings.parameters.uri if settings.parameters else None
    if uri:
        return Path(uri)
    if settings.folder is not None:
        return settings.folder
    raise ModelFailed(f"Model {settings.name!r} names no archive folder (parameters.uri)")


class _HandlerMixin:
    """Loading the handler and running batches on the model's thread."""

    settings: ModelSettings
    name: str
    runner: HandlerRunner
    _executor: ThreadPoolExecutor

    def _setup(self) -> None:
        model_dir = _model_dir(self.settings)
        manifest = kept(self.settings).get("manifest") or read_manifest(model_dir)
        batch_size = max(self.settings.max_batch_size, 1)
        self.runner = HandlerRunner(self.settings.name, model_dir, manifest, batch_size)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"handler-{self.settings.name}")

    async def _load_handler(self) -> bool:
        self._setup()
        await asyncio.get_running_loop().run_in_executor(self._executor, self.runner.load)
        return True

    async def _unload_handler(self) -> bool:
        self._executor.shutdown(wait=True)
        return True

    async def _run(
        self,
        rows: list[Row],
        extra_headers: list[dict[str, str]] | None = None,
        sink: Any = None,
    ) -> list[Answer]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.runner.run, rows, sink, extra_headers)

    def _rows(self, request: InferenceRequest) -> list[Row]:
        return read_rows(request, assign_id(request))


class HandlerModel(_HandlerMixin, MLModel):
    """A plain TorchServe handler (see the module docstring)."""

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)

    async def load(self) -> bool:
        return await self._load_handler()

    async def unload(self) -> bool:
        return await self._unload_handler()

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        answers = await self._run(self._rows(payload))
        return answers_response(answers)

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            async for response in self._streamed(payload):
                yield response

    async def _streamed(self, payload: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """One request: each intermediate answer as it is sent, then the last one."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[list[Answer] | None] = asyncio.Queue()

        def sink(answers: list[Answer]) -> None:  # on the handler's thread
            loop.call_soon_threadsafe(chunks.put_nowait, answers)

        task = asyncio.ensure_future(self._run(self._rows(payload), sink=sink))
        task.add_done_callback(lambda _: chunks.put_nowait(None))
        try:
            while (item := await chunks.get()) is not None:
                for answer in item:  # an intermediate answer is never the last one
                    answer.headers["ts_stream_next"] = "true"
                yield answers_response(item)
            last = await task
            for answer in last:
                if answer.headers.get("ts_stream_next") == "true":
                    answer.headers["ts_stream_next"] = "false"
            yield answers_response(last)
        finally:
            if not task.done():  # a handler cannot be interrupted; it finishes on its thread
                task.add_done_callback(_ignore_result)


def _ignore_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _sequence_headers(sequence_id: str, start: bool) -> dict[str, str]:
    headers = {SEQUENCE_ID: sequence_id}
    if start:
        headers[SEQUENCE_START] = "true"
    return headers


class HandlerSequenceModel(_HandlerMixin, SequenceModel):
    """A TorchServe handler under sequence batching (``sequenceBatching: true``)."""

    async def load(self) -> bool:
        return await self._load_handler()

    async def unload(self) -> bool:
        return await self._unload_handler()

    async def predict_sequences(
        self, steps: list[SequenceStep]
    ) -> Sequence[InferenceResponse | BaseException]:
        rows: list[Row] = []
        extra: list[dict[str, str]] = []
        for step in steps:
            (row,) = self._rows(step.request)
            rows.append(row)
            extra.append(_sequence_headers(step.sequence_id, step.start))
        answers = await self._run(rows, extra)
        responses: list[InferenceResponse | BaseException] = []
        for step, answer in zip(steps, answers, strict=True):
            if SEQUENCE_END in answer.headers:
                step.end_sequence()
            responses.append(answers_response([answer]))
        return responses


class HandlerContinuousModel(_HandlerMixin, ContinuousModel):
    """A TorchServe handler under continuous batching (``continuousBatching: true``)."""

    async def load(self) -> bool:
        return await self._load_handler()

    async def unload(self) -> bool:
        return await self._unload_handler()

    async def start_stream(self, stream: Stream) -> None:
        (row,) = self._rows(stream.request)
        stream.state = row

    def step(self, streams: list[Stream]) -> list[StepResult]:
        rows: list[Row] = [stream.state for stream in streams]
        # the start header marks a request's first step only: a request that streams on is not
        # the start of its sequence again at every step
        extra = [
            _sequence_headers(s.sequence.id, s.sequence.start and s.steps == 0)
            if s.sequence is not None
            else {}
            for s in streams
        ]
        chunks: dict[int, list[Answer]] = {}

        def sink(answers: list[Answer]) -> None:
            for i, answer in enumerate(answers):
                answer.headers["ts_stream_next"] = "true"
                chunks.setdefault(i, []).append(answer)

        # ``step`` already runs on the model's step thread: call the handler here, directly
        answers = self.runner.run(rows, sink, extra)
        results: list[StepResult] = []
        for i, (stream, answer) in enumerate(zip(streams, answers, strict=True)):
            if stream.sequence is not None and SEQUENCE_END in answer.headers:
                stream.sequence.end_sequence()
            pieces = [*chunks.get(i, []), answer]
            finished = not answer.streams_on
            results.append(
                StepResult(answers_response(pieces) if len(pieces) == 1 else _joined(pieces), finished)
            )
        return results

    def combine(self, stream: Stream, chunks: list[InferenceResponse]) -> InferenceResponse:
        return chunks[-1]


def _joined(pieces: list[Answer]) -> InferenceResponse:
    """Intermediate answers sent during one step and the step's own answer, as one chunk."""
    last = pieces[-1]
    return answers_response(
        [Answer(b"".join(p.body for p in pieces), last.status, last.phrase, last.headers)]
    )
