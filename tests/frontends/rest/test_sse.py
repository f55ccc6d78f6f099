"""Server-Sent Events (``runtime.frontends.rest.sse``): the bytes of each event, the wait for the
first item, and the streamed response driven as an ASGI app in this process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

import orjson
import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from runtime.errors import InvalidInput, ShuttingDown
from runtime.frontends.rest.sse import (
    END,
    PING_SECONDS,
    encode_event,
    error_event,
    first_or_disconnect,
    message_event,
    sse_response,
)
from runtime.streams.stream_counter import StreamCounter, cut_error

pytestmark = pytest.mark.anyio

SCOPE: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": []}
CUT_EVENT = (
    b"event: error\r\n"
    b'data: {"error":"The server is shutting down: the stream was cut at the end of the grace period"}\r\n\r\n'
)


class Client:
    """The client's side of one ASGI call: what it is sent, and when it goes away."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def request(self) -> Request:
        return Request(SCOPE, self.receive)

    @property
    def body(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


class Model:
    """A model's stream: yields its items, then waits (for ever unless ``more`` is set), and says
    what happened to it: how often it was pulled, whether it saw CancelledError, whether it closed."""

    def __init__(self, *items: int, fail: BaseException | None = None) -> None:
        self.items = items
        self.fail = fail
        self.pulled = 0
        self.waiting = asyncio.Event()
        self.more = asyncio.Event()
        self.cancelled = False
        self.closed = False

    async def stream(self) -> AsyncGenerator[int, None]:
        try:
            for item in self.items:
                self.pulled += 1
                yield item
            if self.fail is not None:
                raise self.fail
            self.pulled += 1
            self.waiting.set()
            await self.more.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed = True


def encode(item: int) -> bytes:
    return message_event(orjson.dumps({"n": item}))


async def streamed(client: Client, model: Model, streams: StreamCounter | None = None) -> Response:
    """The response ``sse_response`` gives, played to ``client`` to its end."""
    response = await sse_response(client.request(), model.stream(), encode, streams)
    await response(SCOPE, client.receive, client.send)
    return response


# the bytes of an event


def test_a_message_is_one_data_line_and_a_blank_line() -> None:
    assert message_event(b'{"a":1}') == b'data: {"a":1}\r\n\r\n'
    assert encode_event({"event": "message", "data": b"[]"}) == b"data: []\r\n\r\n"


def test_an_error_event_is_named_and_carries_the_error_document() -> None:
    assert (
        encode_event({"event": "error", "data": b'{"error":"x"}'})
        == b'event: error\r\ndata: {"error":"x"}\r\n\r\n'
    )
    assert error_event(InvalidInput('two\nlines, one "quote"')) == (
        b'event: error\r\ndata: {"error":"two\\nlines, one \\"quote\\""}\r\n\r\n'
    )
    assert error_event(cut_error()) == CUT_EVENT


def test_an_unexpected_error_is_an_internal_error_event_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="runtime.frontends.rest.sse"):
        event = error_event(RuntimeError("boom"))
    assert event == b'event: error\r\ndata: {"error":"Internal server error: RuntimeError: boom"}\r\n\r\n'
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "RuntimeError: boom" in record.getMessage()


# waiting for the first item


async def test_the_first_item_is_returned_and_the_stream_left_open() -> None:
    model = Model(1, 2)
    items = model.stream()
    assert await first_or_disconnect(Client().request(), items) == 1
    assert await anext(items) == 2 and not model.closed
    await items.aclose()


async def test_a_stream_without_items_gives_end() -> None:
    model = Model()
    model.more.set()
    assert await first_or_disconnect(Client().request(), model.stream()) is END
    assert model.closed


async def test_an_error_before_the_first_item_propagates() -> None:
    model = Model(fail=InvalidInput("bad request"))
    with pytest.raises(InvalidInput, match="bad request"):
        await first_or_disconnect(Client().request(), model.stream())
    assert model.closed


async def test_a_client_gone_before_the_first_item_cancels_the_model_and_gives_none() -> None:
    model, client = Model(), Client()
    waiting = asyncio.ensure_future(first_or_disconnect(client.request(), model.stream()))
    await model.waiting.wait()
    client.gone.set()
    assert await waiting is None
    assert model.cancelled and model.closed


async def test_a_client_gone_by_the_time_the_first_item_is_ready_gets_no_stream() -> None:
    """The race: the first item and the client's disconnect arrive together; the client wins, and
    the item (which nobody would read) is dropped with the model's stream closed."""
    model, client = Model(1), Client()
    client.gone.set()
    assert await first_or_disconnect(client.request(), model.stream()) is None
    assert model.pulled == 1 and model.closed and not model.cancelled


async def test_a_receive_that_fails_counts_as_the_client_gone() -> None:
    model = Model()

    async def receive() -> Message:
        await model.waiting.wait()
        raise OSError("connection reset")

    assert await first_or_disconnect(Request(SCOPE, receive), model.stream()) is None
    assert model.cancelled and model.closed


async def test_the_end_of_the_grace_period_before_the_first_item_is_shutting_down() -> None:
    model, streams = Model(), StreamCounter()
    waiting = asyncio.ensure_future(first_or_disconnect(Client().request(), model.stream(), streams))
    await model.waiting.wait()
    streams.cut_now()
    with pytest.raises(ShuttingDown, match="cut at the end of the grace period"):
        await waiting
    assert model.cancelled and model.closed


