"""Accumulate: a stream-to-one model. It sums the input ``x`` of the requests of its stream until
one has the parameter ``last`` set (or the stream ends), answers once with the sum, and stops."""

from collections.abc import AsyncIterator

import numpy as np

from runtime import MLModel
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


class Accumulate(MLModel):
    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        total, count = 0.0, 0
        async for payload in payloads:
            total += float(np.sum(payload.inputs[0].data))
            count += 1
            params = (payload.parameters.model_extra or {}) if payload.parameters is not None else {}
            if params.get("last"):
                break
        if count:
            yield InferenceResponse(
                model_name=self.name,
                outputs=[ResponseOutput(name="total", shape=[1], datatype="FP64", data=np.array([total]))],
            )
