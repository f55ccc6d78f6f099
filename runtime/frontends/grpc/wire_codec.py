"""ModelInfer's protobuf, read and written by hand where protobuf's own objects cost the most.

Both directions are checked byte for byte against protobuf's own (``tests/frontends/grpc/test_wire_codec.py``);
``runtime.frontends.grpc.converters`` calls them and falls back to protobuf's messages for anything else.

- Reading: :func:`packed_array` turns the serialized typed contents of a request's BOOL, FP32 or
  FP64 input (one packed field) into its array straight from the bytes, as ``np.asarray`` of
  protobuf's repeated field would make it; anything else is left to protobuf (None).
- Writing: gRPC's ModelInfer answers most calls with a response that has no parameters and whose
  outputs all go in raw_output_contents (or all FP32 / FP64 in typed contents). For those,
  :func:`response_bytes` writes the bytes protobuf would (``response_to_proto(...)
  .SerializeToString()`` in ``converters``) without building the message; any other case, and any
  value protobuf would refuse or convert, is left to protobuf (None). :func:`raw_bytes` is an
  output's raw contents, for both writers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.tensors import dtype_of, to_raw
from runtime.types import Datatype, InferenceResponse

_INT64_END = 2**63
_F32, _F64 = np.dtype("<f4"), np.dtype("<f8")

RAW_DTYPES: dict[str, np.dtype[Any]] = {
    d.value: dtype_of(d.value) for d in Datatype if d is not Datatype.BYTES
}
"""The little-endian dtype of each datatype's raw contents (BYTES has none: its elements are packed)."""
NO_DTYPE = np.dtype([("no raw dtype", "u1")])
"""What no output's array is (BYTES has no raw dtype; ``dtype == None`` would hold for float64)."""


def raw_bytes(data: Any, datatype: str) -> bytes:
    """An output's raw contents: a checked output's array (of the datatype's little-endian dtype)
    copied once, in C order; anything else as ``to_raw`` makes it."""
    if type(data) is np.ndarray and data.dtype == RAW_DTYPES.get(datatype, NO_DTYPE):
        return data.tobytes()  # (also right for an empty array, which to_raw cannot cast)
    raw = to_raw(data, datatype)
    return raw if isinstance(raw, bytes) else raw.tobytes()


# ---------------------------------------------------------------------- reading

PACKED: dict[str, tuple[int, np.dtype[Any]]] = {
    "BOOL": (0x0A, np.dtype(np.bool_)),
    "FP32": (0x32, np.dtype("<f4")),
    "FP64": (0x3A, np.dtype("<f8")),
}
"""The datatypes whose typed contents field is written packed, one fixed-size little-endian value
(or one byte: a bool's varint is 0 or 1) after another: that field's key and the dtype of its values."""


def packed_array(contents: bytes, datatype: str) -> np.ndarray | None:
    """The values of a serialized InferTensorContents of a ``datatype`` in :data:`PACKED` that
    holds that datatype's one field (packed, as protobuf writes it), as a new array: what
    ``np.asarray`` of the repeated field gives, bit for bit, without going through it. None when
    anything else is there (the general path sorts it out)."""
    key, dtype = PACKED[datatype]
    if len(contents) < 2 or contents[0] != key:
        return None
    length, start = contents[1], 2
    if length >= 0x80:
        length, shift = length & 0x7F, 7
        while True:
            if start >= len(contents):
                return None
            byte = contents[start]
            start += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
    if start + length != len(contents) or length % dtype.itemsize:
        return None
    return np.frombuffer(contents, dtype, offset=start).copy()  # writable, as np.asarray's


# ---------------------------------------------------------------------- writing


