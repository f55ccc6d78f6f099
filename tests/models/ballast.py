"""A model that holds ``mib`` MiB of resident memory while loaded, for the many-models tests.

``parameters.extra``: ``mib`` (default 40) of numpy ones, written at load (in a thread) so that every
page is resident; ``k``, added to the input, so that each model's answer is its own (x + k); ``gate``:
when true, ``predict`` waits until the test opens ``gate`` (a request held in flight);
``fail_on``: an input value that makes ``predict`` raise (a failing warm-up). Every request it
serves is recorded in ``seen`` (warm-up ones too), and the instances alive in this process in
``LOADED``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from runtime import MLModel
from runtime.codecs import NumpyCodec
from runtime.types import InferenceRequest, InferenceResponse

MIB = 1024 * 1024

LOADED: dict[str, Ballast] = {}
"""The loaded instances by model name (in-process tests read them)."""


class Ballast(MLModel):
    weights: np.ndarray[Any, np.dtype[np.float64]] | None = None

    def _extra(self) -> dict[str, Any]:
        parameters = self.settings.parameters
        return dict(parameters.extra) if parameters is not None else {}

    async def load(self) -> bool:
        extra = self._extra()
        self.k = float(extra.get("k", 0))
        self.fail_on = extra.get("fail_on")
        self.gate: asyncio.Event | None = asyncio.Event() if extra.get("gate") else None
        self.entered = asyncio.Event()
        self.calls = 0
        self.seen: list[float] = []
        # as a model should load its weights: off the event loop, which serves other models meanwhile
        self.weights = await asyncio.to_thread(np.ones, int(float(extra.get("mib", 40)) * MIB) // 8)
        LOADED[self.name] = self
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        self.calls += 1
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float64)
        self.seen.append(float(x.reshape(-1)[0]))
        self.entered.set()
        if self.fail_on is not None and float(x.reshape(-1)[0]) == float(self.fail_on):
            raise ValueError(f"cannot serve {self.fail_on}")
        if self.gate is not None:
            await self.gate.wait()
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("y", x + self.k)])

    async def unload(self) -> bool:
        self.weights = None
        if LOADED.get(self.name) is self:
            del LOADED[self.name]
        return True
