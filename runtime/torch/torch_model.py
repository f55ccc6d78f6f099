"""``TorchModel``: serve a saved PyTorch model from model-settings.json alone, under any strategy.

This module maps the protocol onto the runner: request inputs become named arrays by the
names and datatypes the model's settings declare, the runner's named outputs become response
outputs. Loading reads the settings (:mod:`.settings`), loads the artefact off the event loop
(:mod:`.loading`) and checks the declared inputs against what the model takes.

The same class serves every strategy its settings ask for, with the same runner: direct and
adaptive batching through ``predict``; sequence batching through ``predict_sequences``
(:mod:`.sequence`); continuous batching through ``start_stream`` / ``step`` / ``end_stream`` /
``combine`` (:mod:`.steps`). What carries over between calls is read by :mod:`.recurrent`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import torch

from runtime.continuous import ContinuousModel, StepResult, Stream, StreamEnd
from runtime.errors import InvalidInput, ModelNotReady
from runtime.sequences.sequence_model import SequenceModel, SequenceStep
from runtime.tensors import input_array
from runtime.torch.convert import FLOATING, torch_dtype
from runtime.torch.loading import Loaded, ProgramInput, load
from runtime.torch.recurrent import Outputs, Recurrence, read_recurrence
from runtime.torch.runner import TensorSpec, TorchRunner
from runtime.torch.sequence_batch import predict_sequences
from runtime.torch.steps import Steps
from runtime.torch.torch_settings import TorchConfig, read_config
from runtime.types import Datatype, InferenceRequest, InferenceResponse, MetadataTensor, ResponseOutput


class TorchModel(ContinuousModel, SequenceModel):
    """A TorchScript file, a torch.export program or a state_dict, served as declared in its settings.

    The inputs declared in model-settings.json are the forward's arguments: matched by name when
    they are the forward's own argument names, else taken in the declared order. Outputs are named
    after the declared outputs (a dict's keys, or a tuple's order), else ``output__0``, ... .
    With ``sequence_batching`` or ``continuous_batching`` in the settings, ``parameters.extra``
    says which inputs carry state or feedback from one call to the next (see docs/torch.md).
    """

    _runner: TorchRunner | None = None
    _recurrence: Recurrence | None = None
    _steps: Steps | None = None
    _declared: dict[str, MetadataTensor]
    _program: dict[str, ProgramInput]

    @property
    def runner(self) -> TorchRunner:
        """Calls the model with named tensors (for strategies that batch or keep state)."""
        if self._runner is None:
            raise ModelNotReady(f"Model {self.name!r} is not loaded")
        return self._runner

    @property
    def module(self) -> object:
        """The loaded module (a ScriptModule, an exported program's module, or the nn.Module)."""
        return self.runner.module

    async def load(self) -> bool:
        config = read_config(self.settings)
        recurrence = read_recurrence(self.settings, config.options)
        declared = _declared_inputs(self.settings.inputs)
        for tensor in self.settings.outputs:
            if tensor.datatype is Datatype.BYTES:
                raise ValueError(f"output {tensor.name!r} is BYTES, which torch tensors cannot hold")
        loaded = await asyncio.to_thread(load, config, self.settings)
        order = _call_order(declared, loaded)
        self._program = _program_inputs(order, loaded, config)
        options = config.options
        self._runner = TorchRunner(
            self.name,
            loaded.module,
            loaded.device,
            inputs=[TensorSpec(t.name, str(t.datatype)) for t in order],
            outputs=[TensorSpec(t.name, str(t.datatype)) for t in self.settings.outputs],
            dtype=getattr(torch, options.dtype) if options.dtype else None,
            workers=options.workers,
            threads=options.num_threads,
        )
        self._declared = {tensor.name: tensor for tensor in declared}
        self._recurrence = recurrence
        if recurrence is not None and self.settings.continuous_batching:
            self._steps = Steps(self, recurrence)
        if not self.settings.platform:
            self.settings.platform = loaded.platform
        return True

    async def unload(self) -> bool:
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.to_thread(runner.close)
            if runner.device.type == "cuda":
                torch.cuda.empty_cache()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        recurrence = self._recurrence
        if recurrence is None:
            arrays = self.request_arrays(payload)
        else:  # outside any sequence: the state starts from zeros, as a sequence's first request
            arrays = recurrence.with_state(self.request_arrays(payload, frozenset(recurrence.state)), None)
        return self.response(await self.runner.infer(arrays))

    def response(self, outputs: Outputs) -> InferenceResponse:
        """A response holding the runner's outputs."""
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[
                ResponseOutput(name=name, shape=list(array.shape), datatype=Datatype(datatype), data=array)
                for name, (array, datatype) in outputs.items()
            ],
        )

    # ------------------------------------------------------------------ sequence batching

    async def predict_sequences(
        self, steps: list[SequenceStep]
    ) -> Sequence[InferenceResponse | BaseException]:
        if self._recurrence is None:
            raise ModelNotReady(f"Model {self.name!r} is not loaded for sequence batching")
        return await predict_sequences(self, self._recurrence, steps)

    # ------------------------------------------------------------------ continuous batching

    @property
    def stepping(self) -> Steps:
        if self._steps is None:
            raise ModelNotReady(f"Model {self.name!r} is not loaded for continuous batching")
        return self._steps

    async def start_stream(self, stream: Stream) -> None:
        self.stepping.start(stream)

    async def step(self, streams: list[Stream]) -> Sequence[StepResult]:  # type: ignore[override]
        return await self.stepping.step(streams)

    async def end_stream(self, stream: Stream, reason: StreamEnd) -> None:
        if self._steps is not None:
            self._steps.end(stream)

    def combine(self, stream: Stream, chunks: list[InferenceResponse]) -> InferenceResponse:
        return self.stepping.combine(chunks)

    # ------------------------------------------------------------------ requests

    def shape_problem(self, name: str, shape: tuple[int, ...]) -> str | None:
        """Why the exported program would refuse this shape for input ``name`` (None: it takes it)."""
        program = self._program.get(name)
        if program is None:
            return None
        why = program.mismatch(shape)
        return None if why is None else f"the exported program takes {program}: {why}"

    def request_arrays(
        self, payload: InferenceRequest, may_omit: frozenset[str] = frozenset()
    ) -> dict[str, np.ndarray]:
        """The request's inputs as arrays by name, checked against the declared inputs; only the
        inputs in ``may_omit`` may be missing."""
        arrays: dict[str, np.ndarray] = {}
        for inp in payload.inputs:
            spec = self._declared.get(inp.name)
            if spec is None:
                raise InvalidInput(
                    f"Model {self.name!r} has no input {inp.name!r}; its inputs are {sorted(self._declared)}"
                )
            if inp.datatype != spec.datatype:
                raise InvalidInput(f"Input {inp.name!r} must be {spec.datatype!s}, got {inp.datatype!s}")
            data = inp.data if isinstance(inp.data, np.ndarray) else input_array(inp)
            program = self._program.get(inp.name)
            if program is not None:
                why = program.mismatch(data.shape)
                if why is not None:
                    raise InvalidInput(
                        f"Input {inp.name!r} has shape {list(data.shape)} but the exported program "
                        f"takes {program}: {why}"
                    )
            arrays[inp.name] = data
        missing = [name for name in self._declared if name not in arrays and name not in may_omit]
        if missing:
            raise InvalidInput(f"Model {self.name!r} expects input(s) {missing} which the request lacks")
        return arrays


