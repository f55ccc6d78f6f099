"""Messages between the server and a worker process: pickle protocol 5 with out-of-band buffers.

A message is any picklable Python object (here, always a tuple ``(kind, id, payload)``). It is
pickled with protocol 5 and a ``buffer_callback``, so that the data of every contiguous numpy
array in it (tensors, states) is not copied into the pickle: it travels after the pickle as a raw
buffer. On the wire::

    u32 body length | u32 buffer count | u64 length of each buffer | body | buffer 0 | buffer 1 ...

A message whose payload is an ``InferenceRequest`` or ``InferenceResponse`` carries the payload as
a tuple of its fields, marked by the top bits of the buffer count (``FLAT_REQUEST``,
``FLAT_RESPONSE``): the receiver rebuilds it after unpickling, and the pickle names no function.

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
from pydantic import BaseModel

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
FLAT_REQUEST: Final = 1 << 31
"""Set in the head's buffer count: the message's payload is a request's fields (``_request``)."""
FLAT_RESPONSE: Final = 1 << 30
"""Set in the head's buffer count: the message's payload is a response's fields (``_response``)."""
COUNT: Final = FLAT_RESPONSE - 1
STAGING: Final = 256 * 1024
"""Size of the staging buffer small messages are read through."""
DIRECT: Final = 64 * 1024
"""Buffers at least this big are read from the socket straight into their own memory."""

Message = tuple[str, int, Any]

_set = object.__setattr__
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
"""A pydantic model's slots, set through their descriptors (``object.__setattr__`` looks each one
up by name every time)."""

_DATATYPES: Final[dict[Any, Any]] = dict(Datatype._value2member_map_)
_DTYPES: Final[dict[str, np.dtype[Any]]] = {}
"""numpy dtypes by the string they travel as (``np.frombuffer`` would parse the string each time)."""
_PLAIN: Final[dict[np.dtype[Any], str | None]] = {}
"""Each dtype seen → the string it travels as when it is a dtype of plain numbers, else None (it
travels as numpy pickles it)."""


def _plain_dtype(dtype: np.dtype[Any]) -> str | None:
    """The string a dtype of plain numbers travels as; None for any other dtype."""
    kind = _PLAIN.get(dtype, False)
    if kind is False:
        kind = _PLAIN[dtype] = None if dtype.hasobject or dtype.fields is not None else dtype.str
    return kind  # type: ignore[return-value]