async def test_a_stream_cut_already_is_shutting_down_at_once() -> None:
    model, streams = Model(), StreamCounter()
    streams.cut_now()
    with pytest.raises(ShuttingDown):
        await first_or_disconnect(Client().request(), model.stream(), streams)
    assert model.cancelled and model.closed


# the streamed response


async def test_each_item_is_one_event_sent_as_it_comes_then_the_end() -> None:
    model, client = Model(1, 2), Client()
    model.more.set()
    response = await streamed(client, model)
    start = client.sent[0]
    assert (start["type"], start["status"]) == ("http.response.start", 200)
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert (headers["cache-control"], headers["connection"], headers["x-accel-buffering"]) == (
        "no-store",
        "keep-alive",
        "no",
    )
    assert client.body == [b'data: {"n":1}\r\n\r\n', b'data: {"n":2}\r\n\r\n', b""]
    assert [m["more_body"] for m in client.sent[1:]] == [True, True, False]
    assert model.closed and not model.cancelled
    assert getattr(response, "ping_interval", None) == PING_SECONDS  # keep-alive comments on an idle stream


async def test_a_stream_without_items_is_a_200_without_events() -> None:
    model, client = Model(), Client()
    model.more.set()
    await streamed(client, model)
    assert client.sent[0]["status"] == 200 and client.body == [b""]


async def test_a_failure_after_the_first_item_is_an_error_event_that_ends_the_stream() -> None:
    model, client = Model(1, fail=InvalidInput("broke after one")), Client()
    await streamed(client, model)
    assert client.sent[0]["status"] == 200
    assert client.body == [
        b'data: {"n":1}\r\n\r\n',
        b'event: error\r\ndata: {"error":"broke after one"}\r\n\r\n',
        b"",
    ]
    assert model.closed


async def test_a_client_gone_before_the_first_item_gets_a_499_nobody_reads() -> None:
    model, client = Model(), Client()
    answer = asyncio.ensure_future(sse_response(client.request(), model.stream(), encode))
    await model.waiting.wait()
    client.gone.set()
    response = await answer
    assert type(response) is Response and response.status_code == 499
    assert model.cancelled and model.closed


async def test_a_client_gone_mid_stream_cancels_the_model_and_ends_the_response() -> None:
    model, client = Model(1), Client()
    play = asyncio.ensure_future(streamed(client, model))
    await model.waiting.wait()  # the first event is out, the model works on the next
    client.gone.set()
    await play
    assert client.body == [b'data: {"n":1}\r\n\r\n']  # no end of body: nobody is left to read it
    assert model.cancelled and model.closed


async def test_the_end_of_the_grace_period_while_the_model_works_ends_the_stream_in_band() -> None:
    """The race: the cut cancels the task that waits for the model's next item; that cancellation
    must end the stream with the error event and not escape as the response's own cancellation."""
    model, client, streams = Model(1), Client(), StreamCounter()
    play = asyncio.ensure_future(streamed(client, model, streams))
    await model.waiting.wait()
    streams.cut_now()
    await play
    assert client.body == [b'data: {"n":1}\r\n\r\n', CUT_EVENT, b""]
    assert model.cancelled and model.closed


async def test_the_end_of_the_grace_period_while_an_event_is_sent_ends_the_stream_after_it() -> None:
    model, streams = Model(1, 2), StreamCounter()

    class CutWhileSending(Client):
        async def send(self, message: Message) -> None:
            await super().send(message)
            if message.get("body") == b'data: {"n":1}\r\n\r\n':
                streams.cut_now()

    client = CutWhileSending()
    await streamed(client, model, streams)
    assert client.body == [b'data: {"n":1}\r\n\r\n', CUT_EVENT, b""]
    assert model.pulled == 1  # the next item was never asked for
    assert model.closed and not model.cancelled


async def test_events_go_out_without_a_timeout_and_with_one_when_one_is_set() -> None:
    from sse_starlette.sse import SendTimeoutError

    from runtime.frontends.rest.sse import _event_source

    response_class = _event_source()
    assert _event_source() is response_class

    async def nothing() -> AsyncGenerator[bytes, None]:
        yield b""

    client = Client()
    await response_class(nothing())._send_with_timeout(client.send, {"type": "x"})
    assert client.sent == [{"type": "x"}]

    async def stuck(message: Message) -> None:
        await asyncio.Event().wait()

    with pytest.raises(SendTimeoutError):
        await response_class(nothing(), send_timeout=0.01)._send_with_timeout(stuck, {"type": "x"})


def test_events_go_out_through_the_send_that_sse_starlette_calls_without_a_scope_each() -> None:
    """The stream's response overrides the one method sse-starlette sends every event through:
    if a new sse-starlette stops calling it, this says so (the override would be silently unused)."""
    import inspect

    from sse_starlette import EventSourceResponse

    from runtime.frontends.rest.sse import _event_source

    response_class = _event_source()
    assert issubclass(response_class, EventSourceResponse)
    assert "_send_with_timeout" in vars(response_class)
    assert "self._send_with_timeout(" in inspect.getsource(EventSourceResponse._stream_response)
