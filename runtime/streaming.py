"""Streams through the core: requests in, responses out, errors sorted, cancellation passed on.

``DataPlane.infer_stream`` and ``DataPlane.infer_stream_in_band`` run a :class:`StreamSession`.
What it guarantees, whatever the transport:

- **Pull, never push.** The model's generator is advanced only when the consumer asks for the next
  response, so a slow reader slows the model down instead of growing a buffer; the only buffers
  are the transport's own, which are bounded.
- **Fair.** A stream gives the event loop a turn at least every millisecond, even when its model
  never awaits, so it cannot starve other requests or keep a disconnect from being noticed.
- **Cancellation reaches the model.** Closing the stream (``aclose``) or cancelling the task that
  iterates it closes the model's generator (GeneratorExit at its ``yield``) or cancels what it
  awaits (CancelledError), and the scheduler's slot with it. Nothing is left running.
- **Every response names its request.** Each request without an id gets a fresh one before the
  model sees it. A response answers the request whose id the model put in ``response.id`` (one of
  the last ``RECENT_REQUESTS`` it was given), or else the latest request the model has taken. That
  is exact for one request streamed back (unary→stream) and for models that answer each request
  before reading the next (the default ``predict_stream``); a model that reads ahead tags its
  responses itself.
- **Errors are sorted at one place** (:func:`sort_error`): client errors (``ServerError``) pass
  through, cancellation re-raises, anything else the model raised becomes ``ModelFailed`` with the
  cause chained.
- **A bad request never reaches the model.** It ends the model's input, as if the client had
  stopped sending: the model finishes what it was doing and the error follows.

A scheduler whose requests fail one by one (the sequence batcher) yields ``RequestFailed`` for a
failed request: in band it becomes that request's ``StreamError`` and the same model stream goes on.

With errors raised (``infer_stream``), the first error ends the stream. With errors in band
(``infer_stream_in_band``, which ``runtime.routing`` uses for gRPC's ModelStreamInfer), each error is yielded as a
:class:`StreamError` tagged with its request's id and the stream goes on: the requests that follow
a failure are served by a fresh call of the model's ``predict_stream``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from .errors import InvalidInput, ModelFailed, ServerError
from .ids import new_id
from .registry import ModelEntry
from .scheduling import RequestFailed
from .types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

CHECKPOINT_SECONDS = 0.001
"""A stream gives the event loop a turn at least this often, whatever its model does."""

RECENT_REQUESTS = 128
"""How many of a stream's latest requests a model may still answer by id (bounds memory per stream)."""


@dataclass(frozen=True, slots=True)
class StreamError:
    """An error reported in band on a stream that goes on, for the request ``request_id``."""

    error: ServerError
    request_id: str | None
    continues: bool = False
    """True when only this request failed and the model's stream goes on (``RequestFailed``)."""


def sort_error(model: str, exc: Exception) -> ServerError:
    """The one place errors are sorted: ours pass through, the model's become ModelFailed (chained)."""
    if isinstance(exc, ServerError):
        return exc
    logger.error(
        "Model %r failed: %s: %s", model, type(exc).__name__, exc, exc_info=logger.isEnabledFor(logging.DEBUG)
    )
    failed = ModelFailed(f"Model {model!r} failed: {type(exc).__name__}: {exc}")
    failed.__cause__ = exc
    return failed


class StreamCounter:
    """How many streams are running now; ``wait_idle`` returns once none is (tests, draining, gauges)."""

    def __init__(self) -> None:
        self.active = 0
        self.total = 0
        self._idle: asyncio.Event | None = None

    def opened(self) -> None:
        self.active += 1
        self.total += 1
        if self._idle is not None:
            self._idle.clear()

    def closed(self) -> None:
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        if self._idle is None:
            self._idle = asyncio.Event()
        if self.active == 0:
            self._idle.set()
            return
        self._idle.clear()
        await self._idle.wait()


Prepare = Callable[[InferenceRequest, ModelEntry], None]
Finish = Callable[[InferenceResponse, "InferenceRequest | None", ModelEntry], InferenceResponse]


