"""runtime.torch.convert at its edges: datatypes one side lacks, and how results are described."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.torch.convert import DTYPES, datatype_of, describe, to_array, torch_dtype


def test_every_protocol_datatype_but_bytes_has_a_torch_dtype_and_back() -> None:
    for datatype, dtype in DTYPES.items():
        assert torch_dtype(datatype) is dtype
        assert datatype_of(dtype) == datatype
    with pytest.raises(ValueError, match="datatype BYTES has no torch dtype"):
        torch_dtype("BYTES")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float8_e4m3fn])
def test_a_torch_dtype_the_protocol_lacks_is_refused(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="has no protocol datatype"):
        datatype_of(dtype)
    with pytest.raises(ValueError, match="has no protocol datatype"):
        to_array(torch.zeros(2, dtype=dtype))


def test_outputs_are_described_by_dtype_and_shape_or_by_type() -> None:
    assert describe(torch.zeros(2, 3)) == "a torch.float32 tensor of shape [2, 3]"
    assert describe({"y": 1}) == "a dict"
    assert describe(np.zeros(1)) == "a ndarray"
