"""Settings of the PyTorch runtime, read from model-settings.json and checked when the model loads.

The artefact is ``parameters.uri`` (relative to the model's folder) in the format named by
``parameters.format``; everything else the runtime needs is in ``parameters.extra`` and is
described by :class:`TorchSettings`. Unknown keys in ``parameters.extra`` are refused, so that a
misspelt setting fails the load instead of being ignored. This module does not import torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from runtime.field_docs import documented
from runtime.settings import ModelSettings

Format = Literal["torchscript", "export", "state_dict"]
"""``torchscript``: a ``torch.jit.save`` file; ``export``: a ``torch.export.save`` program (.pt2);
``state_dict``: a ``torch.save(module.state_dict())`` file plus the module's class."""

FloatDtype = Literal["float32", "float16", "bfloat16", "float64"]

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@documented
class StopRule(BaseModel):
    """When a stream served with continuous batching ends before ``max_steps``."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    output: str
    """The declared output to watch, e.g. the generated token."""

    values: list[int | float] = Field(min_length=1)
    """The stream ends after a step in which every element of ``output`` is one of these."""


@documented
class TorchSettings(BaseModel):
    """The PyTorch runtime's settings: ``parameters.extra`` in model-settings.json."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    device: str = "auto"
    """Where the model runs: ``auto`` (the first CUDA device when torch sees one, else the CPU),
    ``cpu``, ``cuda`` or ``cuda:N``. Asking for CUDA where there is none fails the load."""

    dtype: FloatDtype | None = None
    """Floating-point dtype to run in. The weights are converted to it at load, floating-point
    inputs before each call (so a model in ``bfloat16`` can serve ``FP32`` inputs); outputs are
    returned in their declared datatype. None (the default) keeps the model's own dtype."""

    num_threads: int | None = Field(default=None, ge=1)
    """torch's intra-op CPU threads (``torch.set_num_threads``), set when the model loads and in
    each of its worker threads. torch's default for threads that never set it is process-wide, so
    with several models the last one loaded sets that default; None leaves torch's default (one
    per physical core). On a CPU shared with other work, a small value (even 1) avoids OpenMP
    threads spinning against each other."""

    workers: int = Field(default=1, ge=1, le=64)
    """Threads of this model's own executor: how many forward calls may run at once. Forward
    calls never run on the event loop, so health checks and other models answer meanwhile."""

    module_class: str | None = None
    """For a state_dict: the ``torch.nn.Module`` class to load it into, as ``module.Class``. A
    module naming a .py file in the model's folder is loaded from there, else it is imported."""

    module_kwargs: dict[str, Any] = {}
    """For a state_dict: keyword arguments of ``module_class``'s constructor."""

    strict: bool = True
    """For a state_dict: require its keys to match the module's exactly (``load_state_dict(strict=)``)."""

    sequence_state: dict[str, str] = {}
    """A recurrent model's state: each state input of the forward mapped to the output that
    carries its next value, e.g. ``{"h0": "h", "c0": "c"}``. Each state input is a declared input
    marked ``"parameters": {"optional": true}`` with fixed dimensions after the first (the batch).
    It is zeros at first, then the mapped output of the previous call: the previous request of
    the sequence with ``"sequence_batching": true``, the previous step of the stream with
    ``"continuous_batching": true`` (and, with both, the sequence's last step)."""

    feedback: dict[str, str] = {}
    """With ``"continuous_batching": true``: inputs fed from the previous step's outputs, each
    input mapped to the output whose value it takes at the next step, e.g. ``{"tokens":
    "next_token"}`` for autoregressive generation. Inputs not named here (nor in
    ``sequence_state``) keep the request's value at every step."""

    max_steps: int | None = Field(default=None, ge=1)
    """With ``"continuous_batching": true`` (and then required): the most steps one stream takes,
    one forward call and one streamed chunk each. A request may ask for fewer with the parameter
    ``max_tokens``."""

    stop: StopRule | None = None
    """With ``"continuous_batching": true``: end a stream after the step whose output ``output``
    holds only values from ``values`` (e.g. an end-of-sequence token); that step's chunk is sent."""

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}")
        return value


class TorchConfig(BaseModel):
    """Everything the runtime reads from a model's settings, checked: where, what format, how."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    path: Path
    format: Format
    options: TorchSettings


def read_config(settings: ModelSettings) -> TorchConfig:
    """The runtime's configuration from a model's settings; ValueError saying what is wrong."""
    parameters = settings.parameters
    if parameters is None or not parameters.uri:
        raise ValueError(
            "the PyTorch runtime needs parameters.uri: the model file, relative to the model's folder"
        )
    try:
        options = TorchSettings.model_validate(parameters.extra)
    except ValidationError as exc:
        raise ValueError("invalid PyTorch settings in parameters.extra: " + _summary(exc)) from None
    path = Path(parameters.uri)
    if not path.is_absolute() and settings.folder is not None:
        path = settings.folder / path
    return TorchConfig(path=path, format=_format(parameters.format, path, options), options=options)


def _format(declared: str | None, path: Path, options: TorchSettings) -> Format:
    formats = get_args(Format)
    if declared is None:
        if options.module_class:
            return "state_dict"
        return "export" if path.suffix == ".pt2" else "torchscript"
    if declared not in formats:
        raise ValueError(f"parameters.format must be one of {list(formats)}, got {declared!r}")
    if declared != "state_dict" and options.module_class:
        raise ValueError(
            f"parameters.extra.module_class is for a state_dict; parameters.format is {declared!r}"
        )
    if declared == "state_dict" and not options.module_class:
        raise ValueError(
            "parameters.format 'state_dict' needs parameters.extra.module_class: "
            "the nn.Module class to load the weights into"
        )
    return declared  # type: ignore[return-value]


def _summary(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        where = ".".join(str(part) for part in error["loc"]) or "extra"
        problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)
