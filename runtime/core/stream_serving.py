"""The DataPlane's stream serving: streams of requests to one model, and client streams whose
requests each name their model.

Each stream takes its model's entry for as long as it runs, goes through the one stream pipeline
(``runtime.streams.pipeline``) with the request checks (``runtime.core.request_checks``) on each of
its requests and responses, and is counted (``streams``) and observed like a unary request.
:class:`StreamServing` is the part of :class:`runtime.core.dataplane.DataPlane` that serves them.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, TypeVar

from runtime.core.client_streams import ModelStream, Reply, Routed, each, in_sessions
from runtime.core.observer import Observer
from runtime.core.registry import Registry
from runtime.core.request_checks import finish_response, prepare_request
from runtime.errors import ServerError
from runtime.streams.pipeline import StreamError, StreamSession
from runtime.streams.stream_counter import StreamCounter
from runtime.streams.window import READ_AHEAD
from runtime.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from runtime.core.model_table import ModelEntry

T = TypeVar("T")
E = TypeVar("E", bound=Exception)


class StreamServing:
    """Streams of requests, whatever the transport (the DataPlane's; it sets the attributes below)."""

    registry: Registry
    streams: StreamCounter
    """Streams being served now (every transport, every model)."""
    observer: Observer | None

    if TYPE_CHECKING:  # the DataPlane's own, by which its unary requests find and report a model

        def check_model(self, name: str, version: str | None = None) -> ModelEntry: ...

        def _entry(self, name: str, version: str | None) -> ModelEntry: ...

        def _shown(self, error: E) -> E: ...

    async def infer_stream(
        self, requests: AsyncIterator[InferenceRequest], name: str, version: str | None = None
    ) -> AsyncGenerator[InferenceResponse, None]:
        """Serve a stream of requests with the model's ``predict_stream``; the first error ends it.

        Nothing runs until the first response is asked for; the model and the first request are
        checked then, so a transport can report those errors before it starts its own stream.
        Responses are pulled from the model only as fast as they are asked for; closing this
        iterator (or cancelling its task) closes the model's generator. See ``runtime.streams.pipeline``.
        """
        async with aclosing(self._stream(requests, name, version, in_band=False)) as items:
            async for item in items:
                if isinstance(item, StreamError):
                    raise item.error
                yield item

    def infer_stream_in_band(
        self, requests: AsyncIterator[InferenceRequest], name: str, version: str | None = None
    ) -> AsyncGenerator[InferenceResponse | StreamError, None]:
        """Like ``infer_stream``, but each request's error is yielded in band and the stream goes on.

        A request that fails its checks is answered by a ``StreamError`` (the model never sees it);
        when the model fails, the error is yielded and the requests after it are served by a fresh
        call of its ``predict_stream``. Errors of the model or version themselves still raise
        (at the first step, as with ``infer_stream``).
        """
        return self._stream(requests, name, version, in_band=True)

    def infer_routed(self, items: AsyncIterator[Routed[T]]) -> AsyncGenerator[Reply[T], None]:
        """Serve a client stream whose requests each name their model, MLServer's way.

        Consecutive requests for one model feed one ``infer_stream_in_band``; errors are replies
        and the stream goes on. See ``runtime.core.client_streams`` (gRPC ModelStreamInfer, default format).
        """
        return in_sessions(self.model_stream, items)

    def infer_each(
        self, items: AsyncIterator[Routed[T]], limit: int = READ_AHEAD
    ) -> AsyncGenerator[Reply[T], None]:
        """Serve a client stream whose requests each name their model, Triton's way.

        Every request is a stream of its own, at most ``limit`` at a time; each ends with one
        ``last`` reply. See ``runtime.core.client_streams`` (gRPC ModelStreamInfer, Triton format).
        """
        return each(self.model_stream, items, limit)

    def model_stream(self, name: str, version: str | None, in_band: bool) -> ModelStream:
        """Check the model ``name`` (raising its ServerError now) and give what serves a stream of
        requests to it, like ``infer_stream_in_band`` (``in_band``) or ``infer_stream``: what
        the client streams (``runtime.core.client_streams``) are handed, so that they need
        nothing else of the DataPlane."""
        self.check_model(name, version)
        return functools.partial(self._stream, name=name, version=version, in_band=in_band)

    async def _stream(
        self, requests: AsyncIterator[InferenceRequest], name: str, version: str | None, in_band: bool
    ) -> AsyncGenerator[InferenceResponse | StreamError, None]:
        entry = await self.registry.acquire(self.check_model(name, version))
        assert entry.scheduler is not None
        session = StreamSession(
            entry.name,
            entry.scheduler.stream,
            requests,
            lambda request: prepare_request(request, entry.settings),
            lambda response, request: finish_response(response, request, entry.settings),
        )
        self.streams.opened()
        observed = self.observer.stream(entry.name, entry.version) if self.observer is not None else None
        ended = False  # the stream ran to its end, or ended with its error: not left by the client
        try:
            async with aclosing(session.run(in_band)) as items:
                async for item in items:
                    if isinstance(item, StreamError):
                        self._shown(item.error)
                    if observed is not None:
                        observed.event()
                        ended = not in_band and isinstance(item, StreamError)
                    yield item
            ended = True
        except Exception as exc:
            ended = True
            if isinstance(exc, ServerError):
                self._shown(exc)
            raise
        finally:
            Registry.release(entry)
            self.streams.closed()
            if observed is not None:
                observed.close(cancelled=not ended)
