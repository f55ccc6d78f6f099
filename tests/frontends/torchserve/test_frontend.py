"""What TorchServe's front ends share (``runtime.frontends.torchserve.frontend``): a request from entries,
headers and a sequence id, and which models answer as a stream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from runtime.frontends.torchserve.frontend import FrontEnd, is_handler, streamed
from runtime.settings import ModelSettings
from runtime.torchserve import PLATFORM
from runtime.torchserve.payload import META, Entry
from runtime.types import InferenceRequest


def _meta(request: InferenceRequest) -> Any:
    (meta,) = [inp for inp in request.inputs if inp.name == META]
    return orjson.loads(meta.data[0])


def test_a_plain_models_request_carries_the_sequence_id_as_a_header_only() -> None:
    request = FrontEnd.request(ModelSettings(name="m"), [Entry("body", b"x")], {"a": "1"}, "seq-1")
    assert _meta(request)["headers"] == {"a": "1", "ts_request_sequence_id": "seq-1"}
    assert request.parameters is None


def test_a_sequence_models_request_gets_the_sequence_parameters() -> None:
    settings = ModelSettings(name="m", sequence_batching=True)
    going_on = FrontEnd.request(settings, [Entry("body", b"x")], {"ts_request_sequence_end": "true"}, "s")
    assert going_on.parameters is not None
    assert going_on.parameters.model_extra == {"sequence_id": "s", "sequence_end": True}
    new = FrontEnd.request(settings, [Entry("body", b"x")], {}, None)
    assert new.parameters is not None and new.parameters.model_extra == {"sequence_start": True}


def test_an_explanation_is_marked_for_the_handler_and_for_the_batcher() -> None:
    request = FrontEnd.request(ModelSettings(name="m"), [Entry("body", b"x")], {}, None, explain=True)
    assert _meta(request)["headers"] == {"explain": "True"}
    assert request.parameters is not None and request.parameters.model_extra == {"explain": True}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, True),
        ({"continuous_batching": True}, True),
        ({"sequence_batching": True}, False),
        ({"max_batch_size": 4, "max_batch_time": 0.01}, False),
        ({"max_batch_size": 4}, True),  # no wait for a batch: no adaptive batching
    ],
)
def test_which_models_answer_as_a_stream(fields: dict[str, Any], expected: bool) -> None:
    assert streamed(ModelSettings(name="m", **fields)) is expected


def test_a_handler_is_told_by_its_platform() -> None:
    assert is_handler(ModelSettings(name="m", platform=PLATFORM))
    assert not is_handler(ModelSettings(name="m"))
