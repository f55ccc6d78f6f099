"""uvicorn's httptools protocol, writing a response's head and its first body part in one go.

uvicorn hands the head of a response (status line and headers) to the socket as soon as the app
sends ``http.response.start``, and the body when it sends ``http.response.body``: two writes,
two system calls, for every response, where one suffices. The ASGI specification lets a server
hold the head until the first body message (it "must not start sending the response to the
client until it has received at least one Response Body event"), and this protocol does: each
request's cycle writes through a ``_HeadWithBody``, which keeps the head and writes it together
with the first body part (one ``writelines``, no copy). Everything else is uvicorn's: the bytes
on the wire are the same, ``100 Continue`` goes out at once, and a connection closed after the
head alone (the app failed mid-response) still gets the head first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        if self._state == 1:
            self._state = 2
            head, self._head = self._head, None
            self._transport.write(head)  # type: ignore[arg-type]

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; each request's responses go out through ``_HeadWithBody``."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:  # a cycle made just now
            cycle.transport = _HeadWithBody(self.transport, cycle)  # type: ignore[assignment]
