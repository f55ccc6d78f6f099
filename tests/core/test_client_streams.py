"""Client streams whose requests each name their model (runtime.core.client_streams), in process, without gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from runtime import MLModel
from runtime.core.client_streams import Reply, Routed
from runtime.errors import InvalidInput
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput
from tests.conftest import InProcess
from tests.stream_models import Counter, Endless, Words

pytestmark = pytest.mark.anyio


class Tally(MLModel):
    """Answers each request with its ``x`` and counts the calls of its predict_stream."""

    async def load(self) -> bool:
        self.streams = 0
        return True

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        self.streams += 1
        async for payload in payloads:
            yield InferenceResponse(
                outputs=[ResponseOutput(name="x", shape=[1], datatype="INT64", data=payload.inputs[0].data)]
            )


class Gate(MLModel):
    """Holds every request until ``open`` is set, then answers it twice; counts who is inside."""

    async def load(self) -> bool:
        self.inside = 0
        self.most_inside = 0
        self.arrived = asyncio.Event()
        self.open = asyncio.Event()
        self.expected = 0
        return True

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for _ in payloads:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            if self.inside == self.expected:
                self.arrived.set()
            try:
                await self.open.wait()
                for i in range(2):
                    yield InferenceResponse(
                        outputs=[ResponseOutput(name="i", shape=[1], datatype="INT32", data=[i])]
                    )
            finally:
                self.inside -= 1


MODELS = (
    ModelSettings(
        name="counter",
        implementation=Counter,
        inputs=[{"name": "n", "datatype": "INT32", "shape": [1]}],
    ),
    ModelSettings(name="words", implementation=Words),
    ModelSettings(name="tally", implementation=Tally),
    ModelSettings(name="gate", implementation=Gate),
    ModelSettings(name="endless", implementation=Endless),
)


@pytest.fixture
async def core(inprocess: InProcess) -> InProcess:
    await inprocess.load(*MODELS)
    return inprocess


def routed(model: str, id: str | None, tag: str, make: Callable[[], InferenceRequest]) -> Routed[str]:
    return Routed(model=model, version=None, id=id, decode=make, tag=tag)


def counter(n: int, id: str | None, tag: str, datatype: str = "INT32") -> Routed[str]:
    return routed(
        "counter",
        id,
        tag,
        lambda: InferenceRequest.model_validate(
            {"id": id, "inputs": [{"name": "n", "shape": [1], "datatype": datatype, "data": [n]}]}
        ),
    )


def words(text: str, id: str | None, tag: str, model: str = "words", **parameters: Any) -> Routed[str]:
    return routed(
        model,
        id,
        tag,
        lambda: InferenceRequest.model_validate(
            {
                "id": id,
                "parameters": parameters or None,
                "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [text]}],
            }
        ),
    )


def x(value: int, id: str, tag: str, model: str = "tally") -> Routed[str]:
    return routed(
        model,
        id,
        tag,
        lambda: InferenceRequest.model_validate(
            {"id": id, "inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [value]}]}
        ),
    )


def undecodable(id: str, tag: str, model: str = "counter") -> Routed[str]:
    def fail() -> InferenceRequest:
        raise InvalidInput(f"message {id} is malformed")

    return routed(model, id, tag, fail)


async def source(*items: Routed[str]) -> AsyncIterator[Routed[str]]:
    for item in items:
        yield item


def summary(reply: Reply[str]) -> tuple[Any, ...]:
    """(tag, request id, what): what is the value answered, the error's class, or 'end'."""
    if reply.failure is not None:
        return (reply.tag, reply.request_id, type(reply.failure.error).__name__, reply.last)
    if reply.response is None:
        return (reply.tag, reply.request_id, "end", reply.last)
    out = reply.response.outputs[0]
    data = np.asarray(out.data).reshape(-1)[0]
    return (reply.tag, reply.request_id, data.decode() if isinstance(data, bytes) else int(data), reply.last)


async def test_sessions_tag_every_reply_and_go_on_after_every_kind_of_error(core: InProcess) -> None:
    items = [
        counter(2, "a", "A"),
        counter(1, "b", "B", datatype="FP32"),  # fails the model's checks
        undecodable("c", "C"),
        counter(1, "d", "D"),
        words("x y", "e", "E", model="nope"),  # unknown model
        words("x y", "f", "F"),
        words("p q r", "g", "G", fail_after=1),  # the model fails after one word
        words("z", None, "H"),  # no id: the core names it
    ]
    replies = [reply async for reply in core.dataplane.infer_routed(source(*items))]
    got = [summary(reply) for reply in replies]
    made_up = got[-1][1]
    assert got == [
        ("A", "a", 0, False),
        ("A", "a", 1, False),
        ("B", "b", "InvalidInput", False),
        ("C", "c", "InvalidInput", False),
        ("D", "d", 0, False),
        ("E", "e", "ModelNotFound", False),
        ("F", "f", "x", False),
        ("F", "f", "y", False),
        ("G", "g", "p", False),
        ("G", "g", "ModelFailed", False),
        ("H", made_up, "z", False),
    ]
    assert made_up and made_up != "None"
    assert {(r.model, r.version) for r in replies} == {("counter", None), ("nope", None), ("words", None)}
    assert core.dataplane.streams.active == 0


