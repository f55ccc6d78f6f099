"""DataPlane.infer_stream / infer_stream_in_band: ids, errors, cancellation and pull, without a transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

import numpy as np
import pytest

from runtime import MLModel
from runtime.errors import InvalidInput, ModelFailed, ModelNotFound
from runtime.settings import ModelSettings
from runtime.streams.pipeline import StreamError
from runtime.types import InferenceRequest, InferenceResponse, RequestOutput, ResponseOutput
from tests.conftest import InProcess
from tests.stream_models import Counter, Endless, Spinner

T = TypeVar("T")

pytestmark = pytest.mark.anyio


def n_request(n: int, id: str | None = None, datatype: str = "INT32") -> InferenceRequest:
    return InferenceRequest.model_validate(
        {"id": id, "inputs": [{"name": "n", "shape": [1], "datatype": datatype, "data": [n]}]}
    )


async def stream_of(*requests: InferenceRequest) -> AsyncIterator[InferenceRequest]:
    for request in requests:
        yield request


def value(response: InferenceResponse, name: str = "i") -> int:
    out = next(o for o in response.outputs if o.name == name)
    return int(np.asarray(out.data).reshape(-1)[0])


class Doubler(MLModel):
    """Unary only: answers x with x*2 (output ``y``) and x+1 (output ``z``); raises on x < 0."""

    async def load(self) -> bool:
        self.streams = 0
        self.seen: list[int] = []
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = int(np.asarray(payload.inputs[0].data).reshape(-1)[0])
        self.seen.append(x)
        if x < 0:
            raise ValueError("negative")
        return InferenceResponse(
            id="made-up-by-the-model",
            outputs=[
                ResponseOutput(name="y", shape=[1], datatype="INT64", data=[x * 2]),
                ResponseOutput(name="z", shape=[1], datatype="INT64", data=[x + 1]),
            ],
        )

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        self.streams += 1
        async for response in super().predict_stream(payloads):
            yield response


class ReadAhead(MLModel):
    """Reads every request first, then answers them in reverse order, tagging each by its id."""

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        taken = [payload async for payload in payloads]
        for payload in reversed(taken):
            yield InferenceResponse(
                id=payload.id,
                outputs=[ResponseOutput(name="i", shape=[1], datatype="INT32", data=payload.inputs[0].data)],
            )


def x_request(x: int, id: str | None = None, outputs: list[str] | None = None) -> InferenceRequest:
    return InferenceRequest(
        id=id,
        inputs=[{"name": "x", "shape": [1], "datatype": "INT64", "data": [x]}],
        outputs=[RequestOutput(name=name) for name in outputs] if outputs else None,
    )


@pytest.fixture
async def core(inprocess: InProcess) -> InProcess:
    await inprocess.load(
        ModelSettings(
            name="counter",
            implementation=Counter,
            inputs=[{"name": "n", "datatype": "INT32", "shape": [1]}],
        ),
        ModelSettings(name="doubler", implementation=Doubler),
        ModelSettings(name="readahead", implementation=ReadAhead),
        ModelSettings(name="endless", implementation=Endless),
    )
    return inprocess


async def collect(stream: AsyncIterator[T]) -> list[T]:
    return [item async for item in stream]


async def test_unary_to_stream_keeps_order_and_the_request_id(core: InProcess) -> None:
    responses = await collect(core.dataplane.infer_stream(stream_of(n_request(5, id="req-1")), "counter"))
    assert [value(r) for r in responses] == [0, 1, 2, 3, 4]
    assert {r.id for r in responses} == {"req-1"}
    assert {r.model_name for r in responses} == {"counter"}


async def test_a_request_without_id_gets_one_id_for_all_its_responses(core: InProcess) -> None:
    responses = await collect(core.dataplane.infer_stream(stream_of(n_request(3)), "counter"))
    ids = {r.id for r in responses}
    assert len(ids) == 1 and None not in ids


async def test_each_response_carries_the_id_of_the_request_it_answers(core: InProcess) -> None:
    """MLServer tags every response of a stream with the first request's id; here each keeps its own."""
    requests = [x_request(x, id=f"r{x}") for x in (1, 2, 3)]
    responses = await collect(core.dataplane.infer_stream(stream_of(*requests), "doubler"))
    assert [(r.id, value(r, "y")) for r in responses] == [("r1", 2), ("r2", 4), ("r3", 6)]


