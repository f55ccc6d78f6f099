"""Messages between the server and a worker process: pickle protocol 5 with out-of-band buffers.

A message is any picklable Python object (here, always a tuple ``(kind, id, payload)``). It is
pickled with protocol 5 and a ``buffer_callback``, so that the data of every contiguous numpy
array in it (tensors, states) is not copied into the pickle: it travels after the pickle as a raw
buffer. On the wire::

    u32 body length | u32 buffer count | u64 length of each buffer | body | buffer 0 | buffer 1 ...

Arrays under ``DIRECT`` bytes travel inside the pickle (a buffer of their own costs more than it
saves). The sender hands each buffer's memory to the socket as it is (no join). The receiver reads small
messages through one staging buffer and every buffer of ``DIRECT`` bytes or more straight from the
socket into its own ``bytearray`` (an ``asyncio.BufferedProtocol``), which the unpickled array then
uses as its memory: the kernel's copy is the only one.
"""

from __future__ import annotations

import asyncio
import copyreg
import io
import pickle
import struct
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from ..types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
)

HEAD: Final = struct.Struct("<II")
STAGING: Final = 256 * 1024
"""Size of the staging buffer small messages are read through."""
DIRECT: Final = 64 * 1024
"""Buffers at least this big are read from the socket straight into their own memory."""

Message = tuple[str, int, Any]

_set = object.__setattr__
_DATATYPES: Final[dict[Any, Any]] = dict(Datatype._value2member_map_)


