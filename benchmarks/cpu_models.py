"""Models of the worker benchmark: one that burns pure-Python CPU per request, one that echoes."""

from __future__ import annotations

import time

from runtime import MLModel
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


class Burn(MLModel):
    """Spins in pure Python (holding the GIL) for ``parameters.extra.burn_ms`` per request; a
    plain ``def predict``, so it runs off the event loop, on the model's thread."""

    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self.seconds = float(extra.get("burn_ms", 20)) / 1000
        return True

    def predict(self, payload: InferenceRequest) -> InferenceResponse:  # type: ignore[override]
        end = time.perf_counter() + self.seconds
        loops = 0
        while time.perf_counter() < end:
            loops += 1
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name="loops", shape=[1], datatype="INT64", data=[loops])],
        )


class Echo(MLModel):
    """Answers with its inputs, unchanged."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                ResponseOutput(name=i.name, shape=i.shape, datatype=i.datatype, data=i.data)
                for i in payload.inputs
            ],
        )