async def test_a_model_that_reads_ahead_tags_its_responses_itself(core: InProcess) -> None:
    requests = [n_request(n, id=f"r{n}") for n in (1, 2, 3)]
    responses = await collect(core.dataplane.infer_stream(stream_of(*requests), "readahead"))
    assert [(r.id, value(r)) for r in responses] == [("r3", 3), ("r2", 2), ("r1", 1)]


async def test_requested_outputs_are_filtered_per_request(core: InProcess) -> None:
    requests = [x_request(1, id="a", outputs=["y"]), x_request(2, id="b", outputs=["z"])]
    responses = await collect(core.dataplane.infer_stream(stream_of(*requests), "doubler"))
    assert [[o.name for o in r.outputs] for r in responses] == [["y"], ["z"]]


async def test_errors_before_the_first_response_raise_at_the_first_step(core: InProcess) -> None:
    with pytest.raises(ModelNotFound):
        await anext(core.dataplane.infer_stream(stream_of(n_request(1)), "missing"))
    with pytest.raises(InvalidInput, match="must be INT32"):
        await anext(core.dataplane.infer_stream(stream_of(n_request(1, datatype="FP32")), "counter"))
    assert core.dataplane.streams.active == 0


async def test_a_model_failure_becomes_model_failed_with_the_cause(core: InProcess) -> None:
    stream = core.dataplane.infer_stream(stream_of(x_request(1), x_request(-1), x_request(2)), "doubler")
    first = await anext(stream)
    assert value(first, "y") == 2
    with pytest.raises(ModelFailed, match="ValueError: negative") as caught:
        await anext(stream)
    assert isinstance(caught.value.__cause__, ValueError)
    model = core.registry.get("doubler").model
    assert isinstance(model, Doubler) and model.seen == [1, -1]  # the stream ended at the failure


async def test_a_bad_request_mid_stream_never_reaches_the_model(core: InProcess) -> None:
    bad = InferenceRequest.model_validate(
        {"id": "bad", "inputs": [{"name": "x", "shape": [2], "datatype": "INT64", "data": [1]}]}
    )
    stream = core.dataplane.infer_stream(stream_of(x_request(1), bad, x_request(3)), "doubler")
    assert value(await anext(stream), "y") == 2
    with pytest.raises(InvalidInput):
        await anext(stream)
    model = core.registry.get("doubler").model
    assert isinstance(model, Doubler) and model.seen == [1]


async def test_in_band_errors_are_tagged_and_the_stream_goes_on(core: InProcess) -> None:
    bad = InferenceRequest.model_validate(
        {"id": "bad", "inputs": [{"name": "x", "shape": [2], "datatype": "INT64", "data": [1]}]}
    )
    requests = [
        bad,
        x_request(1, id="a"),
        x_request(-1, id="boom"),
        x_request(2, id="b"),
        bad,
        x_request(3, id="c"),
    ]
    items = await collect(core.dataplane.infer_stream_in_band(stream_of(*requests), "doubler"))
    summary = [
        (item.request_id, type(item.error).__name__)
        if isinstance(item, StreamError)
        else (item.id, value(item, "y"))
        for item in items
    ]
    assert summary == [
        ("bad", "InvalidInput"),
        ("a", 2),
        ("boom", "ModelFailed"),
        ("b", 4),
        ("bad", "InvalidInput"),
        ("c", 6),
    ]
    model = core.registry.get("doubler").model
    assert isinstance(model, Doubler)
    assert model.seen == [1, -1, 2, 3]
    assert model.streams == 3  # a fresh predict_stream after the failure and after the bad request


