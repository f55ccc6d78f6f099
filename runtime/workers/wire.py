"""The wire format of messages between the server and a worker process: pickle protocol 5 with
out-of-band buffers (read and written by ``connection.Connection``).

A message is any picklable Python object (here, always a tuple ``(kind, id, payload)``). It is
pickled with protocol 5 and a ``buffer_callback``, so that the data of every contiguous numpy
array in it (tensors, states) is not copied into the pickle: it travels after the pickle as a raw
buffer. On the wire::

    u32 body length | u32 buffer count | u64 length of each buffer | body | buffer 0 | buffer 1 ...

A message whose payload is an ``InferenceRequest`` or ``InferenceResponse`` carries the payload as
a tuple of its fields, marked by the top bits of the buffer count (``FLAT_REQUEST``,
``FLAT_RESPONSE``): the receiver rebuilds it after unpickling, and the pickle names no function.

Arrays under ``DIRECT`` bytes travel inside the pickle (a buffer of their own costs more than it
saves); the receiver reads bigger buffers straight into their own memory (``connection``).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
from typing import Any, Final

import numpy as np

from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
    built,
)

HEAD: Final = struct.Struct("<II")
FLAT_REQUEST: Final = 1 << 31
"""Set in the head's buffer count: the message's payload is a request's fields (``_request``)."""
FLAT_RESPONSE: Final = 1 << 30
"""Set in the head's buffer count: the message's payload is a response's fields (``_response``)."""
COUNT: Final = FLAT_RESPONSE - 1
DIRECT: Final = 64 * 1024
"""Buffers at least this big are read from the socket straight into their own memory."""

Message = tuple[str, int, Any]

_set = object.__setattr__

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


def _flat_parameters(parameters: Any) -> Any:
    if type(parameters) is not Parameters:
        return parameters  # None, or a subclass that pickles as usual
    return (parameters.__dict__, parameters.__pydantic_extra__, parameters.__pydantic_fields_set__)


def _parameters(flat: Any) -> Any:
    if type(flat) is not tuple:
        return flat
    values, extra, fields_set = flat
    return built(Parameters, values, fields_set, extra)


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
    values = {
        "name": name,
        "shape": shape,
        "datatype": _DATATYPES.get(datatype, datatype),
        "parameters": None if parameters is None else _parameters(parameters),
        "data": data,
    }
    return built(cls, values, set(_TENSOR_FIELDS))


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
            built(RequestOutput, {"name": o[0], "parameters": _parameters(o[1])}, {"name", "parameters"})
            if type(o) is tuple
            else o
            for o in outputs
        ],
    }
    request: InferenceRequest = built(InferenceRequest, values, set(_REQUEST_FIELDS))
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
    response: InferenceResponse = built(InferenceResponse, values, set(_RESPONSE_FIELDS))
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


def rebuilt(message: tuple[str, int, Any], flat: int) -> tuple[str, int, Any]:
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
