"""TorchServe's "sequence continuous batching" example: a running sum per sequence, some answers streamed.

Each request of a sequence carries one integer ``x`` (input ``x``, INT64); the sequence's state is
its running sum, kept by the server between requests. As in TorchServe's
``examples/stateful/sequence_continuous_batching``:

- ``x`` even: the sum grows by ``x`` and the answer is one response, the new sum;
- ``x`` odd: the sum grows by ``x`` and the answer streams: the new sum, then ``stream_chunks`` - 1
  more responses, one per step, each the sum *as it is then* — so an "update" (an even ``x`` sent
  meanwhile) shows in the running stream's next responses;
- ``x`` = -1 is a **cancel**: it answers -1, and every stream of its sequence that began before it
  ends at its next step (its last response carries ``finish_reason: cancelled``);
- ``x`` = 0 ends the sequence: it answers the final sum, with ``sequence_end: true``.

The cancel and the update reach the model while the stream they act on is still running because
the model is served with continuous batching *and* sequence batching: a new request of a sequence
joins the running batch at the next step, beside the earlier request of the same sequence that is
still streaming (over REST, the stream on ``/infer_stream`` and the cancel on ``/infer``; over gRPC,
both on one ``ModelStreamInfer`` call or on two). Each step stands for a model's forward pass and
takes ``step_ms`` (a sleep, off the event loop).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime import ContinuousModel, StepResult, Stream
from runtime.codecs import NumpyCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceResponse, Parameters

CANCEL = -1
END = 0


@dataclass
class Total:
    """A sequence's state: its running sum, and how many cancels it has received."""

    value: int = 0
    cancels: int = 0


@dataclass
class Request:
    """One request's own state: its integer, and how many cancels its sequence had when it began."""

    x: int
    cancels_before: int = 0
    sent: int = 0


class StreamingCounter(ContinuousModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self.chunks = int(extra.get("stream_chunks", 20))
        self.step_s = float(extra.get("step_ms", 100)) / 1000
        return True

    async def start_stream(self, stream: Stream) -> None:
        if stream.sequence is None:
            raise InvalidInput(
                f"Model {self.name!r} serves only sequences: send sequence_start=true to start one, "
                "or the sequence_id of an open one"
            )
        data = np.asarray(next((i.data for i in stream.request.inputs if i.name == "x"), [])).reshape(-1)
        if data.size != 1:
            raise InvalidInput("send one integer x per request")
        stream.state = Request(int(data[0]))

    async def step(self, streams: list[Stream]) -> list[StepResult]:
        await asyncio.sleep(self.step_s)  # the cost of a forward pass
        return [self._advance(stream) for stream in streams]  # a sequence's streams come in arrival order

    def _advance(self, stream: Stream) -> StepResult:
        sequence, request = stream.sequence, stream.state
        assert sequence is not None
        if sequence.state is None:  # a START: the sum begins at 0
            sequence.state = Total()
        total: Total = sequence.state
        if stream.steps == 0:  # the request's first step: it acts on the sequence
            request.cancels_before = total.cancels
            if request.x == CANCEL:
                total.cancels += 1
                return StepResult(self._answer(CANCEL, "cancel"), finished=True)
            total.value += request.x
            if request.x == END:
                sequence.end_sequence()
                return StepResult(self._answer(total.value, "end"), finished=True)
            if request.x % 2 == 0:
                return StepResult(self._answer(total.value, "length"), finished=True)
        elif total.cancels > request.cancels_before:  # a cancel came after this stream began
            return StepResult(self._answer(total.value, "cancelled"), finished=True)
        request.sent += 1
        last = request.sent >= self.chunks
        return StepResult(self._answer(total.value, "length" if last else None), finished=last)

    def _answer(self, value: int, finish: str | None) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            parameters=Parameters(finish_reason=finish) if finish else None,
            outputs=[NumpyCodec.encode_output("total", np.array([value], dtype=np.int64))],
        )

    async def sequence_ended(self, sequence_id: str, reason: str, state: Any) -> None:
        """Nothing to free: the state is the server's (called once per sequence, whatever ended it)."""
