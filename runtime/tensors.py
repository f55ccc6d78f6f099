"""Tensors between the wire and numpy: datatypes, checks, raw bytes, JSON-ready data.

Every input a model sees went through :func:`input_array` once, in the DataPlane: it checks the
shape against the data and returns a numpy array *of the tensor's shape* without going through
Python lists where the wire allows it (raw and binary data become ``np.frombuffer`` views).
Every output a model returned goes through :func:`output_array` once, so that the transports
only turn arrays into bytes (:func:`to_raw`) or JSON-ready data (:func:`to_json_data`).

BYTES tensors are object arrays of ``bytes``; in raw form each element is a 4-byte little-endian
length followed by its bytes. BF16 has no numpy dtype: it is carried as ``uint16`` bit patterns
(the upper half of a float32), which torch can view as ``bfloat16`` without a copy.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from runtime.errors import InvalidInput, ModelFailed
from runtime.types import Datatype, RequestInput, ResponseOutput

_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
    "BF16": np.dtype("<u2"),
}

_DATATYPES: dict[str, str] = {
    "b": "BOOL",
    "u1": "UINT8",
    "u2": "UINT16",
    "u4": "UINT32",
    "u8": "UINT64",
    "i1": "INT8",
    "i2": "INT16",
    "i4": "INT32",
    "i8": "INT64",
    "f2": "FP16",
    "f4": "FP32",
    "f8": "FP64",
    "O": "BYTES",
    "S": "BYTES",
    "U": "BYTES",
}

_LEN = struct.Struct("<I")


def dtype_of(datatype: str | Datatype) -> np.dtype[Any]:
    """The numpy dtype that holds a protocol datatype."""
    try:
        return _DTYPES[str(datatype)]
    except KeyError:
        raise InvalidInput(f"Unknown datatype {datatype!r}") from None


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The protocol datatype of a numpy dtype (strings and objects are BYTES)."""
    kind = dtype.kind
    key = kind if kind in "bOSU" else f"{kind}{dtype.itemsize}"
    try:
        return _DATATYPES[key]
    except KeyError:
        raise InvalidInput(f"numpy dtype {dtype} has no protocol datatype") from None


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


MAX_ELEMENTS = np.iinfo(np.intp).max // 16
"""Most elements a tensor's shape may describe, counting only its non-zero dimensions (so that
numpy can make an array of that shape, even an empty one, of any datatype)."""


MAX_DIMS = 32
"""Most dimensions a tensor may have: numpy 1's limit (numpy 2's is 64), so that every build of
numpy, and the frameworks built on it, can hold any tensor a request carries."""


def check_shape(name: str, shape: Sequence[int]) -> None:
    """Refuse a shape no tensor can have: too many dimensions, a negative one, or too many elements.

    A zero dimension is valid (as in Triton): the tensor is empty and its data must be too.
    """
    if len(shape) > MAX_DIMS:
        raise InvalidInput(f"Tensor {name!r} has {len(shape)} dimensions; a tensor has at most {MAX_DIMS}")
    nonzero = 1
    for dim in shape:
        if dim < 0:
            raise InvalidInput(f"Tensor {name!r} has a negative dimension in shape {list(shape)}")
        if dim:
            nonzero *= dim
            if nonzero > MAX_ELEMENTS:
                raise InvalidInput(
                    f"Tensor {name!r} has shape {list(shape)}, whose dimensions multiply past "
                    f"{MAX_ELEMENTS} elements"
                )


# ---------------------------------------------------------------- raw bytes <-> arrays


