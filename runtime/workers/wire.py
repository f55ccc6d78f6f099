"""The wire format of messages between the server and a worker process: pickle protocol 5 with
out-of-band buffers (read and written by ``connection.Connection``).

A message is any picklable Python object (here, always a tuple ``(kind, id, payload)``). It is
pickled with protocol 5 and a ``buffer_callback``, so that the data of every contiguous numpy
array in it (tensors, states) is not copied into the pickle: it travels after the pickle as a raw
buffer. On the wire::

    u32 body length | u32 buffer count | u64 length of each buffer | body | buffer 0 | buffer 1 ...

A message whose payload is an ``InferenceRequest`` or ``InferenceResponse`` carries the payload as
a tuple of its fields (every field the model declares, in order: ``_Form``), marked by the top bits of the buffer count (``FLAT_REQUEST``,
``FLAT_RESPONSE``): the receiver rebuilds it after unpickling, and the pickle names no function.

Arrays under ``DIRECT`` bytes travel inside the pickle (a buffer of their own costs more than it
saves); the receiver reads bigger buffers straight into their own memory (``connection``).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np
from pydantic import BaseModel

from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    RequestOutput,
    ResponseOutput,
    built,
    model_state,
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

Flatten = Callable[[Any], Any]


class _Form:
    """How instances of one model type travel: the values of its fields, in the order of the model's
    ``model_fields`` (a field added to the model travels with the others), each as its field's
    function flattens it (as it is when there is none); rebuilt on the other side with every field set.
    An instance of a subclass travels as pickle makes it."""

    __slots__ = ("cls", "names", "steps")

    def __init__(self, cls: type[BaseModel], special: Mapping[str, tuple[Flatten, Flatten]]) -> None:
        self.cls = cls
        self.names = frozenset(cls.model_fields)
        unknown = set(special) - self.names
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
        self.steps: tuple[tuple[str, Flatten | None, Flatten | None], ...] = tuple(
            (name, *special[name]) if name in special else (name, None, None) for name in cls.model_fields
        )

    def flat(self, model: Any) -> Any:
        """``model``'s field values as a tuple (a subclass's instance: ``model`` itself)."""
        if type(model) is not self.cls:
            return model
        values = model.__dict__
        return tuple([values[name] if out is None else out(values[name]) for name, out, _ in self.steps])

    def rebuilt(self, flat: Any) -> Any:
        """The instance ``flat`` stands for (anything but a tuple: ``flat`` itself)."""
        if type(flat) is not tuple:
            return flat
        values = {
            name: value if back is None else back(value)
            for (name, _, back), value in zip(self.steps, flat, strict=True)
        }
        return built(self.cls, values, set(self.names))


def _flat_parameters(parameters: Any) -> Any:
    if type(parameters) is not Parameters:
        return parameters  # None, or a subclass that pickles as usual
    return model_state(parameters)  # every field of Parameters (its values) and its extras


def _parameters(flat: Any) -> Any:
    if type(flat) is not tuple:
        return flat
    return built(Parameters, *flat)


def _flat_datatype(datatype: Any) -> Any:
    return datatype._value_ if type(datatype) is Datatype else datatype


def _datatype(flat: Any) -> Any:
    return _DATATYPES.get(flat, flat)


def _flat_data(data: Any) -> tuple[bool, Any]:
    """A tensor's data as ``(True, (dtype, shape, memory))`` for an array of plain numbers
    (``_flat_array``), else ``(False, data)``."""
    flat = _flat_array(data)
    return (False, data) if flat is None else (True, flat)


def _data(flat: tuple[bool, Any]) -> Any:
    is_array, data = flat
    return _array(data[2], data[0], data[1]) if is_array else data


_PARAMETERS = (_flat_parameters, _parameters)
_TENSOR = {"datatype": (_flat_datatype, _datatype), "parameters": _PARAMETERS, "data": (_flat_data, _data)}
_INPUT = _Form(RequestInput, _TENSOR)
_OUTPUT = _Form(ResponseOutput, _TENSOR)
_ASKED = _Form(RequestOutput, {"parameters": _PARAMETERS})


def _each(form: _Form) -> tuple[Flatten, Flatten]:
    """How a list of ``form``'s models (or None) travels."""
    flat, rebuilt = form.flat, form.rebuilt
    return (
        lambda models: None if models is None else [flat(model) for model in models],
        lambda flats: None if flats is None else [rebuilt(item) for item in flats],
    )


_REQUEST = _Form(
    InferenceRequest, {"parameters": _PARAMETERS, "inputs": _each(_INPUT), "outputs": _each(_ASKED)}
)
_RESPONSE = _Form(InferenceResponse, {"parameters": _PARAMETERS, "outputs": _each(_OUTPUT)})
FORMS: Final = (_REQUEST, _RESPONSE, _INPUT, _OUTPUT, _ASKED)
"""Every model type that travels as its fields."""


def _request(flat: tuple[Any, ...]) -> InferenceRequest:
    request: InferenceRequest = _REQUEST.rebuilt(flat)
    return request


def _response(flat: tuple[Any, ...]) -> InferenceResponse:
    response: InferenceResponse = _RESPONSE.rebuilt(flat)
    return response


def _reduce_request(request: InferenceRequest) -> Any:
    return _request, (_REQUEST.flat(request),)


def _reduce_response(response: InferenceResponse) -> Any:
    return _response, (_RESPONSE.flat(response),)


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
    return kind, ident, _REQUEST.rebuilt(fields) if flat == FLAT_REQUEST else _RESPONSE.rebuilt(fields)


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
                message, flat = (message[0], message[1], _RESPONSE.flat(payload)), FLAT_RESPONSE
            elif type(payload) is InferenceRequest:
                message, flat = (message[0], message[1], _REQUEST.flat(payload)), FLAT_REQUEST
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
