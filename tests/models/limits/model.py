"""Models for the limit tests: one that hangs, one whose plain predict blocks, one that blocks the loop."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from runtime import MLModel
from runtime.codecs import NumpyCodec
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger("runtime.tests.limits")


def _seconds(payload: InferenceRequest) -> float:
    return float(NumpyCodec.decode_input(payload.inputs[0]).reshape(-1)[0])


def _answer(name: str, seconds: float) -> InferenceResponse:
    return InferenceResponse(
        model_name=name, outputs=[NumpyCodec.encode_output("slept", np.array([seconds]))]
    )


class Hang(MLModel):
    """Awaits for the seconds given in its input; logs when it starts and when it is cancelled."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        seconds = _seconds(payload)
        logger.warning("model %s holds a request for %s s", self.name, seconds)
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            logger.warning("model %s was cancelled", self.name)
            raise
        return _answer(self.name, seconds)


class Blocking(MLModel):
    """A plain (not async) predict that computes, without awaiting, for the seconds in its input."""

    def predict(self, payload: InferenceRequest) -> InferenceResponse:  # type: ignore[override]
        seconds = _seconds(payload)
        logger.warning("model %s computes for %s s", self.name, seconds)
        time.sleep(seconds)
        return _answer(self.name, seconds)


class Hog(MLModel):
    """An async predict that blocks the event loop (it never awaits) for the seconds in its input."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        seconds = _seconds(payload)
        time.sleep(seconds)  # noqa: ASYNC251 (blocking the loop is what this model is for)
        return _answer(self.name, seconds)