def unpack_bytes(name: str, raw: bytes | bytearray | memoryview, count: int | None = None) -> np.ndarray:
    """Split length-prefixed BYTES elements into an object array of ``bytes``."""
    view = memoryview(raw)
    items: list[bytes] = []
    offset, end = 0, len(view)
    while offset < end:
        if offset + 4 > end:
            raise InvalidInput(f"Tensor {name!r}: truncated length prefix in BYTES data")
        (size,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + size > end:
            raise InvalidInput(f"Tensor {name!r}: BYTES element of {size} bytes runs past the data")
        items.append(bytes(view[offset : offset + size]))
        offset += size
    if count is not None and len(items) != count:
        raise InvalidInput(
            f"Tensor {name!r}: shape needs {count} BYTES elements but the data holds {len(items)}"
        )
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def pack_bytes(array: np.ndarray) -> bytes:
    """Length-prefixed raw form of a BYTES tensor."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = _as_bytes(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def to_raw(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """The raw little-endian, row-major bytes of a tensor (a view where no copy is needed)."""
    if datatype == "BYTES":
        return pack_bytes(array)
    dtype = _DTYPES[datatype]
    contiguous = np.ascontiguousarray(array, dtype=dtype)
    if contiguous.size == 0:  # a memoryview with a zero in its shape cannot be cast to bytes
        return b""
    return memoryview(contiguous).cast("B")  # type: ignore[arg-type]


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    return str(item).encode("utf-8")


# ---------------------------------------------------------------- inputs


def input_array(inp: RequestInput) -> np.ndarray:
    """Check a request tensor and return its data as a numpy array of its shape."""
    name, shape, kind = inp.name, inp.shape, inp.datatype
    # the datatype's text: a Datatype member's value read from the member (its ``value``
    # property and ``__str__`` are two Python calls), anything else as ``str`` makes it
    datatype: str = kind._value_ if type(kind) is Datatype else str(kind)
    check_shape(name, shape)
    count = math.prod(shape)
    data = inp.data
    if data is None:
        raise InvalidInput(f"Input {name!r} has no data")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return _raw_array(name, data, shape, datatype, count)
    if isinstance(data, np.ndarray):
        arr = data
        if datatype != "BYTES" and arr.dtype != _DTYPES[datatype]:
            arr = arr.astype(_DTYPES[datatype])
    elif isinstance(data, list):
        arr = _list_array(name, data, datatype)
    else:
        # a single scalar: the protocol always sends a list, but be lenient
        arr = _list_array(name, [data], datatype)
    if arr.size != count:
        raise InvalidInput(
            f"Input {name!r} has shape {list(shape)} ({count} elements) but its data has {arr.size} elements"
        )
    return arr.reshape(shape)


def _raw_array(
    name: str, data: bytes | bytearray | memoryview, shape: list[int], datatype: str, count: int
) -> np.ndarray:
    if datatype == "BYTES":
        return unpack_bytes(name, data, count).reshape(shape)
    dtype = _DTYPES[datatype]
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise InvalidInput(
            f"Input {name!r} has shape {list(shape)} of {datatype}, which needs {expected} bytes, "
            f"but {len(data)} bytes were sent"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _list_array(name: str, data: list[Any], datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        flat = _flatten(data)
        out = np.empty(len(flat), dtype=object)
        try:
            out[:] = [_json_bytes(item) for item in flat]
        except TypeError as exc:
            raise InvalidInput(f"Input {name!r}: {exc}") from None
        return out
    try:
        if datatype == "BF16":
            return _bf16_from_floats(np.asarray(data, dtype=np.float32))
        if datatype == "BOOL":
            arr = np.asarray(data)
            if arr.dtype.kind not in "biu" and arr.size:
                raise ValueError(f"BOOL data must be true/false, got {arr.dtype}")
            return arr.astype(np.bool_)
        arr = np.asarray(data, dtype=_DTYPES[datatype])
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"Input {name!r} has data that is not valid {datatype}: {exc}") from None
    return arr


def _json_bytes(item: Any) -> bytes:
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, bytes):
        return item
    raise TypeError(f"BYTES elements must be strings, got {type(item).__name__}")


def _flatten(data: list[Any]) -> list[Any]:
    if not any(isinstance(item, list) for item in data):
        return data
    out: list[Any] = []
    for item in data:
        if isinstance(item, list):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return out


def _bf16_from_floats(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (0x7FFF + ((bits >> 16) & 1))  # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- outputs


def output_array(out: ResponseOutput) -> np.ndarray:
    """Check a model's output tensor and return its data as a numpy array of the right dtype."""
    name, shape, kind = out.name, out.shape, out.datatype
    # the datatype's text: a Datatype member's value read from the member (its ``value``
    # property and ``__str__`` are two Python calls), anything else as ``str`` makes it
    datatype: str = kind._value_ if type(kind) is Datatype else str(kind)
    data = out.data
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            return _raw_array(name, data, shape, datatype, element_count(shape))
        if datatype == "BYTES":
            if isinstance(data, np.ndarray) and data.dtype == object:
                arr = data
            else:
                flat = _flatten(list(np.asarray(data, dtype=object).reshape(-1))) if data is not None else []
                arr = np.empty(len(flat), dtype=object)
                arr[:] = [_as_bytes(item) for item in flat]
        elif isinstance(data, np.ndarray) and data.dtype == _DTYPES[datatype]:
            arr = data
        elif datatype == "BF16":
            arr = _bf16_from_floats(np.asarray(data, dtype=np.float32))
        else:
            arr = np.asarray(data, dtype=_DTYPES[datatype])
    except InvalidInput as exc:
        raise ModelFailed(f"Model returned an invalid output: {exc}") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise ModelFailed(
            f"Model returned output {name!r} whose data is not valid {datatype}: {exc}"
        ) from None
    count = math.prod(shape)
    if arr.size != count:
        raise ModelFailed(
            f"Model returned output {name!r} with shape {list(shape)} ({count} elements) "
            f"but {arr.size} elements of data"
        )
    return arr


def to_json_data(array: np.ndarray, datatype: str, check_finite: bool = True) -> Any:
    """Data that orjson (with OPT_SERIALIZE_NUMPY) writes as a flat JSON list.

    Floats that are NaN or infinite are written ``NaN``, ``Infinity``, ``-Infinity``: a value is
    never changed (plain JSON has no such tokens, and orjson would write null). With
    ``check_finite=False`` a float array is returned as it is, unchecked: the caller looks for
    ``null`` in what orjson wrote and, if it finds one, asks again with the check (a finite array,
    the usual case, then costs no pass over its values).
    """
    if datatype == "BYTES":
        out: list[str] = []
        for item in array.reshape(-1):
            data = _as_bytes(item)
            try:
                out.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidInput(
                    "An output holds bytes that are not UTF-8 and cannot be written as JSON; "
                    "request it in binary form (binary_data)"
                ) from None
        return out
    if datatype == "BF16":
        array = bf16_to_float32(array)
    flat = array.reshape(-1)
    if not flat.flags.c_contiguous or not flat.dtype.isnative:
        flat = np.ascontiguousarray(flat, dtype=flat.dtype.newbyteorder("="))
    # a sum is finite only when every value is (one pass, no temporary array); a finite array
    # whose sum overflows takes the careful path, which writes it unchanged
    if check_finite and flat.dtype.kind == "f" and not math.isfinite(np.add.reduce(flat)):
        return _non_finite_json(flat)
    return flat


_NON_FINITE = {"nan": b"NaN", "inf": b"Infinity", "-inf": b"-Infinity"}


def _non_finite_json(flat: np.ndarray) -> orjson.Fragment:
    """A float array holding NaN or infinities as JSON, with the tokens ``NaN``, ``Infinity`` and
    ``-Infinity`` (as Python's json and Triton's writer write them) where orjson would write null.

    orjson writes every finite value as it always does; the non-finite ones are put in their place
    (a flat array's elements are its text split at the commas). Only arrays with such values pay.
    """
    tokens = orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    for index in np.flatnonzero(~np.isfinite(flat)).tolist():
        tokens[index] = _NON_FINITE[str(float(flat[index]))]
    return orjson.Fragment(b"[" + b",".join(tokens) + b"]")