async def test_sessions_feed_one_model_stream_per_run_of_requests(core: InProcess) -> None:
    items = [x(1, "a", "A"), x(2, "b", "B"), counter(1, "c", "C"), x(3, "d", "D"), x(4, "e", "E")]
    got = [summary(reply) async for reply in core.dataplane.infer_routed(source(*items))]
    assert got == [
        ("A", "a", 1, False),
        ("B", "b", 2, False),
        ("C", "c", 0, False),
        ("D", "d", 3, False),
        ("E", "e", 4, False),
    ]
    model = core.registry.get("tally").model
    assert isinstance(model, Tally) and model.streams == 2  # a-b, then d-e after the switch


async def test_each_answers_every_request_and_ends_it_with_one_last_reply(core: InProcess) -> None:
    items = [
        words("a b", "w1", "W1"),
        undecodable("u", "U"),
        words("c", "w2", "W2", model="nope"),
        counter(1, "bad", "BAD", datatype="FP32"),
        words("p q r", "f", "F", fail_after=2),
        words("d e", None, "W3"),
    ]
    replies = [reply async for reply in core.dataplane.infer_each(source(*items))]
    by_tag: dict[str, list[tuple[Any, ...]]] = {}
    for reply in replies:
        by_tag.setdefault(reply.tag, []).append(summary(reply)[1:])
    made_up = by_tag["W3"][0][0]
    assert by_tag == {
        "W1": [("w1", "a", False), ("w1", "b", False), ("w1", "end", True)],
        "U": [("u", "InvalidInput", True)],
        "W2": [("w2", "ModelNotFound", True)],
        "BAD": [("bad", "InvalidInput", True)],
        "F": [("f", "p", False), ("f", "q", False), ("f", "ModelFailed", True)],
        "W3": [(made_up, "d", False), (made_up, "e", False), (made_up, "end", True)],
    }
    assert made_up is not None
    assert core.dataplane.streams.active == 0


async def test_each_serves_requests_concurrently_up_to_the_limit(core: InProcess) -> None:
    """Race guarded: the reader must stop reading at the limit, not queue requests it cannot serve."""
    model = core.registry.get("gate").model
    assert isinstance(model, Gate)
    model.expected = 3
    pulled = 0

    async def counted() -> AsyncIterator[Routed[str]]:
        nonlocal pulled
        for k in range(7):
            pulled += 1
            yield counter_like_gate(k)

    def counter_like_gate(k: int) -> Routed[str]:
        return routed("gate", f"g{k}", f"G{k}", lambda: InferenceRequest(id=f"g{k}", inputs=[]))

    stream = core.dataplane.infer_each(counted(), limit=3)
    first = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(model.arrived.wait(), 10)
    for _ in range(20):
        await asyncio.sleep(0)  # give a (wrong) eager reader every chance to read on
    assert (pulled, model.inside) == (3, 3)
    model.open.set()
    replies = [await first] + [reply async for reply in stream]
    assert model.most_inside == 3 and pulled == 7
    ends = [reply.tag for reply in replies if reply.last]
    assert sorted(ends) == [f"G{k}" for k in range(7)]
    for k in range(7):
        mine = [summary(reply)[1:] for reply in replies if reply.tag == f"G{k}"]
        assert mine == [(f"g{k}", 0, False), (f"g{k}", 1, False), (f"g{k}", "end", True)]


async def test_closing_each_cancels_every_request_in_it(core: InProcess) -> None:
    model = core.registry.get("endless").model
    assert isinstance(model, Endless)
    items = [routed("endless", f"e{k}", f"E{k}", lambda: InferenceRequest(inputs=[])) for k in range(5)]
    stream = core.dataplane.infer_each(source(*items))
    seen: set[str] = set()
    while len(seen) < 5:  # every request has answered at least once
        seen.add((await anext(stream)).tag)
    await stream.aclose()
    assert (model.started, model.cancelled, model.active) == (5, 5, 0)
    assert core.dataplane.streams.active == 0


async def test_cancelling_the_consumer_of_sessions_cancels_the_model(core: InProcess) -> None:
    model = core.registry.get("endless").model
    assert isinstance(model, Endless)
    pulled = asyncio.Event()

    async def consume() -> None:
        items = source(routed("endless", "e", "E", lambda: InferenceRequest(inputs=[])))
        async for _ in core.dataplane.infer_routed(items):
            pulled.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(pulled.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (model.cancelled, model.active) == (1, 0)
    assert core.dataplane.streams.active == 0


async def test_a_failing_read_ends_each_after_answering_what_was_read(core: InProcess) -> None:
    async def broken() -> AsyncIterator[Routed[str]]:
        yield words("a b", "w1", "W1")
        yield counter(2, "c1", "C1")
        raise ConnectionError("the transport could not read")

    replies = []
    with pytest.raises(ConnectionError, match="could not read"):
        async for reply in core.dataplane.infer_each(broken()):
            replies.append(summary(reply))
    assert sorted(replies, key=str) == sorted(
        [
            ("W1", "w1", "a", False),
            ("W1", "w1", "b", False),
            ("W1", "w1", "end", True),
            ("C1", "c1", 0, False),
            ("C1", "c1", 1, False),
            ("C1", "c1", "end", True),
        ],
        key=str,
    )
    assert core.dataplane.streams.active == 0
