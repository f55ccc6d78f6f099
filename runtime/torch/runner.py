"""Tensors in, tensors out: calling a loaded model, off the event loop.

:class:`TorchRunner` knows nothing of the protocol. It takes named tensors (or named numpy
arrays), calls the model under ``torch.inference_mode`` with its arguments in the forward's
order, and returns named outputs. Every tensor's first dimension is the batch dimension, so a
strategy that merges requests along it (adaptive batching), or one that feeds a recurrent
model's hidden state back in as an input (sequence batching), or one that steps many streams
at once (continuous batching), calls the same runner with bigger or different tensors.

Forward calls run in the runner's own thread pool (``workers`` threads), so the event loop,
health checks and other models stay responsive while a model computes. Conversions between
numpy and torch, and the host/device copies, run in that pool too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from runtime.errors import InvalidInput, ModelFailed
from runtime.tensors import datatype_of
from runtime.torch.convert import FLOATING, describe, to_array, to_tensor, torch_dtype


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor as the runner passes it: its protocol datatype (None: whatever the model gives)."""

    name: str
    datatype: str | None = None


class TorchRunner:
    """Calls one loaded model with named tensors and returns named tensors."""

    def __init__(
        self,
        name: str,
        module: Any,
        device: torch.device,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        dtype: torch.dtype | None = None,
        workers: int = 1,
        threads: int | None = None,
    ) -> None:
        """``inputs`` in the order the forward takes them; ``outputs`` as declared (may be empty).

        ``dtype``, when given, is what floating-point inputs are converted to before the call.
        ``threads``, when given, is torch's intra-op thread count in each worker thread: torch
        applies ``set_num_threads`` to the calling thread's OpenMP team, so a thread that did not
        call it may keep another count.
        """
        self.name = name
        self.module = module
        self.device = device
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.dtype = dtype
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix=f"torch-{name}",
            initializer=functools.partial(torch.set_num_threads, threads) if threads else None,
        )
        for spec in [*self.inputs, *self.outputs]:
            if spec.datatype is not None:
                torch_dtype(spec.datatype)  # ValueError now for a datatype torch cannot hold

    # ------------------------------------------------------------------ tensors in, tensors out

    def forward(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Call the model with tensors already on its device; the outputs stay where the model put them."""
        args = [tensors[spec.name] for spec in self.inputs]
        with torch.inference_mode():
            result = self.module(*args)
        return self._name_outputs(result)

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, str]]:
        """Host arrays in, host arrays (with their protocol datatypes) out; blocking."""
        tensors = {}
        for spec in self.inputs:
            array = arrays.get(spec.name)
            if array is None:
                raise InvalidInput(f"Model {self.name!r} needs input {spec.name!r}")
            datatype = spec.datatype or datatype_of(array.dtype)
            dtype = self.dtype if datatype in FLOATING else None
            tensors[spec.name] = to_tensor(array, datatype, self.device, dtype)
        outputs = self.forward(tensors)
        declared = {spec.name: spec.datatype for spec in self.outputs}
        result = {}
        for name, tensor in outputs.items():
            try:
                result[name] = to_array(tensor, declared.get(name))
            except (TypeError, ValueError) as exc:
                raise ModelFailed(f"Model {self.name!r} returned output {name!r} that {exc}") from None
        return result

    async def infer(self, arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, str]]:
        """``run`` in the runner's thread pool; cancelling drops the call if it has not started."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run, arrays)

    def close(self) -> None:
        """Wait for running calls, then free the thread pool; the runner serves no more."""
        self._executor.shutdown(wait=True)

    # ------------------------------------------------------------------ outputs

    def _name_outputs(self, result: Any) -> dict[str, torch.Tensor]:
        names = [spec.name for spec in self.outputs]
        if isinstance(result, Mapping):
            return self._from_mapping(result, names)
        tensors = _flatten(result)
        if tensors is None:
            raise ModelFailed(
                f"Model {self.name!r} returned {describe(result)}; "
                "a model must return a tensor, a tuple or list of tensors, or a dict of them"
            )
        if not names:
            return {f"output__{index}": tensor for index, tensor in enumerate(tensors)}
        if len(tensors) != len(names):
            raise ModelFailed(
                f"Model {self.name!r} returned {len(tensors)} tensor(s) but its settings declare "
                f"{len(names)} output(s): {names}"
            )
        return dict(zip(names, tensors, strict=True))

    def _from_mapping(self, result: Mapping[Any, Any], names: list[str]) -> dict[str, torch.Tensor]:
        wanted = names or [str(key) for key in result]
        missing = [name for name in wanted if name not in result]
        if missing:
            raise ModelFailed(
                f"Model {self.name!r} returned outputs {sorted(map(str, result))} "
                f"which lack the declared output(s) {missing}"
            )
        outputs = {}
        for name in wanted:
            value = result[name]
            if not isinstance(value, torch.Tensor):
                raise ModelFailed(f"Model {self.name!r} returned {describe(value)} as output {name!r}")
            outputs[name] = value
        return outputs


def _flatten(result: Any) -> list[torch.Tensor] | None:
    """The tensors of a tensor or of nested tuples/lists of them (an LSTM's ``(y, (h, c))``), in order."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        out: list[torch.Tensor] = []
        for item in result:
            tensors = _flatten(item)
            if tensors is None:
                return None
            out.extend(tensors)
        return out
    return None
