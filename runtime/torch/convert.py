"""numpy arrays <-> torch tensors, by protocol datatype, without copies where torch allows.

Inputs reach the runtime as numpy arrays (``runtime.tensors.input_array``). Three cases:

- a writable array (decoded from JSON, or built in process) becomes a tensor that shares its
  memory (``torch.from_numpy``);
- a read-only array (an ``np.frombuffer`` view of a binary or raw request body) also shares its
  memory, through DLPack, which torch accepts for read-only buffers without the warning
  ``from_numpy`` gives; only if DLPack refuses is it copied once (``torch.tensor``);
- on a CUDA device the host-to-device transfer is the one copy.

BF16 travels as ``uint16`` bit patterns (see ``runtime.tensors``) and is reinterpreted with
``Tensor.view(torch.bfloat16)``, which copies nothing. Outputs go the other way: a CPU tensor
becomes an array that shares its memory (``Tensor.numpy``); a device tensor is copied to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

# the torch dtype each protocol datatype maps to; BYTES has none
DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "UINT16": torch.uint16,
    "UINT32": torch.uint32,
    "UINT64": torch.uint64,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
    "BF16": torch.bfloat16,
}

DATATYPES: dict[torch.dtype, str] = {dtype: datatype for datatype, dtype in DTYPES.items()}

FLOATING = frozenset({"FP16", "FP32", "FP64", "BF16"})


def torch_dtype(datatype: str) -> torch.dtype:
    """The torch dtype of a protocol datatype; ValueError for BYTES (torch has no string tensors)."""
    try:
        return DTYPES[datatype]
    except KeyError:
        raise ValueError(f"datatype {datatype} has no torch dtype") from None


def datatype_of(dtype: torch.dtype) -> str:
    """The protocol datatype of a torch dtype; ValueError for those the protocol lacks (complex, fp8)."""
    try:
        return DATATYPES[dtype]
    except KeyError:
        raise ValueError(f"torch dtype {dtype} has no protocol datatype") from None


def to_tensor(
    array: np.ndarray, datatype: str, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The tensor of an input array on ``device``, converted to ``dtype`` when one is given."""
    tensor = _host_tensor(array)
    if datatype == "BF16":
        tensor = tensor.view(torch.bfloat16)
    if tensor.device != device:
        tensor = tensor.to(device)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    if array.flags.writeable:
        return torch.from_numpy(array)
    try:
        return from_dlpack(array)
    except (BufferError, TypeError, RuntimeError):
        return torch.tensor(array)  # the one copy, where DLPack cannot share the buffer


def to_array(tensor: torch.Tensor, datatype: str | None = None) -> tuple[np.ndarray, str]:
    """A host array of an output tensor and its protocol datatype.

    When ``datatype`` is given (the output's declared datatype) and the tensor's dtype differs,
    the tensor is converted, between floating-point dtypes only: any other difference is an error
    rather than a silent cast (e.g. int64 indices declared INT32).
    """
    tensor = tensor.detach()  # a model may return a parameter, which requires grad
    actual = datatype_of(tensor.dtype)
    if datatype is not None and datatype != actual:
        if actual not in FLOATING or datatype not in FLOATING:
            raise TypeError(f"is {tensor.dtype} but is declared {datatype}")
        tensor = tensor.to(DTYPES[datatype])
        actual = datatype
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if actual == "BF16":
        return tensor.view(torch.int16).numpy().view(np.uint16), actual
    return tensor.numpy(), actual


def describe(value: Any) -> str:
    """A short description of what a model returned, for error messages."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"