def _array(data: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array on ``data`` (writable, as the array that was sent)."""
    if type(data) is bytes:
        data = bytearray(data)
    array = np.frombuffer(data, dtype=dtype)
    return array if len(shape) == 1 and shape[0] == len(array) else array.reshape(shape)


def _plain(array: Any) -> bool:
    """Whether ``array`` is a C-contiguous numpy array of plain numbers (it travels as raw bytes)."""
    return (
        type(array) is np.ndarray
        and not array.dtype.hasobject
        and array.dtype.fields is None
        and array.flags.c_contiguous
    )


def _raw(array: np.ndarray) -> Any:
    """An array's memory as it travels: out of band from ``DIRECT`` bytes up (a ``PickleBuffer``,
    written as it is), else as bytes inside the pickle (cheaper than a buffer of its own)."""
    return pickle.PickleBuffer(array) if array.nbytes >= DIRECT else array.tobytes()  # type: ignore[arg-type]


def _reduce_array(array: np.ndarray) -> Any:
    """Arrays of plain numbers travel as their raw bytes (``_raw``); others as numpy pickles them."""
    if not _plain(array):
        return array.__reduce_ex__(5)
    return _array, (_raw(array), array.dtype.str, array.shape)


# Requests and responses cross as flat tuples of their fields, not as pydantic pickles (which name
# every class, call __getstate__ per model and __setstate__ on the other side): one function rebuilds
# the whole message without validation, as pydantic's own unpickling does, and each tensor's data
# travels as (dtype, shape, raw bytes or out-of-band buffer). Subclasses pickle as usual.


def _build(cls: Any, values: dict[str, Any], fields_set: set[str], extra: Any = None) -> Any:
    model = cls.__new__(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", fields_set)
    _set(model, "__pydantic_extra__", extra)
    _set(model, "__pydantic_private__", None)
    return model


def _flat_parameters(parameters: Any) -> Any:
    if type(parameters) is not Parameters:
        return parameters  # None, or a subclass that pickles as usual
    return (parameters.__dict__, parameters.__pydantic_extra__, parameters.__pydantic_fields_set__)


def _parameters(flat: Any) -> Any:
    if type(flat) is not tuple:
        return flat
    values, extra, fields_set = flat
    return _build(Parameters, values, fields_set, extra)


def _flat_tensor(tensor: Any) -> Any:
    """A RequestInput or ResponseOutput as ``(name, shape, datatype, parameters, data, is_array)``."""
    if type(tensor) not in _TENSORS:
        return tensor
    values = tensor.__dict__
    datatype = values["datatype"]
    data = values["data"]
    if _plain(data):
        data, is_array = (data.dtype.str, data.shape, _raw(data)), True
    else:
        is_array = False
    return (
        values["name"],
        values["shape"],
        datatype.value if type(datatype) is Datatype else datatype,
        _flat_parameters(values["parameters"]),
        data,
        is_array,
    )


def _tensor(cls: type[Any], flat: Any) -> Any:
    if type(flat) is not tuple:
        return flat
    name, shape, datatype, parameters, data, is_array = flat
    if is_array:
        data = _array(data[2], data[0], data[1])
    values = {
        "name": name,
        "shape": shape,
        "datatype": _DATATYPES.get(datatype, datatype),
        "parameters": _parameters(parameters),
        "data": data,
    }
    return _build(cls, values, {"name", "shape", "datatype", "parameters", "data"})


def _request(id_: Any, parameters: Any, inputs: list[Any], outputs: Any) -> InferenceRequest:
    values = {
        "id": id_,
        "parameters": _parameters(parameters),
        "inputs": [_tensor(RequestInput, t) for t in inputs],
        "outputs": None
        if outputs is None
        else [
            _build(RequestOutput, {"name": o[0], "parameters": _parameters(o[1])}, {"name", "parameters"})
            if type(o) is tuple
            else o
            for o in outputs
        ],
    }
    request: InferenceRequest = _build(InferenceRequest, values, {"id", "parameters", "inputs", "outputs"})
    return request


def _reduce_request(request: InferenceRequest) -> Any:
    values = request.__dict__
    outputs = values["outputs"]
    return _request, (
        values["id"],
        _flat_parameters(values["parameters"]),
        [_flat_tensor(t) for t in values["inputs"]],
        None
        if outputs is None
        else [(o.name, _flat_parameters(o.parameters)) if type(o) is RequestOutput else o for o in outputs],
    )


def _response(
    model_name: Any, model_version: Any, id_: Any, parameters: Any, outputs: list[Any]
) -> InferenceResponse:
    values = {
        "model_name": model_name,
        "model_version": model_version,
        "id": id_,
        "parameters": _parameters(parameters),
        "outputs": [_tensor(ResponseOutput, t) for t in outputs],
    }
    response: InferenceResponse = _build(InferenceResponse, values, set(values))
    return response


def _reduce_response(response: InferenceResponse) -> Any:
    values = response.__dict__
    return _response, (
        values["model_name"],
        values["model_version"],
        values["id"],
        _flat_parameters(values["parameters"]),
        [_flat_tensor(t) for t in values["outputs"]],
    )


_TENSORS: Final = frozenset({RequestInput, ResponseOutput})
_TABLE = {
    **copyreg.dispatch_table,
    np.ndarray: _reduce_array,
    InferenceRequest: _reduce_request,
    InferenceResponse: _reduce_response,
}


class Encoder:
    """Pickles messages with one reused pickler (protocol 5, out-of-band buffers)."""

    def __init__(self) -> None:
        self._out = io.BytesIO()
        self._buffers: list[pickle.PickleBuffer] = []
        self._pickler = pickle.Pickler(self._out, protocol=5, buffer_callback=self._buffers.append)
        self._pickler.dispatch_table = _TABLE  # type: ignore[assignment]

    def encode(self, message: Any) -> list[bytes | memoryview]:
        """The pieces to write for one message (the head and body, then each out-of-band buffer)."""
        out, buffers = self._out, self._buffers
        out.write(_NO_HEAD)
        try:
            self._pickler.dump(message)
            if not buffers:
                size = out.tell() - HEAD.size
                with out.getbuffer() as view:
                    HEAD.pack_into(view, 0, size, 0)
                return [out.getvalue()]
            body = out.getbuffer()[HEAD.size :].tobytes()
            raws = [buffer.raw() for buffer in buffers]
        finally:
            out.seek(0)
            out.truncate()
            buffers.clear()
            self._pickler.clear_memo()
        lengths = struct.pack(f"<{len(raws)}Q", *(raw.nbytes for raw in raws))
        return [HEAD.pack(len(body), len(raws)) + lengths + body, *raws]


_NO_HEAD: Final = bytes(HEAD.size)


def encode(message: Any) -> list[bytes | memoryview]:
    """The pieces to write for one message (see ``Encoder``)."""
    return Encoder().encode(message)


class Connection(asyncio.BufferedProtocol):
    """One end of a worker's socket: ``send`` writes a message, ``on_message`` gets each one read.

    ``on_lost`` is called once when the other end is gone (it closed, or its process died).
    """

    def __init__(self, on_message: Callable[[Any], None], on_lost: Callable[[], None]) -> None:
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._staging = bytearray(STAGING)
        self._view = memoryview(self._staging)
        self._start = 0  # first unparsed byte of the staging buffer
        self._end = 0  # end of what has been read into it
        # a message whose buffers are being read (body, lengths left, buffers read so far)
        self._body: bytes | None = None
        self._lengths: list[int] = []
        self._buffers: list[bytearray] = []
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
                asyncio.get_running_loop().call_soon(self._flush)
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
            need = HEAD.size + 8 * count + size
            if available < need:
                if need > len(self._staging):
                    self._start_growing(need)
                break
            at = self._start + HEAD.size
            lengths = list(struct.unpack_from(f"<{count}Q", view, at)) if count else []
            at += 8 * count
            body = bytes(view[at : at + size])
            self._start += need
            if not lengths:
                self._deliver(body, [])
                continue
            self._body, self._lengths, self._buffers = body, lengths, []
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
        self.on_message(message)