def _array(data: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array on ``data`` (writable, as the array that was sent)."""
    if type(data) is bytes:
        data = bytearray(data)
    kind = _DTYPES.get(dtype)
    if kind is None:
        kind = _DTYPES[dtype] = np.dtype(dtype)
    array = np.frombuffer(data, dtype=kind)
    return array if array.shape == shape else array.reshape(shape)


def _flat_array(array: Any) -> tuple[str, tuple[int, ...], Any] | None:
    """A C-contiguous numpy array of plain numbers as ``(dtype, shape, memory)``, its memory out of
    band from ``DIRECT`` bytes up (a ``PickleBuffer``, written as it is), else as bytes inside the
    pickle (cheaper than a buffer of its own); None for any other object."""
    if type(array) is not np.ndarray:
        return None
    kind: Any = _PLAIN.get(array.dtype, False)  # a dict hit costs less than a call
    if kind is False:
        kind = _plain_dtype(array.dtype)
    if kind is None or not array.flags.c_contiguous:
        return None
    raw = pickle.PickleBuffer(array) if array.nbytes >= DIRECT else array.tobytes()  # type: ignore[arg-type]
    return kind, array.shape, raw


def _reduce_array(array: np.ndarray) -> Any:
    """Arrays of plain numbers travel as their raw bytes (``_flat_array``); others as numpy pickles them."""
    flat = _flat_array(array)
    if flat is None:
        return array.__reduce_ex__(5)
    return _array, (flat[2], flat[0], flat[1])


# Requests and responses cross as flat tuples of their fields, not as pydantic pickles (which name
# every class, call __getstate__ per model and __setstate__ on the other side): one function rebuilds
# the whole message without validation, as pydantic's own unpickling does, and each tensor's data
# travels as (dtype, shape, raw bytes or out-of-band buffer). Subclasses pickle as usual.


def _build(cls: Any, values: dict[str, Any], fields_set: set[str], extra: Any = None) -> Any:
    """A pydantic model with these fields, as its own unpickling makes it (no validation)."""
    model = _new(cls)
    _set_dict(model, values)
    _set_fields_set(model, fields_set)
    _set_extra(model, extra)
    _set_private(model, None)
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
    flat = _flat_array(data)
    parameters = values["parameters"]
    return (
        values["name"],
        values["shape"],
        datatype._value_ if type(datatype) is Datatype else datatype,
        None if parameters is None else _flat_parameters(parameters),
        data if flat is None else flat,
        flat is not None,
    )


_TENSOR_FIELDS: Final = frozenset({"name", "shape", "datatype", "parameters", "data"})


def _tensor(cls: type[Any], flat: Any) -> Any:
    if type(flat) is not tuple:
        return flat
    name, shape, datatype, parameters, data, is_array = flat
    if is_array:
        data = _array(data[2], data[0], data[1])
    model = _new(cls)
    _set_dict(
        model,
        {
            "name": name,
            "shape": shape,
            "datatype": _DATATYPES.get(datatype, datatype),
            "parameters": None if parameters is None else _parameters(parameters),
            "data": data,
        },
    )
    _set_fields_set(model, set(_TENSOR_FIELDS))
    _set_extra(model, None)
    _set_private(model, None)
    return model


_REQUEST_FIELDS: Final = frozenset({"id", "parameters", "inputs", "outputs"})
_RESPONSE_FIELDS: Final = frozenset({"model_name", "model_version", "id", "parameters", "outputs"})


def _request(id_: Any, parameters: Any, inputs: list[Any], outputs: Any) -> InferenceRequest:
    values = {
        "id": id_,
        "parameters": None if parameters is None else _parameters(parameters),
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
    request: InferenceRequest = _build(InferenceRequest, values, set(_REQUEST_FIELDS))
    return request


def _reduce_request(request: InferenceRequest) -> Any:
    return _request, _flat_request(request)


def _flat_request(request: InferenceRequest) -> tuple[Any, ...]:
    values = request.__dict__
    outputs = values["outputs"]
    parameters = values["parameters"]
    return (
        values["id"],
        None if parameters is None else _flat_parameters(parameters),
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
        "parameters": None if parameters is None else _parameters(parameters),
        "outputs": [_tensor(ResponseOutput, t) for t in outputs],
    }
    response: InferenceResponse = _build(InferenceResponse, values, set(_RESPONSE_FIELDS))
    return response


def _reduce_response(response: InferenceResponse) -> Any:
    return _response, _flat_response(response)


def _flat_response(response: InferenceResponse) -> tuple[Any, ...]:
    values = response.__dict__
    parameters = values["parameters"]
    return (
        values["model_name"],
        values["model_version"],
        values["id"],
        None if parameters is None else _flat_parameters(parameters),
        [_flat_tensor(t) for t in values["outputs"]],
    )


_TENSORS: Final = frozenset({RequestInput, ResponseOutput})
_TABLE = {
    **copyreg.dispatch_table,
    np.ndarray: _reduce_array,
    InferenceRequest: _reduce_request,
    InferenceResponse: _reduce_response,
}


def _rebuilt(message: tuple[str, int, Any], flat: int) -> tuple[str, int, Any]:
    """A message whose payload travelled as a request's or a response's fields, with the payload
    rebuilt."""
    kind, ident, fields = message
    return kind, ident, _request(*fields) if flat == FLAT_REQUEST else _response(*fields)


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
        flat = 0
        if type(message) is tuple and len(message) == 3:
            payload = message[2]
            if type(payload) is InferenceResponse:
                message, flat = (message[0], message[1], _flat_response(payload)), FLAT_RESPONSE
            elif type(payload) is InferenceRequest:
                message, flat = (message[0], message[1], _flat_request(payload)), FLAT_REQUEST
        try:
            self._pickler.dump(message)
            body = out.getvalue()
            raws = [buffer.raw() for buffer in buffers] if buffers else None
        finally:
            out.seek(0)
            out.truncate()
            if buffers:
                buffers.clear()
            self._pickler.clear_memo()
        if raws is None:
            return [HEAD.pack(len(body), flat) + body]
        lengths = struct.pack(f"<{len(raws)}Q", *(raw.nbytes for raw in raws))
        return [HEAD.pack(len(body), flat | len(raws)) + lengths + body, *raws]


def encode(message: Any) -> list[bytes | memoryview]:
    """The pieces to write for one message (see ``Encoder``)."""
    return Encoder().encode(message)


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
                self.on_message(_rebuilt(message, flat) if flat else message)
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
        self.on_message(_rebuilt(message, self._flat) if self._flat else message)
