"""TorchServe's stateful example, served with sequence batching: a running sum per sequence.

Each request carries one integer; the answer is the sum of every integer the sequence has sent so
far. Sending 0 ends the sequence (its answer is the final sum and carries ``sequence_end: true``),
as in TorchServe's ``examples/stateful``. The state is the running sum; the server keeps it in its
LRU state store between requests, so the model holds nothing itself.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from runtime import SequenceModel, SequenceStep
from runtime.codecs import NumpyCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceResponse

logger = logging.getLogger(__name__)


class Counter(SequenceModel):
    async def predict_sequences(self, steps: list[SequenceStep]) -> list[InferenceResponse | BaseException]:
        responses: list[InferenceResponse | BaseException] = []
        for step in steps:
            data = step.request.inputs[0].data.reshape(-1)
            if data.size != 1:
                responses.append(InvalidInput(f"send one integer per request, got {data.size}"))
                continue
            value = int(data[0])
            step.state = (step.state or 0) + value
            if value == 0:
                step.end_sequence()
            responses.append(
                InferenceResponse(
                    model_name=self.name,
                    outputs=[NumpyCodec.encode_output("total", np.array([step.state], dtype=np.int64))],
                )
            )
        return responses

    async def sequence_ended(self, sequence_id: str, reason: str, state: Any) -> None:
        logger.debug("sequence %s ended (%s) with total %s", sequence_id, reason, state)
