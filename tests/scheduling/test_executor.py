"""The executor seam (``runtime.scheduling.executor``): where a model's code is called.

In process, a coroutine ``predict`` runs on the event loop and a plain ``def predict`` on the
model's own threads; a scheduler calls the model only through its executor, so that another
executor (worker processes) plugs in without the scheduler knowing.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from runtime.model import MLModel
from runtime.scheduling.direct import DirectScheduler
from runtime.scheduling.executor import Executor, InProcessExecutor
from runtime.sequences.sequence_model import EndReason, SequenceStep
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse


def settings(name: str) -> ModelSettings:
    return ModelSettings(name=name, implementation=MLModel)


def answer(request: InferenceRequest, where: str) -> InferenceResponse:
    return InferenceResponse(model_name=where, id=request.id, outputs=[])


class Awaiting(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return answer(payload, threading.current_thread().name)


class Plain(MLModel):
    def predict(self, payload: InferenceRequest) -> InferenceResponse:  # type: ignore[override]
        return answer(payload, threading.current_thread().name)


async def requests(*ids: str) -> AsyncIterator[InferenceRequest]:
    for request_id in ids:
        yield InferenceRequest(id=request_id, inputs=[])


async def test_a_coroutine_predict_runs_on_the_event_loop() -> None:
    executor = InProcessExecutor(Awaiting(settings("awaiting")), settings("awaiting"))
    response = await executor.call_predict(InferenceRequest(id="a", inputs=[]))
    assert not executor.blocking
    assert response.model_name == threading.current_thread().name


async def test_a_plain_predict_runs_on_the_models_threads_for_calls_and_streams() -> None:
    executor = InProcessExecutor(Plain(settings("plain")), settings("plain"))
    try:
        response = await executor.call_predict(InferenceRequest(id="a", inputs=[]))
        assert executor.blocking
        assert response.model_name.startswith("predict-plain")
        streamed = [r async for r in executor.open_stream(requests("b", "c"))]
        assert [r.id for r in streamed] == ["b", "c"]
        assert all(r.model_name.startswith("predict-plain") for r in streamed)
    finally:
        executor.close()


async def test_sequence_calls_need_a_sequence_model() -> None:
    executor = InProcessExecutor(Awaiting(settings("awaiting")), settings("awaiting"))
    with pytest.raises(TypeError, match=r"not a runtime\.SequenceModel"):
        await executor.predict_sequences([])
    with pytest.raises(TypeError, match=r"not a runtime\.SequenceModel"):
        await executor.sequence_ended("s", "end", None)


class Recording(Executor):
    """An executor of a test's own: what it was asked, answered without the model."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call_predict(self, request: InferenceRequest) -> InferenceResponse:
        self.calls.append(f"predict {request.id}")
        return answer(request, "recording")

    async def open_stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for request in requests:
            self.calls.append(f"stream {request.id}")
            yield answer(request, "recording")

    async def predict_sequences(
        self, steps: list[SequenceStep]
    ) -> Sequence[InferenceResponse | BaseException]:
        raise AssertionError("not a sequence scheduler")

    async def sequence_ended(self, key: str, reason: EndReason, state: Any) -> None:
        raise AssertionError("not a sequence scheduler")


class Untouchable(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        raise AssertionError("the scheduler called the model itself")


async def test_the_scheduler_calls_the_model_only_through_its_executor() -> None:
    scheduler = DirectScheduler(Untouchable(settings("m")), settings("m"))
    assert isinstance(scheduler.executor, InProcessExecutor)  # the default
    recording = Recording()
    scheduler.executor = recording
    response = await scheduler.infer(InferenceRequest(id="one", inputs=[]))
    assert response.model_name == "recording"
    streamed = [r async for r in scheduler.stream(requests("two", "three"))]
    assert [r.id for r in streamed if isinstance(r, InferenceResponse)] == ["two", "three"]
    assert recording.calls == ["predict one", "stream two", "stream three"]
