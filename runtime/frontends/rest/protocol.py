"""uvicorn's httptools protocol with the limits httptools lacks, as nginx sets them.

- A request's header must arrive whole within ``http_header_timeout`` seconds (nginx's
  ``client_header_timeout``), counted from the connection's start or the request's first byte:
  a silent new connection is closed, a header that trickles in (slowloris) gets 408 and the
  connection is closed.
- A request's header may take at most ``http_max_header_size`` bytes (request line and fields;
  nginx's ``large_client_header_buffers``): a larger one gets 431 and the connection is closed,
  before the rest is read.

The idle time between requests of a keep-alive connection is uvicorn's ``timeout_keep_alive``
(``http_keepalive_timeout``). Refusals are JSON ``{"error": ...}`` bodies like every other error.

One write per response: uvicorn hands a response's head (status line and headers) to the socket
as soon as the app sends ``http.response.start``, and the body when it sends
``http.response.body``: two writes, two system calls, where one suffices. The ASGI specification
lets a server hold the head until the first body message (it "must not start sending the
response to the client until it has received at least one Response Body event"), and this
protocol does: each request's cycle writes through a ``_HeadWithBody``, which keeps the head and
writes it together with the first body part (one ``writelines``, no copy). The bytes on the wire
are the same; ``100 Continue`` goes out at once; a connection closed after the head alone (the
app failed mid-response) still gets the head first.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _HeadWithBody:
    """A transport for one request-response cycle that holds the response's head for its body."""

    __slots__ = ("_cycle", "_head", "_state", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._state = 0  # 0: the head is not written yet, 1: it is held, 2: it went out

    def write(self, data: bytes) -> None:
        if self._state == 1:
            self._state = 2
            head, self._head = self._head, None
            self._transport.writelines([head, data])  # type: ignore[list-item]
        elif self._state == 0 and self._cycle.response_started:
            self._state = 1  # the cycle writes the head once, right after it marks the response started
            self._head = data
            self._cycle = None  # not read again: no cycle <-> transport reference loop left to the GC
        else:
            self._transport.write(data)

    def close(self) -> None:
        if self._state == 1:
            self._state = 2
            head, self._head = self._head, None
            self._transport.write(head)  # type: ignore[arg-type]
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


LINGER_IDLE = 2.0
"""Seconds a refused connection may stay silent before it is closed (nginx's lingering_timeout is 5)."""
LINGER_MAX = 10.0
"""Seconds a refused connection is read and dropped at the most (nginx's lingering_time is 30)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a header deadline and a header size limit (set by ``guarded_protocol``)."""

    header_timeout: float = 60.0
    header_limit: int = 32 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_header = True
        self._header_bytes = 0
        self._header_deadline = 0.0
        """When (``loop.time()``) the header being read must be whole; 0: no header is being read."""
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._linger_until = 0.0
        """While above 0: the connection was refused and what the client still sends is read and
        dropped until this time at the latest (see ``_refuse``)."""

    # ------------------------------------------------------------------ the header deadline
    #
    # One timer per connection, not one per request: a request's start sets the deadline (and arms
    # the timer only when none is armed), the end of its header clears the deadline, and a timer
    # that goes off early (it was armed for an earlier request's deadline) waits for the current
    # one. So a keep-alive connection's requests pay a clock read each, not a timer each.

    def _start_header(self) -> None:
        self._header_deadline = self.loop.time() + self.header_timeout
        if self._header_timer is None:
            self._header_timer = self.loop.call_at(self._header_deadline, self._header_due)

    def _disarm_header_timer(self) -> None:
        self._header_deadline = 0.0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_due(self) -> None:
        self._header_timer = None
        deadline = self._header_deadline
        if not deadline:  # no header is being read now
            return
        if deadline > self.loop.time():  # another request's header, which started later
            self._header_timer = self.loop.call_at(deadline, self._header_due)
            return
        self._header_timed_out()

    def _header_timed_out(self) -> None:
        self._header_deadline = 0.0
        if self.transport.is_closing():
            return
        if self._header_bytes:
            self._refuse(408, f"The request header did not arrive within {self.header_timeout:g} s")
        else:
            self.transport.close()  # a connection that never said anything

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # gone before its response was complete
            notify = getattr(cycle, "on_disconnect", None)
            if notify is not None:
                notify()  # rest.disconnect: cancel the request's work now, no watcher task needed

    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)  # (no super object per request)
        if not self._header_deadline:  # (the connection's first request is timed from its start)
            self._header_deadline = deadline = self.loop.time() + self.header_timeout  # _start_header
            if self._header_timer is None:
                self._header_timer = self.loop.call_at(deadline, self._header_due)

    def on_headers_complete(self) -> None:
        self._reading_header = False
        self._header_deadline = 0.0  # the timer stays armed for the next request, if it comes soon
        HttpToolsProtocol.on_headers_complete(self)  # (no super object per request)
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # a cycle made just now
            cycle.transport = _HeadWithBody(self.transport, cycle)  # type: ignore[assignment]
            cycle.on_disconnect = None  # type: ignore[attr-defined]  # set by rest.disconnect while the work runs

    def on_message_complete(self) -> None:
        HttpToolsProtocol.on_message_complete(self)  # (no super object per request)
        self._reading_header, self._header_bytes = True, 0

    # ------------------------------------------------------------------ the header size limit

    def data_received(self, data: bytes) -> None:
        if self._linger_until:
            self._lingering()  # refused: what is still coming is dropped
            return
        if not self._reading_header:
            HttpToolsProtocol.data_received(self, data)
            return
        allowed = self.header_limit - self._header_bytes
        if len(data) <= allowed:
            self._header_bytes += len(data)
            HttpToolsProtocol.data_received(self, data)
            return
        # feed what the limit allows: if the header ends within it, the rest is body (or the next request)
        self._header_bytes = self.header_limit
        super().data_received(data[:allowed])
        if self.transport.is_closing():
            return
        if self._reading_header:
            self._refuse(431, f"The request header is larger than {self.header_limit} bytes")
            return
        super().data_received(data[allowed:])

    def _refuse(self, status: int, message: str) -> None:
        self._disarm_header_timer()
        body = orjson.dumps({"error": message})
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body))
        )
        self.transport.write(head + body)
        # A lingering close, as nginx's: closing now, with the rest of a large header still coming
        # in, would make the kernel answer it with a reset, and a client that is still sending
        # would see the reset instead of this answer. So the answer goes out with the end of this
        # side's stream, and what the client still sends is read and dropped until it closes, is
        # silent for LINGER_IDLE seconds, or LINGER_MAX seconds have passed (the client's end of its
        # stream closes the transport, as uvicorn's ``eof_received`` leaves it to).
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._linger_until = self.loop.time() + LINGER_MAX
        self._lingering()

    def _lingering(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
        delay = min(LINGER_IDLE, self._linger_until - self.loop.time())
        self._linger = self.loop.call_later(max(delay, 0.0), self.transport.close)


def guarded_protocol(header_timeout: float, header_limit: int) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http`` option, with these limits."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"header_timeout": header_timeout, "header_limit": header_limit},
    )