def response_bytes(response: InferenceResponse, raw: bool) -> bytes | None:
    """The serialized ModelInferResponse of a checked response, written here for the common cases:
    no parameters (response or outputs), and every output in raw_output_contents (``raw``, or an
    output with no typed field) or every output FP32 or FP64 in typed contents. The bytes are those
    ``response_to_proto(response, raw).SerializeToString()`` gives, without building the message;
    None for any other case (the caller builds the message)."""
    if response.parameters is not None:
        return None
    outputs = response.outputs
    if not raw:
        raw = any(out.datatype is Datatype.FP16 or out.datatype is Datatype.BF16 for out in outputs)
    try:
        key = (response.model_name, response.model_version)
        head = _HEADS.get(key)
        if head is None:
            head = _field(b"\x0a", response.model_name) + _field(b"\x12", response.model_version or "")
            if len(_HEADS) < _CACHED:
                _HEADS[key] = head
        parts = [head, _field(b"\x1a", response.id or "")]
        contents = []
        for out in outputs:
            if out.parameters is not None:
                return None
            datatype = out.datatype
            known = _TENSORS.get(out.name)
            if known is None or known[0] is not datatype:
                known = _tensor_head(out.name, datatype)
            shape = out.shape
            if shape:
                try:
                    packed = bytes(shape)  # the packed varints when every dimension is below 128
                except ValueError:
                    packed = b"\x80"
                if not packed.isascii():
                    varints = _packed(shape)
                    if varints is None:
                        return None
                    packed = varints
                tensor = known[1] + _varint(len(packed)) + packed
            else:
                tensor = known[2]
            data = out.data
            if not raw:  # typed contents: the fixed-size ones are written here
                typed = _typed_contents(data, datatype)
                if typed is None:
                    return None
                tensor += b"\x2a" + _varint(len(typed)) + typed
                parts.append(b"\x2a" + _varint(len(tensor)) + tensor)
                continue
            parts.append(b"\x2a" + _varint(len(tensor)) + tensor)
            if type(data) is np.ndarray and data.dtype == known[3]:
                data = data.tobytes()  # C order, the datatype's little-endian dtype: the raw bytes
            else:
                data = raw_bytes(data, datatype.value)
            contents.append(b"\x32" + _varint(len(data)))
            contents.append(data)
    except (UnicodeEncodeError, ValueError, TypeError, AttributeError):
        return None  # not plain text, a dimension out of [0, 128), ...: protobuf decides
    parts += contents
    return b"".join(parts)


_CACHED = 1024
"""Most entries kept in each of the caches below."""
_CACHED_NAME = 64
"""Longest output name kept in ``_TENSORS``: a model may name its outputs after what a client sent
(an echo model does), so a name is cached only when short, which bounds what clients can pin."""
_HEADS: dict[tuple[str, str | None], bytes] = {}
"""The start of a response (model name and version fields), by model name and version."""
_TENSORS: dict[str, tuple[Datatype, bytes, bytes, np.dtype[Any]]] = {}
"""By output name: the datatype, the output tensor's name and datatype fields followed by the
shape's key (to follow with the packed shape's length and bytes), the same without the shape,
and the datatype's raw dtype (``NO_DTYPE`` for BYTES, packed by to_raw)."""
_BYTE = [bytes((n,)) for n in range(128)]


def _tensor_head(name: str, datatype: Datatype) -> tuple[Datatype, bytes, bytes, np.dtype[Any]]:
    if not isinstance(datatype, Datatype):
        raise TypeError(datatype)
    fields = _field(b"\x0a", name) + _field(b"\x12", datatype.value)
    dtype = RAW_DTYPES.get(datatype.value, NO_DTYPE)
    known = (datatype, fields + b"\x1a", fields, dtype)
    if len(_TENSORS) < _CACHED and len(name) <= _CACHED_NAME:
        _TENSORS[name] = known
    return known


def _typed_contents(data: Any, datatype: Datatype) -> bytes | None:
    """An output's InferTensorContents, serialized, for FP32 and FP64 (packed fixed-size values:
    the array's bytes); None for the others (protobuf writes them)."""
    if type(data) is not np.ndarray:
        return None
    if datatype is Datatype.FP32 and data.dtype == _F32:
        if np.count_nonzero(np.isnan(data)):
            # through float64 and back, as tolist() and protobuf take them: a signalling NaN comes
            # out quiet, as it did (and numpy says nothing, as tolist() did not)
            with np.errstate(invalid="ignore"):
                data = data.astype(_F64).astype(_F32)
        values = data.tobytes()
        key = b"\x32"
    elif datatype is Datatype.FP64 and data.dtype == _F64:
        values = data.tobytes()
        key = b"\x3a"
    else:
        return None
    return key + _varint(len(values)) + values if values else b""


def _varint(n: int) -> bytes:
    """The protobuf varint of ``0 <= n < 2**64``."""
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _packed(shape: list[int]) -> bytes | None:
    """The packed int64 varints of a shape; None when a dimension is not an int in [0, 2**63)
    (protobuf decides what to do with it)."""
    for dim in shape:
        if type(dim) is not int or not 0 <= dim < _INT64_END:
            return None
    return b"".join([_varint(dim) for dim in shape])


def _field(key: bytes, text: str) -> bytes:
    """A string field (``key``: its tag byte), omitted when empty as proto3 does."""
    if not text:
        return b""
    if type(text) is not str:
        raise TypeError(text)
    data = text.encode()
    return key + _varint(len(data)) + data