async def test_closing_the_stream_closes_the_models_generator(core: InProcess) -> None:
    model = core.registry.get("endless").model
    assert isinstance(model, Endless)
    stream = core.dataplane.infer_stream(stream_of(InferenceRequest(inputs=[])), "endless")
    for _ in range(3):
        await anext(stream)
    assert core.dataplane.streams.active == 1
    await stream.aclose()
    assert (model.started, model.cancelled, model.active) == (1, 1, 0)
    assert core.dataplane.streams.active == 0


async def test_cancelling_the_consumer_cancels_the_model(core: InProcess) -> None:
    model = core.registry.get("endless").model
    assert isinstance(model, Endless)
    pulled = asyncio.Event()

    async def consume() -> None:
        async for _ in core.dataplane.infer_stream(stream_of(InferenceRequest(inputs=[])), "endless"):
            pulled.set()

    task = asyncio.create_task(consume())
    await pulled.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (model.cancelled, model.active) == (1, 0)
    await asyncio.wait_for(core.dataplane.streams.wait_idle(), 10)


async def test_the_model_is_pulled_only_as_fast_as_the_consumer_reads(core: InProcess) -> None:
    model = core.registry.get("endless").model
    assert isinstance(model, Endless)
    stream = core.dataplane.infer_stream(stream_of(InferenceRequest(inputs=[])), "endless")
    for expected in range(1, 6):
        await anext(stream)
        for _ in range(20):
            await asyncio.sleep(0)  # give a (wrong) eager producer every chance to run ahead
        assert model.yielded == expected
    await stream.aclose()


async def test_a_broken_request_source_ends_the_stream_with_its_error(core: InProcess) -> None:
    async def broken() -> AsyncIterator[InferenceRequest]:
        yield x_request(1)
        raise InvalidInput("the transport could not read request 2")

    stream = core.dataplane.infer_stream_in_band(broken(), "doubler")
    assert value(await anext(stream), "y") == 2  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="request 2"):
        await anext(stream)


class Brittle(MLModel):
    """Fails on x < 0; and from its second stream on, fails at once, before it reads anything."""

    async def load(self) -> bool:
        self.streams = 0
        return True

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        self.streams += 1
        if self.streams > 1:
            raise RuntimeError("broken for good")
        async for payload in payloads:
            x = int(np.asarray(payload.inputs[0].data).reshape(-1)[0])
            if x < 0:
                raise RuntimeError("negative")
            yield InferenceResponse(outputs=[ResponseOutput(name="y", shape=[1], datatype="INT64", data=[x])])


async def test_a_model_that_fails_before_reading_is_reported_for_the_request_it_was_given(
    inprocess: InProcess,
) -> None:
    await inprocess.load(ModelSettings(name="brittle", implementation=Brittle))
    requests = [x_request(1, id="a"), x_request(-1, id="b"), x_request(2, id="c"), x_request(3, id="d")]
    items = await collect(inprocess.dataplane.infer_stream_in_band(stream_of(*requests), "brittle"))
    summary = [
        (item.request_id, str(item.error)) if isinstance(item, StreamError) else (item.id, value(item, "y"))
        for item in items
    ]
    assert summary == [
        ("a", 1),
        ("b", "Model 'brittle' failed: RuntimeError: negative"),
        ("c", "Model 'brittle' failed: RuntimeError: broken for good"),
        ("d", "Model 'brittle' failed: RuntimeError: broken for good"),
    ]


async def test_a_model_that_never_awaits_cannot_starve_the_event_loop(inprocess: InProcess) -> None:
    """Race: without the stream's own checkpoints this test never gets the loop back (and times out)."""
    await inprocess.load(ModelSettings(name="spinner", implementation=Spinner))
    pulled = 0

    async def consume() -> None:
        nonlocal pulled
        async for _ in inprocess.dataplane.infer_stream(stream_of(InferenceRequest(inputs=[])), "spinner"):
            pulled += 1

    task = asyncio.create_task(consume())
    for _ in range(3):
        await asyncio.sleep(0.01)  # each of these needs the consumer to give the loop a turn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    model = inprocess.registry.get("spinner").model
    assert isinstance(model, Spinner) and model.cancelled == 1
    assert pulled > 0 and inprocess.dataplane.streams.active == 0
