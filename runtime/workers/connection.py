"""The connection between the server and a worker process: an ``asyncio.BufferedProtocol`` that
writes messages in the wire format (``wire``) and reads them back.

The sender hands each buffer's memory to the socket as it is (no join); small messages written in
one turn of the event loop go out in one write. The receiver reads small messages through one
staging buffer and every buffer of ``DIRECT`` bytes or more straight from the socket into its own
``bytearray``, which the unpickled array then uses as its memory: the kernel's copy is the only one.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable
from typing import Any, Final

from runtime.workers.wire import COUNT, DIRECT, HEAD, Encoder, rebuilt

STAGING: Final = 256 * 1024
"""Size of the staging buffer small messages are read through."""


class Connection(asyncio.BufferedProtocol):
    """One end of a worker's socket: ``send`` writes a message, ``on_message`` gets each one read.

    ``on_lost`` is called once when the other end is gone (it closed, or its process died).
    """

    def __init__(self, on_message: Callable[[Any], None], on_lost: Callable[[], None]) -> None:
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop
        """The loop the connection runs in (from ``connection_made``; asking for the running loop
        costs a system call on some Pythons)."""
        self.closed = False
        self._staging = bytearray(STAGING)
        self._view = memoryview(self._staging)
        self._start = 0  # first unparsed byte of the staging buffer
        self._end = 0  # end of what has been read into it
        # a message whose buffers are being read (body, lengths left, buffers read so far)
        self._body: bytes | None = None
        self._lengths: list[int] = []
        self._buffers: list[bytearray] = []
        self._flat = 0  # FLAT_REQUEST or FLAT_RESPONSE: what that message's payload is
        self._target: memoryview | None = None  # a big buffer being filled straight from the socket
        self._filled = 0
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._pending: list[bytes | memoryview] = []
        self._flush_soon = False
        self._encoder = Encoder()
        self.gone = asyncio.Event()
        """Set once the connection is closed (after what was written has gone out)."""

    # ------------------------------------------------------------------ writing

    def send(self, message: Any, now: bool = False) -> None:
        """Write one message. Small messages sent in one turn of the event loop go out together in
        one write at the end of the turn (one system call, one wake-up of the other side), unless
        ``now``; a message with a big buffer flushes them and goes out at once, its buffers as
        they are."""
        transport = self.transport
        if transport is None or self.closed:
            raise ConnectionResetError("the worker connection is closed")
        pieces = self._encoder.encode(message)
        if len(pieces) == 1 and len(pieces[0]) < DIRECT:
            self._pending.append(pieces[0])
            if now:
                self._flush()
            elif not self._flush_soon:
                self._flush_soon = True
                self.loop.call_soon(self._flush)
            return
        self._flush()
        for piece in pieces:
            transport.write(piece)

    def _flush(self) -> None:
        self._flush_soon = False
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if self.transport is not None and not self.closed:
            self.transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    async def drain(self) -> None:
        """Write what waits for the end of the turn, then wait until the transport's buffer is
        below its high-water mark."""
        self._flush()
        if self._paused and not self.closed:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # ------------------------------------------------------------------ reading

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        self.loop = asyncio.get_running_loop()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.gone.set()
        self.resume_writing()
        self.on_lost()

    def close(self) -> None:
        """Close after writing what is pending (the transport writes its buffer out first)."""
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return self._target[self._filled :]
        if self._end == len(self._staging):
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._filled += nbytes
            if self._filled == len(self._target):
                self._target.release()
                self._target = None
                self._next_buffer()
            return
        self._end += nbytes
        self._parse()

    def _compact(self) -> None:
        pending = self._end - self._start
        if self._start == 0:  # one message head/body bigger than the staging buffer: grow it
            self._staging.extend(bytes(len(self._staging)))
            self._view.release()
            self._view = memoryview(self._staging)
            return
        self._view[:pending] = self._view[self._start : self._end]
        self._start, self._end = 0, pending

    def _parse(self) -> None:
        view = self._view
        while self._target is None:
            if self._body is not None:  # reading a message's buffers through the staging buffer
                if not self._take_buffer():
                    break
                continue
            available = self._end - self._start
            if available < HEAD.size:
                break
            size, count = HEAD.unpack_from(view, self._start)
            flat = count & ~COUNT
            count &= COUNT
            need = HEAD.size + 8 * count + size
            if available < need:
                if need > len(self._staging):
                    self._start_growing(need)
                break
            at = self._start + HEAD.size
            if not count:  # unpickled straight from the staging buffer
                self._start += need
                with view[at : at + size] as body:
                    message = pickle.loads(body)
                self.on_message(rebuilt(message, flat) if flat else message)
                continue
            lengths = list(struct.unpack_from(f"<{count}Q", view, at))
            at += 8 * count
            self._body, self._lengths, self._buffers = bytes(view[at : at + size]), lengths, []
            self._flat = flat
            self._start += need
        if self._start == self._end:
            self._start = self._end = 0

    def _start_growing(self, need: int) -> None:
        pending = self._end - self._start
        grown = bytearray(max(need, 2 * len(self._staging)))
        grown[:pending] = self._view[self._start : self._end]
        self._view.release()
        self._staging, self._view = grown, memoryview(grown)
        self._start, self._end = 0, pending

    def _take_buffer(self) -> bool:
        """Take the next buffer of the current message from the staging buffer (or start reading
        it from the socket); False when more bytes must come first."""
        length = self._lengths[len(self._buffers)]
        available = self._end - self._start
        if length >= DIRECT and available < length:
            buffer = bytearray(length)
            buffer[:available] = self._view[self._start : self._end]
            self._start = self._end = 0
            self._buffers.append(buffer)
            self._target = memoryview(buffer)
            self._filled = available
            return False
        if available < length:
            return False
        self._buffers.append(bytearray(self._view[self._start : self._start + length]))
        self._start += length
        self._finish_if_complete()
        return True

    def _next_buffer(self) -> None:
        """A big buffer has been read straight from the socket: go on with the message."""
        self._finish_if_complete()
        self._parse()

    def _finish_if_complete(self) -> None:
        if len(self._buffers) == len(self._lengths):
            body, buffers = self._body, self._buffers
            assert body is not None
            self._body, self._lengths, self._buffers = None, [], []
            self._deliver(body, buffers)

    def _deliver(self, body: bytes, buffers: list[bytearray]) -> None:
        message = pickle.loads(body, buffers=buffers)
        self.on_message(rebuilt(message, self._flat) if self._flat else message)


def decode(wire: bytes) -> list[Any]:
    """The messages in ``wire`` (what ``encode`` wrote for each), as a connection reads them."""
    messages: list[Any] = []
    connection = Connection(messages.append, lambda: None)
    view, at = memoryview(wire), 0
    while at < len(wire):
        buffer = connection.get_buffer(-1)
        n = min(len(buffer), len(wire) - at)
        buffer[:n] = view[at : at + n]
        connection.buffer_updated(n)
        at += n
    return messages
