"""A torch MLP (in → hidden → in, ReLU) served as a model, for the benchmarks.

Its weights come from ``torch.manual_seed(seed)``, so two models of the same sizes and seed are
the same function. ``predict`` runs the forward pass on a thread of the model's own (torch
releases the GIL while it computes), so the event loop keeps serving requests meanwhile; each
response says how long the forward pass took (``compute_ms``). ``parameters.extra``:
``in`` and ``hidden`` (sizes), ``seed`` (default 0), ``threads`` (torch intra-op threads, default
torch's own), ``gc_freeze`` (after loading, move every object the process holds out of reach of
Python's cyclic garbage collector, ``gc.freeze()``: with torch loaded, a full collection walks
some 250 000 objects and stalls the event loop for tens to hundreds of milliseconds).
"""

from __future__ import annotations

import asyncio
import gc
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from runtime import MLModel
from runtime.errors import InvalidInput
from runtime.types import Datatype, InferenceRequest, InferenceResponse, Parameters, ResponseOutput


def build(width: int, hidden: int, seed: int = 0) -> Any:
    """The MLP width -> hidden -> width (ReLU between), weights from ``torch.manual_seed(seed)``, traced."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, width)
    ).eval()
    # traced: one forward pass is one call into C++, which runs the whole graph without the
    # GIL, instead of a GIL hand-off per layer while the event loop is busy
    with torch.inference_mode():
        return torch.jit.freeze(torch.jit.trace(net, torch.zeros(1, width)))


class TorchMLP(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self.width = int(extra["in"])
        hidden = int(extra["hidden"])
        if "threads" in extra:
            torch.set_num_threads(int(extra["threads"]))
        self.net = build(self.width, hidden, int(extra.get("seed", 0)))
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.name}-torch")
        if extra.get("gc_freeze"):
            gc.collect()
            gc.freeze()
        return True

    async def unload(self) -> bool:
        self.executor.shutdown(wait=True)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = payload.inputs[0].data
        if x.ndim != 2 or x.shape[1] != self.width or x.dtype != np.float32:
            raise InvalidInput(f"x must be FP32 of shape [-1, {self.width}], got {x.dtype} {list(x.shape)}")
        y, seconds = await asyncio.get_running_loop().run_in_executor(self.executor, self._forward, x)
        return InferenceResponse(
            model_name=self.name,
            parameters=Parameters(compute_ms=round(seconds * 1000, 3)),
            outputs=[ResponseOutput(name="y", shape=list(y.shape), datatype=Datatype.FP32, data=y)],
        )

    def _forward(self, x: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], float]:
        start = time.perf_counter()
        with torch.inference_mode():
            y = self.net(torch.from_numpy(np.require(x, requirements=["C", "W"]))).numpy()
        return y, time.perf_counter() - start
