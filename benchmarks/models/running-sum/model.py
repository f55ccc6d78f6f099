"""A running sum per sequence (TorchServe's stateful example): each request adds its ``x`` to its
sequence's total and answers the total. The server keeps the total between requests."""

from collections.abc import Sequence

import numpy as np

from runtime import SequenceModel, SequenceStep
from runtime.types import InferenceResponse, ResponseOutput


class RunningSum(SequenceModel):
    async def predict_sequences(self, steps: list[SequenceStep]) -> Sequence[InferenceResponse]:
        responses = []
        for step in steps:
            step.state = (step.state or 0) + int(step.request.inputs[0].data.reshape(-1)[0])
            total = np.array([step.state], dtype=np.int64)
            responses.append(
                InferenceResponse(
                    model_name=self.name,
                    outputs=[ResponseOutput(name="total", shape=[1], datatype="INT64", data=total)],
                )
            )
        return responses
