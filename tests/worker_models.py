"""Models for the worker-process tests: each answers with the pid of the process that ran it.

Request parameters they read: ``burn_ms`` (pure-Python CPU work), ``sleep`` (seconds awaited),
``die`` (the process kills itself with that signal, e.g. 9), ``raise`` (raise ValueError).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime import MLModel
from runtime.errors import InvalidInput
from runtime.sequences.sequence_model import EndReason, SequenceModel, SequenceStep
from runtime.types import Datatype, InferenceRequest, InferenceResponse, ResponseOutput


def param(request: InferenceRequest, key: str, default: Any = None) -> Any:
    extra = request.parameters.model_extra if request.parameters else None
    return (extra or {}).get(key, default)


def burn(ms: float) -> int:
    """Spin in pure Python for ``ms`` milliseconds (holding the GIL); returns the loops made."""
    end = time.perf_counter() + ms / 1000
    loops = 0
    while time.perf_counter() < end:
        loops += 1
    return loops


def act(request: InferenceRequest) -> None:
    """Do what the request's parameters ask before answering."""
    if param(request, "die"):
        os.kill(os.getpid(), int(param(request, "die")))
    if param(request, "raise"):
        raise ValueError(str(param(request, "raise")))
    if param(request, "invalid"):
        raise InvalidInput(str(param(request, "invalid")))
    if param(request, "burn_ms"):
        burn(float(param(request, "burn_ms")))


def pid_output() -> ResponseOutput:
    return ResponseOutput(name="pid", shape=[1], datatype=Datatype.INT64, data=np.array([os.getpid()]))


class Echo(MLModel):
    """Answers with its inputs unchanged (as outputs of the same names) and its pid."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        act(payload)
        if param(payload, "sleep"):
            await asyncio.sleep(float(param(payload, "sleep")))
        outputs = [
            ResponseOutput(name=i.name, shape=i.shape, datatype=i.datatype, data=i.data)
            for i in payload.inputs
        ]
        return InferenceResponse(model_name=self.name, outputs=[*outputs, pid_output()])


class Burner(MLModel):
    """A plain ``def predict`` (run on a thread) that burns CPU as asked; answers with its pid."""

    def predict(self, payload: InferenceRequest) -> InferenceResponse:  # type: ignore[override]
        act(payload)
        if param(payload, "sleep"):
            time.sleep(float(param(payload, "sleep")))
        return InferenceResponse(model_name=self.name, outputs=[pid_output()])


class Counter(MLModel):
    """Streams ``count`` chunks (request parameter, default 3) for each request, each with its index
    and pid; ``pause`` seconds between chunks; ``die`` after the first chunk."""

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            for i in range(int(param(payload, "count", 3))):
                if i == 1:
                    act(payload)
                if param(payload, "pause"):
                    await asyncio.sleep(float(param(payload, "pause")))
                yield InferenceResponse(
                    model_name=self.name,
                    outputs=[
                        ResponseOutput(name="i", shape=[1], datatype=Datatype.INT64, data=np.array([i])),
                        pid_output(),
                    ],
                )


class RunningSum(SequenceModel):
    """TorchServe's stateful example: each step adds its input to the sequence's sum; answers the
    sum and its pid. Endings are written to the file named by ``parameters.extra.endings``."""

    async def predict_sequences(
        self, steps: list[SequenceStep]
    ) -> Sequence[InferenceResponse | BaseException]:
        out: list[InferenceResponse | BaseException] = []
        for step in steps:
            try:
                act(step.request)
            except ValueError as exc:
                out.append(exc)
                continue
            x = int(np.asarray(step.request.inputs[0].data).reshape(-1)[0])
            step.state = (step.state or 0) + x
            out.append(
                InferenceResponse(
                    model_name=self.name,
                    outputs=[
                        ResponseOutput(
                            name="sum", shape=[1], datatype=Datatype.INT64, data=np.array([step.state])
                        ),
                        pid_output(),
                    ],
                )
            )
        return out

    async def sequence_ended(self, sequence_id: str, reason: EndReason, state: Any) -> None:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        if extra.get("endings"):
            with Path(extra["endings"]).open("a") as f:  # noqa: ASYNC230 - a test model, one line
                f.write(f"{sequence_id} {reason} {state}\n")


class BrokenLoad(MLModel):
    """Fails to load."""

    async def load(self) -> bool:
        raise RuntimeError("no weights here")


class SlowUnload(MLModel):
    """Writes a line to ``parameters.extra.unloaded`` when it unloads (to see a drain happen)."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if param(payload, "sleep"):
            await asyncio.sleep(float(param(payload, "sleep")))
        return InferenceResponse(model_name=self.name, outputs=[pid_output()])

    async def unload(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        if extra.get("unloaded"):
            with Path(extra["unloaded"]).open("a") as f:  # noqa: ASYNC230 - a test model, one line
                f.write(f"{os.getpid()}\n")
        return True


class BlockingLoad(MLModel):
    """Its load blocks (the worker's whole event loop with it): always, or, with
    ``parameters.extra.marker`` (a file path), from the second load on (a restart)."""

    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        marker = extra.get("marker")
        if marker and not Path(marker).exists():  # noqa: ASYNC240 - a test model, once
            Path(marker).write_text(str(os.getpid()))  # noqa: ASYNC240
            return True
        time.sleep(3600)  # noqa: ASYNC251 - blocking the worker's event loop is the point
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(model_name=self.name, outputs=[pid_output()])
