"""The one stream pipeline: requests in, ordered answers out, cancellation that reaches the model,
and the one form of a stream's failure (:class:`StreamError`). Every streaming front end goes
through it: SSE (``infer_stream``, ``generate_stream``) and both gRPC ModelStreamInfer formats
(``runtime.core.client_streams``). Reading ahead within a bounded window is
``runtime.streams.window``'s.

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
- **Every response names its request.** Each request without an id gets a fresh one
  (``runtime.ids.assign_id``, the one place request ids are made) before the model sees it. A response
  answers the request whose id the model put in ``response.id`` (one of the last
  ``RECENT_REQUESTS`` it was given), or else the latest request the model has taken. That is exact
  for one request streamed back (unary→stream) and for models that answer each request before
  reading the next (the default ``predict_stream``); a model that reads ahead tags its responses
  itself.
- **Errors are sorted at one place** (:func:`sort_error`): client errors (``ServerError``) pass
  through, cancellation re-raises, anything else the model raised becomes ``ModelFailed`` with the
  cause chained.
- **A bad request never reaches the model.** It ends the model's input, as if the client had
  stopped sending: the model finishes what it was doing and the error follows.

A scheduler whose requests fail one by one (the sequence and continuous batchers) yields a
``StreamError`` for a failed request, and the same model stream goes on; the session sorts its
error and passes it on.

With errors raised (``infer_stream``), the first error ends the stream. With errors in band
(``infer_stream_in_band``, which ``runtime.core.client_streams`` uses for gRPC's
ModelStreamInfer), each error is yielded as a :class:`StreamError` tagged with its request's id and
the stream goes on: the requests that follow a failure are served by a fresh call of the model's
``predict_stream``.

This module depends only on the types and errors, so the dataplane and the schedulers both import it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Generic, TypeVar

from runtime.errors import InvalidInput, ServerError, model_failed
from runtime.ids import assign_id
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

V = TypeVar("V")

CHECKPOINT_SECONDS = 0.001
"""A stream gives the event loop a turn at least this often, whatever its model does."""

RECENT_REQUESTS = 128
"""How many of a stream's latest requests a model may still answer by id (bounds memory per stream)."""


async def one(request: InferenceRequest) -> AsyncGenerator[InferenceRequest, None]:
    """A stream of the single request ``request`` (unary in, streamed out)."""
    yield request


class Recent(Generic[V]):
    """What a stream remembers of its latest requests, by id: an answer finds the request it names
    (one of the last ``RECENT_REQUESTS``), or else the latest one taken."""

    __slots__ = ("by_id", "latest", "latest_id")

    def __init__(self) -> None:
        self.by_id: OrderedDict[str, V] = OrderedDict()
        self.latest: V | None = None
        self.latest_id: str | None = None

    def take(self, request_id: str, value: V) -> None:
        self.latest, self.latest_id = value, request_id
        self.by_id[request_id] = value
        if len(self.by_id) > RECENT_REQUESTS:
            self.by_id.popitem(last=False)

    def find(self, request_id: str | None) -> V | None:
        """What ``request_id`` names, or the latest request's when it names none remembered."""
        if request_id is not None:
            found = self.by_id.get(request_id)
            if found is not None:
                return found
        return self.latest


@dataclass(slots=True)
class StreamError:
    """A request of a stream failed: the one form a stream's failure takes, from where it happens
    to the transport that reports it, unchanged on its way.

    Made where the request fails: a scheduler whose requests fail one by one (the continuous and
    sequence batchers: the request was refused, or its step failed, and the stream goes on), this
    session (the request failed its checks, or the model's stream failed), a client stream's
    router (``runtime.core.client_streams``: the request could not be decoded or names no model).
    The session sorts its ``error`` once (``sort_error``: the model's own exceptions become
    ``ModelFailed``). Then each transport reports it in its one function: in band where the stream
    goes on (gRPC's ``in_band_error``), or raised as its error where the first one ends the stream
    (``DataPlane.infer_stream``, then SSE's ``error_event``).
    """

    error: Exception
    request_id: str | None
    """The id of the request that failed (None: a request the client sent without one, refused
    before it was given one)."""
    continues: bool = True
    """Only this request failed and the model's stream goes on (False: the model's stream
    ended with it, and the session starts a fresh one for the requests that follow)."""


def sort_error(model: str, exc: Exception) -> ServerError:
    """The one place errors are sorted: ours pass through, the model's become ModelFailed (chained)."""
    if isinstance(exc, ServerError):
        return exc
    logger.error(
        "Model %r failed: %s: %s", model, type(exc).__name__, exc, exc_info=logger.isEnabledFor(logging.DEBUG)
    )
    return model_failed(model, exc)


Prepare = Callable[[InferenceRequest], None]
"""Checks a request against the model (raising InvalidInput)."""
Finish = Callable[[InferenceResponse, "InferenceRequest | None"], InferenceResponse]
"""Checks a response and names it after the request it answers."""
Serve = Callable[[AsyncIterator[InferenceRequest]], AsyncIterator["InferenceResponse | StreamError"]]
"""The model's stream through its scheduler (``Scheduler.stream``)."""


class StreamSession:
    """One client stream served by one model; see the module docstring for what it guarantees.

    ``serve`` runs the model's stream (its scheduler's ``stream``); ``prepare`` checks a request
    against the model (raising InvalidInput), ``finish`` checks and names a response: the
    DataPlane's ``prepare_request`` and ``finish_response`` for the model ``model``.
    """

    def __init__(
        self,
        model: str,
        serve: Serve,
        requests: AsyncIterator[InferenceRequest],
        prepare: Prepare,
        finish: Finish,
    ) -> None:
        self.model = model
        self.serve = serve
        self.source = aiter(requests)
        self.prepare = prepare
        self.finish = finish
        self.exhausted = False
        self.recent: Recent[InferenceRequest] = Recent()
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
        assign_id(request)
        self.prepare(request)

    async def _serve(self, first: InferenceRequest) -> AsyncGenerator[InferenceResponse | StreamError, None]:
        """One call of the model's stream, from ``first`` until it ends or fails."""
        self.input_error = None
        self._taken(first)  # from here on, a failure of the model is reported for this request at least
        feed = self._feed(first)
        stream = self.serve(feed)
        turn = time.monotonic()
        try:
            async for response in stream:
                if isinstance(response, StreamError):  # one request failed; the stream goes on
                    response.error = sort_error(self.model, response.error)
                    yield response
                    continue
                yield self.finish(response, self._answering(response))
                # give the event loop a turn at least every CHECKPOINT_SECONDS: a model that never
                # awaits cannot starve the other streams, nor hide a disconnect or a cancellation
                if time.monotonic() - turn >= CHECKPOINT_SECONDS:
                    await asyncio.sleep(0)
                    turn = time.monotonic()
        except Exception as exc:
            yield StreamError(sort_error(self.model, exc), self.recent.latest_id, continues=False)
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
                self.input_error = StreamError(exc, request.id, continues=False)
                return
            self._taken(request)
            yield request

    def _taken(self, request: InferenceRequest) -> None:
        assert request.id is not None
        self.recent.take(request.id, request)

    def _answering(self, response: InferenceResponse) -> InferenceRequest | None:
        return self.recent.find(response.id if isinstance(response, InferenceResponse) else None)