def _declared_inputs(inputs: list[MetadataTensor]) -> list[MetadataTensor]:
    if not inputs:
        raise ValueError(
            "the PyTorch runtime needs the model's inputs in model-settings.json "
            "(name, datatype and shape of each forward argument)"
        )
    for tensor in inputs:
        if tensor.datatype is Datatype.BYTES:
            raise ValueError(f"input {tensor.name!r} is BYTES, which torch tensors cannot hold")
    return list(inputs)


def _call_order(declared: list[MetadataTensor], loaded: Loaded) -> list[MetadataTensor]:
    """The declared inputs in the order the forward takes them."""
    names = [tensor.name for tensor in declared]
    arguments = loaded.arguments
    if arguments is None:
        return declared
    if set(names) <= set(arguments):
        used = [argument for argument in arguments if argument in names]
        skipped = [argument for argument in arguments[: arguments.index(used[-1])] if argument not in names]
        if skipped:
            raise ValueError(
                f"the model's forward takes {arguments}; model-settings.json declares {names} "
                f"but not {skipped}, which come before them"
            )
        by_name = {tensor.name: tensor for tensor in declared}
        ordered = [by_name[name] for name in used]
    elif len(names) > len(arguments):
        raise ValueError(
            f"model-settings.json declares {len(names)} inputs {names} "
            f"but the model's forward takes {len(arguments)}: {arguments}"
        )
    else:
        ordered = declared
    if loaded.program_inputs and len(ordered) != len(arguments):
        raise ValueError(
            f"the exported program takes {len(arguments)} inputs {arguments}; "
            f"model-settings.json declares {len(names)}: {names}"
        )
    return ordered


def _program_inputs(
    order: list[MetadataTensor], loaded: Loaded, config: TorchConfig
) -> dict[str, ProgramInput]:
    """What an exported program takes, by declared input name; the declarations must agree with it."""
    if not loaded.program_inputs or loaded.arguments is None:
        return {}
    found: dict[str, ProgramInput] = {}
    for tensor, argument in zip(order, loaded.arguments, strict=True):
        program = loaded.program_inputs.get(argument)
        if program is None:
            continue
        converted = config.options.dtype is not None and str(tensor.datatype) in FLOATING
        if not converted and torch_dtype(str(tensor.datatype)) != program.dtype:
            raise ValueError(
                f"input {tensor.name!r} is declared {tensor.datatype!s} "
                f"but the exported program takes {program.dtype}"
            )
        if tensor.shape:
            fixed = [size if size >= 0 else None for size in tensor.shape]
            fits = len(fixed) == len(program.dims) and all(
                size is None or dim.accepts(size) for size, dim in zip(fixed, program.dims, strict=True)
            )
            if not fits:
                raise ValueError(
                    f"input {tensor.name!r} is declared with shape {tensor.shape} "
                    f"but the exported program takes {program}"
                )
        found[tensor.name] = program
    return found


TorchSequenceModel = TorchModel
"""The earlier name of ``TorchModel`` for sequence batching, kept so that settings naming it still load."""