class StreamSession:
    """One client stream served by one model; see the module docstring for what it guarantees.

    ``prepare`` checks a request against the model (raising InvalidInput), ``finish`` checks and
    names a response: the DataPlane's ``prepare_request`` and ``finish_response``.
    """

    def __init__(
        self,
        entry: ModelEntry,
        requests: AsyncIterator[InferenceRequest],
        prepare: Prepare,
        finish: Finish,
    ) -> None:
        self.entry = entry
        self.source = aiter(requests)
        self.prepare = prepare
        self.finish = finish
        self.exhausted = False
        self.recent: OrderedDict[str, InferenceRequest] = OrderedDict()
        self.latest: InferenceRequest | None = None
        self.input_error: StreamError | None = None
        self.source_failure: Exception | None = None

    async def run(self, in_band: bool) -> AsyncGenerator[InferenceResponse | StreamError, None]:
        """Responses (and, in band, errors) until the requests end, the model stops or an error ends it."""
        while True:
            first = await self._next_valid(in_band)
            if isinstance(first, StreamError):
                yield first
                continue
            if first is None:
                return
            failure = None
            async with aclosing(self._serve(first)) as items:
                async for item in items:
                    if isinstance(item, StreamError):
                        if item.continues:  # one request failed; the model's stream goes on
                            if not in_band:
                                raise item.error
                            yield item
                            continue
                        failure = item
                        break
                    yield item
            if self.source_failure is not None:
                raise self.source_failure  # the requests themselves broke: the stream cannot go on
            if failure is None:
                failure = self.input_error
            if failure is None:
                return  # the model finished normally: the stream is complete
            if not in_band:
                raise failure.error
            yield failure
            if self.exhausted:
                return

    async def _next_valid(self, in_band: bool) -> InferenceRequest | StreamError | None:
        """The next request, checked; None when the input has ended."""
        if self.exhausted:
            return None
        try:
            request = await anext(self.source)
        except StopAsyncIteration:
            self.exhausted = True
            return None
        try:
            self._prepare(request)
        except InvalidInput as exc:
            if not in_band:
                raise
            return StreamError(exc, request.id)
        return request

    def _prepare(self, request: InferenceRequest) -> None:
        if request.id is None:
            request.id = new_id()
        self.prepare(request, self.entry)

    async def _serve(self, first: InferenceRequest) -> AsyncGenerator[InferenceResponse | StreamError, None]:
        """One call of the model's stream, from ``first`` until it ends or fails."""
        assert self.entry.scheduler is not None
        self.input_error = None
        self._taken(first)  # from here on, a failure of the model is reported for this request at least
        feed = self._feed(first)
        stream = self.entry.scheduler.stream(feed)
        turn = time.monotonic()
        try:
            async for response in stream:
                if isinstance(response, RequestFailed):
                    yield StreamError(
                        sort_error(self.entry.name, response.error), response.request_id, continues=True
                    )
                    continue
                yield self.finish(response, self._answering(response), self.entry)
                # give the event loop a turn at least every CHECKPOINT_SECONDS: a model that never
                # awaits cannot starve the other streams, nor hide a disconnect or a cancellation
                if time.monotonic() - turn >= CHECKPOINT_SECONDS:
                    await asyncio.sleep(0)
                    turn = time.monotonic()
        except Exception as exc:
            yield StreamError(sort_error(self.entry.name, exc), self.latest.id if self.latest else None)
        finally:
            # close the model's generator (and the scheduler's slot) whatever ended the loop:
            # GeneratorExit, cancellation, an error, or the consumer going away
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
            await feed.aclose()

    async def _feed(self, first: InferenceRequest) -> AsyncGenerator[InferenceRequest, None]:
        """What the model reads: checked requests; a bad one ends the input and is reported."""
        yield first
        while not self.exhausted:
            try:
                request = await anext(self.source)
            except StopAsyncIteration:
                self.exhausted = True
                return
            except Exception as exc:
                self.exhausted = True
                self.source_failure = exc
                return
            try:
                self._prepare(request)
            except InvalidInput as exc:
                self.input_error = StreamError(exc, request.id)
                return
            self._taken(request)
            yield request

    def _taken(self, request: InferenceRequest) -> None:
        assert request.id is not None
        self.latest = request
        self.recent[request.id] = request
        if len(self.recent) > RECENT_REQUESTS:
            self.recent.popitem(last=False)

    def _answering(self, response: InferenceResponse) -> InferenceRequest | None:
        if isinstance(response, InferenceResponse) and response.id is not None:
            request = self.recent.get(response.id)
            if request is not None:
                return request
        return self.latest
