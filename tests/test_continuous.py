"""The model API for continuous batching (``runtime.continuous``): what a model sees of a stream,
what one step returns, the default ``combine`` (chunks stacked along the first axis), a model that
does not implement ``step``, and a sequence's state shared by its streams; then the API served in
process, a unary request answered with its chunks combined."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.continuous import (
    ContinuousModel,
    SequenceState,
    StepResult,
    Stream,
    StreamSequence,
    stack_chunks,
)
from runtime.errors import ModelFailed
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput
from tests.conftest import InProcess
from tests.continuous_helpers import ticker_settings

pytestmark = pytest.mark.anyio


def _chunk(value: list[int], name: str = "tick", id_: str = "s") -> InferenceResponse:
    return InferenceResponse(
        model_name="m",
        id=id_,
        outputs=[ResponseOutput(name=name, shape=[len(value)], datatype="INT64", data=np.array(value))],
    )


def test_a_new_stream_has_taken_no_step() -> None:
    request = InferenceRequest(id="r1", inputs=[])
    stream = Stream(request, "r1")
    assert stream.id == "r1" and stream.request is request
    assert stream.steps == 0 and stream.state is None and stream.sequence is None
    assert repr(stream) == "Stream('r1', steps=0)"


def test_a_step_result_says_chunk_end_or_error() -> None:
    assert StepResult() == StepResult(None, False, None)  # nothing this step
    last = StepResult(_chunk([1]), finished=True)
    assert last.response is not None and last.finished and last.error is None
    failed = StepResult(error=ValueError("bad"))
    assert failed.response is None and not failed.finished and isinstance(failed.error, ValueError)


def test_the_streams_of_a_sequence_share_its_state() -> None:
    shared = SequenceState({"n": 1})
    first = StreamSequence("42", start=True, end=False, shared=shared)
    second = StreamSequence("42", start=False, end=True, shared=shared)
    first.state = {"n": 2}
    assert second.state == {"n": 2} and shared.state == {"n": 2}
    assert first.start and not first.end and second.end
    assert repr(first).startswith("StreamSequence('42'")


def test_stack_chunks_concatenates_along_the_first_axis() -> None:
    one = _chunk([1])
    assert stack_chunks("m", [one]) is one  # a single chunk as it is
    last = _chunk([3, 4], id_="last")
    last.parameters = Parameters(step_id=2)
    combined = stack_chunks("m", [_chunk([1]), _chunk([2]), last])
    (output,) = combined.outputs
    assert output.name == "tick" and output.shape == [4] and output.datatype == "INT64"
    assert np.array_equal(np.asarray(output.data), [1, 2, 3, 4])
    assert combined.id == "last" and combined.parameters is last.parameters


def test_stack_chunks_refuses_nothing_and_mismatched_outputs() -> None:
    with pytest.raises(ModelFailed, match="without producing any chunk"):
        stack_chunks("m", [])
    with pytest.raises(ModelFailed, match="must implement combine"):
        stack_chunks("m", [_chunk([1]), _chunk([2], name="other")])


def test_a_model_without_step_says_so() -> None:
    class NoStep(ContinuousModel):
        pass

    model = NoStep(ModelSettings(name="nostep", implementation=NoStep))
    with pytest.raises(NotImplementedError, match="NoStep must implement step"):
        model.step([])
    assert model.combine(Stream(InferenceRequest(inputs=[]), "x"), [_chunk([5])]).outputs[0].name == "tick"


async def test_a_unary_request_gets_its_chunks_combined(inprocess: InProcess) -> None:
    await inprocess.load(ticker_settings())
    async with inprocess.client() as client:
        answer = await client.post(
            "/v2/models/ticker/infer", json={"inputs": [], "parameters": {"length": 4}}
        )
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["name"] == "tick" and output["data"] == [1, 2, 3, 4]
