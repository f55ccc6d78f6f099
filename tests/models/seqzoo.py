"""Sequence models the tests serve: a running sum that records what it saw and can be held."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from runtime import SequenceModel, SequenceStep
from runtime.codecs import NumpyCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse


def _flag(request: InferenceRequest, name: str) -> Any:
    extra = request.parameters.model_extra if request.parameters is not None else None
    return (extra or {}).get(name)


class Recorder(SequenceModel):
    """Running sum per sequence; the state is (total, history of inputs).

    Request parameters steer it: ``hold: true`` makes the batch wait for ``gate`` (tests open it),
    ``hold_s: <seconds>`` makes the batch sleep (for real-server tests), ``fail: "step"`` fails
    that step with InvalidInput, ``fail: "batch"`` makes the whole batch raise. An input of 0 ends
    the sequence (TorchServe's convention). Every batch and every ending is recorded.
    """

    async def load(self) -> bool:
        self.batches: list[list[tuple[str, bool, bool]]] = []
        self.endings: list[tuple[str, str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.holding = asyncio.Event()
        self._ended = asyncio.Event()
        return True

    async def predict_sequences(self, steps: list[SequenceStep]) -> list[InferenceResponse | BaseException]:
        self.batches.append([(s.sequence_id, s.start, s.end) for s in steps])
        if any(_flag(s.request, "hold") for s in steps):
            self.holding.set()
            await self.gate.wait()
        hold_s = max(float(_flag(s.request, "hold_s") or 0) for s in steps)
        if hold_s:
            await asyncio.sleep(hold_s)
        if any(_flag(s.request, "fail") == "batch" for s in steps):
            raise ValueError("the batch broke")
        results: list[InferenceResponse | BaseException] = []
        for step in steps:
            if _flag(step.request, "fail") == "step":
                results.append(InvalidInput(f"step of {step.sequence_id} refused"))
                continue
            x = int(step.request.inputs[0].data.reshape(-1)[0])
            total, history = step.state or (0, ())
            step.state = (total + x, (*history, x))
            if x == 0:
                step.end_sequence()
            results.append(
                InferenceResponse(
                    model_name=self.name,
                    outputs=[
                        NumpyCodec.encode_output("total", np.array([total + x], dtype=np.int64)),
                        NumpyCodec.encode_output("history", np.array(step.state[1], dtype=np.int64)),
                    ],
                )
            )
        return results

    async def sequence_ended(self, sequence_id: str, reason: str, state: Any) -> None:
        self.endings.append((sequence_id, reason, state))
        self._ended.set()

    async def ending(self, sequence_id: str, timeout: float = 10.0) -> tuple[str, Any]:
        """Wait until the model is told that ``sequence_id`` ended; return (reason, last state)."""

        async def wait() -> tuple[str, Any]:
            while True:
                for key, reason, state in self.endings:
                    if key == sequence_id:
                        return reason, state
                self._ended.clear()
                await self._ended.wait()

        return await asyncio.wait_for(wait(), timeout)

    def reasons(self, sequence_id: str) -> list[str]:
        return [reason for key, reason, _ in self.endings if key == sequence_id]


class StatelessToo(Recorder):
    """Also answers requests outside any sequence (it implements predict)."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("total", x)])
