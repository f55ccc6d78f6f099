"""The datetime codec (``runtime.codecs.datetime``): ISO 8601 text in BYTES tensors."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest

from runtime.codecs import DatetimeCodec, find_input_codec
from runtime.errors import InvalidInput
from runtime.types import RequestInput

WHEN = [datetime(2024, 5, 6, 7, 8, 9), datetime(2024, 1, 1, tzinfo=timezone.utc)]


def test_datetimes_travel_as_iso_text_both_ways() -> None:
    out = DatetimeCodec.encode_output("t", WHEN)
    assert (out.datatype.value, out.shape, out.parameters and out.parameters.content_type) == (
        "BYTES",
        [2, 1],
        "datetime",
    )
    assert out.data.reshape(-1).tolist() == [b"2024-05-06T07:08:09", b"2024-01-01T00:00:00+00:00"]
    assert DatetimeCodec.decode_output(out) == WHEN
    inp = DatetimeCodec.encode_input("t", ["2024-05-06T07:08:09", WHEN[1]])
    assert DatetimeCodec.decode_input(inp) == WHEN


def test_it_is_found_by_content_type_and_payload() -> None:
    assert find_input_codec(content_type="datetime") is DatetimeCodec
    assert find_input_codec(payload=WHEN) is DatetimeCodec
    assert not DatetimeCodec.can_encode([]) and not DatetimeCodec.can_encode(["2024-01-01"])


def test_text_that_is_not_a_date_is_refused_naming_the_tensor() -> None:
    inp = RequestInput(name="t", shape=[1], datatype="BYTES", data=np.array([b"yesterday"], dtype=object))
    with pytest.raises(InvalidInput, match="Tensor 't' holds b'yesterday', which is not an ISO 8601"):
        DatetimeCodec.decode_input(inp)
    with pytest.raises(TypeError, match="encodes datetimes or ISO 8601 strings"):
        DatetimeCodec.encode_output("t", [3])
