"""A row-wise test model for adaptive batching: echoes its input ``x`` as ``y`` and says, for each
row, how many rows its batch had (``n``). It records every batch it sees, and its
``parameters.extra`` can make it misbehave:

- ``fail_on``: raise RuntimeError when a batch contains this value (a model bug);
- ``refuse_over``: raise InvalidInput when a batch contains a value above it (a bad request);
- ``drop_row``: return one row fewer than it was given.

Tests may ``hold()`` it: each ``predict`` then signals ``entered`` and waits for ``release()``.
"""

from __future__ import annotations

import asyncio

import numpy as np

from runtime import MLModel
from runtime.errors import InvalidInput
from runtime.types import Datatype, InferenceRequest, InferenceResponse, Parameters, ResponseOutput


class RowModel(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self.fail_on = extra.get("fail_on")
        self.refuse_over = extra.get("refuse_over")
        self.drop_row = bool(extra.get("drop_row", False))
        self.batches: list[InferenceRequest] = []
        self.entered = asyncio.Event()
        self._gate: asyncio.Event | None = None
        return True

    def hold(self) -> None:
        self._gate = asyncio.Event()

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self._gate = None

    @property
    def batch_rows(self) -> list[int]:
        return [batch.inputs[0].shape[0] if batch.inputs[0].shape else 1 for batch in self.batches]

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        self.batches.append(payload)
        self.entered.set()
        if self._gate is not None:
            await self._gate.wait()
        x = payload.inputs[0].data
        if self.fail_on is not None and x.dtype != object and np.any(x == self.fail_on):
            raise RuntimeError(f"cannot handle {self.fail_on}")
        if self.refuse_over is not None and x.dtype != object and np.any(x > self.refuse_over):
            raise InvalidInput(f"values must be at most {self.refuse_over}")
        rows = x.shape[0] if x.ndim else 1
        if self.drop_row:
            x = x[:-1]
        n = np.full(x.shape[0] if x.ndim else 1, rows, dtype=np.int64)
        datatype = payload.inputs[0].datatype
        return InferenceResponse(
            model_name=self.name,
            parameters=Parameters(model_says="hello"),
            outputs=[
                ResponseOutput(name="y", shape=list(x.shape), datatype=datatype, data=x),
                ResponseOutput(name="n", shape=[len(n)], datatype=Datatype.INT64, data=n),
            ],
        )
