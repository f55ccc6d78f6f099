"""The DataPlane's stream serving (``runtime.core.stream_serving``): a stream holds its model's entry
while it runs, is counted, checks each request against the model's settings, and is released."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from runtime.core.client_streams import Routed
from runtime.errors import InvalidInput, ModelNotFound
from runtime.settings import ModelParameters, ModelSettings
from runtime.streams.pipeline import StreamError
from runtime.types import InferenceRequest, InferenceResponse
from tests.conftest import InProcess
from tests.stream_models import Counter, Endless

pytestmark = pytest.mark.anyio


def n_request(n: int, datatype: str = "INT32") -> InferenceRequest:
    return InferenceRequest.model_validate(
        {"inputs": [{"name": "n", "shape": [1], "datatype": datatype, "data": [n]}]}
    )


async def stream_of(*requests: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    for request in requests:
        yield request


@pytest.fixture
async def core(inprocess: InProcess) -> InProcess:
    await inprocess.load(
        ModelSettings(
            name="counter",
            implementation=Counter,
            parameters=ModelParameters(version="v3"),
            inputs=[{"name": "n", "datatype": "INT32", "shape": [1]}],
        ),
        ModelSettings(name="endless", implementation=Endless),
    )
    return inprocess


async def test_a_stream_holds_its_models_entry_until_it_is_closed(core: InProcess) -> None:
    entry = core.registry.get("endless")
    stream = core.dataplane.infer_stream(stream_of(InferenceRequest(inputs=[])), "endless")
    assert entry.busy == 0 and core.dataplane.streams.active == 0  # nothing runs before the first pull
    await anext(stream)
    assert entry.busy == 1 and core.dataplane.streams.active == 1
    assert not entry.idle and core.dataplane.in_flight() == 1
    await stream.aclose()
    assert entry.busy == 0 and core.dataplane.streams.active == 0 and entry.idle


async def test_responses_are_named_after_the_models_settings(core: InProcess) -> None:
    responses = [r async for r in core.dataplane.infer_stream(stream_of(n_request(2)), "counter")]
    assert [(r.model_name, r.model_version) for r in responses] == [("counter", "v3")] * 2
    assert [int(np.asarray(r.outputs[0].data).reshape(-1)[0]) for r in responses] == [0, 1]


async def test_a_request_that_fails_the_settings_checks_ends_a_stream_or_is_answered_in_band(
    core: InProcess,
) -> None:
    with pytest.raises(InvalidInput, match="must be INT32"):
        await anext(core.dataplane.infer_stream(stream_of(n_request(1, "FP32")), "counter"))
    items = [
        item
        async for item in core.dataplane.infer_stream_in_band(
            stream_of(n_request(1, "FP32"), n_request(1)), "counter"
        )
    ]
    assert isinstance(items[0], StreamError) and isinstance(items[0].error, InvalidInput)
    assert isinstance(items[1], InferenceResponse) and items[1].model_name == "counter"
    assert core.registry.get("counter").busy == 0 and core.dataplane.streams.active == 0


async def test_model_stream_checks_the_model_before_any_stream(core: InProcess) -> None:
    with pytest.raises(ModelNotFound):
        core.dataplane.model_stream("missing", None, in_band=True)
    serve = core.dataplane.model_stream("counter", None, in_band=False)
    got = [r async for r in serve(stream_of(n_request(1)))]
    assert len(got) == 1 and isinstance(got[0], InferenceResponse)


async def test_client_streams_name_their_model_per_request(core: InProcess) -> None:
    async def items() -> AsyncIterator[Routed[str]]:
        yield Routed("counter", None, "r1", lambda: n_request(2), "a")
        yield Routed("missing", None, "r2", lambda: n_request(1), "b")

    replies = [reply async for reply in core.dataplane.infer_each(items())]
    assert core.dataplane.streams.active == 0
    answered = [(r.tag, r.response.model_name) for r in replies if r.response is not None]
    assert answered == [("a", "counter"), ("a", "counter")]
    failed = [(r.tag, type(r.failure.error)) for r in replies if r.failure is not None]
    assert failed == [("b", ModelNotFound)]
