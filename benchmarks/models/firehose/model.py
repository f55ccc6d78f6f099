"""Streams ``n`` responses, each stamped with the monotonic time it was made (parameter ``t``).

By default it yields as fast as it can; the request parameter ``interval_us`` paces it instead.
"""

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np

from runtime import MLModel
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput


class Firehose(MLModel):
    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            n = int(np.asarray(payload.inputs[0].data).reshape(-1)[0])
            extra = payload.parameters.model_extra if payload.parameters else None
            interval = int((extra or {}).get("interval_us", 0)) / 1e6
            for i in range(n):
                if interval:
                    await asyncio.sleep(interval)
                yield InferenceResponse(
                    model_name=self.name,
                    parameters=Parameters(t=time.monotonic()),
                    outputs=[ResponseOutput(name="i", shape=[1], datatype="INT32", data=[i])],
                )
