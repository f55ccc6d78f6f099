"""Loading a model's artefact: a TorchScript file, a torch.export program or a state_dict.

Each loader returns a :class:`Loaded`: the callable module on its device and dtype, the names
of its forward's arguments when torch can tell them, and (for exported programs, whose input
shapes are part of the program) the shapes it accepts, so that a request of the wrong shape is
refused with a message that names the tensor before the program's own guards fail.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runtime.repository import RepositoryError, import_model_class
from runtime.settings import ModelSettings
from runtime.torch.torch_settings import TorchConfig

# torch's loaders keep process-wide state (torch.export.load sets a global deserializer and
# fails if another thread is inside it), so artefacts are loaded one at a time
_LOADING = threading.Lock()

PLATFORMS = {"torchscript": "pytorch_torchscript", "export": "pytorch_export", "state_dict": "pytorch"}


@dataclass(frozen=True)
class Dimension:
    """One dimension an exported program accepts: a fixed size, or a range."""

    size: int | None = None
    low: int = 0
    high: int | None = None

    def accepts(self, value: int) -> bool:
        if self.size is not None:
            return value == self.size
        return value >= self.low and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.size is not None:
            return str(self.size)
        return f"{self.low}..{self.high if self.high is not None else ''}"


@dataclass(frozen=True)
class ProgramInput:
    """What an exported program takes as one input: its dtype and dimensions."""

    dtype: torch.dtype
    dims: tuple[Dimension, ...]

    def mismatch(self, shape: Sequence[int]) -> str | None:
        """Why ``shape`` does not fit, or None when it does."""
        if len(shape) != len(self.dims):
            return f"it takes {len(self.dims)} dimensions, not {len(shape)}"
        for index, (dim, value) in enumerate(zip(self.dims, shape, strict=True)):
            if not dim.accepts(value):
                if dim.size is not None:
                    return f"dimension {index} is fixed at {dim.size} in the program"
                return f"dimension {index} must be in {dim}"
        return None

    def __str__(self) -> str:
        return "[" + ", ".join(str(dim) for dim in self.dims) + "]"


@dataclass(frozen=True)
class Loaded:
    """A loaded model, ready to be called with tensors on ``device``."""

    module: Callable[..., Any]
    device: torch.device
    platform: str
    arguments: list[str] | None = None
    """The forward's argument names (without self), when torch can tell them."""
    program_inputs: dict[str, ProgramInput] = field(default_factory=dict)
    """For exported programs: what each argument accepts."""


def resolve_device(name: str) -> torch.device:
    """``auto`` → the first CUDA device if torch sees one, else the CPU; CUDA must be present if asked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} was asked for but torch sees no CUDA device")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device {name!r} was asked for but torch sees {count} CUDA device(s)")
    return device


def load(config: TorchConfig, settings: ModelSettings) -> Loaded:
    """Load the artefact that ``config`` names, on its device and in its dtype (blocking)."""
    path = config.path
    if not path.is_file():
        where = f" (parameters.uri, relative to {settings.folder})" if settings.folder else ""
        raise FileNotFoundError(f"model file {str(path)!r} does not exist{where}")
    options = config.options
    device = resolve_device(options.device)
    dtype = getattr(torch, options.dtype) if options.dtype else None
    if options.num_threads is not None:
        torch.set_num_threads(options.num_threads)
    loaders = {"torchscript": _torchscript, "export": _exported, "state_dict": _state_dict}
    with _LOADING:
        return loaders[config.format](path, device, dtype, config, settings)


def _torchscript(
    path: Path, device: torch.device, dtype: torch.dtype | None, config: TorchConfig, settings: ModelSettings
) -> Loaded:
    try:
        module = torch.jit.load(str(path), map_location=device)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{str(path)!r} is not a TorchScript file ({first}). A torch.export program needs "
            "parameters.format 'export' (or a .pt2 name); a state_dict needs parameters.extra.module_class"
        ) from exc
    module.eval()
    if dtype is not None:
        module.to(dtype)
    arguments = [arg.name for arg in module.forward.schema.arguments[1:]]
    return Loaded(module, device, PLATFORMS["torchscript"], arguments)


def _exported(
    path: Path, device: torch.device, dtype: torch.dtype | None, config: TorchConfig, settings: ModelSettings
) -> Loaded:
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ValueError(
            f"{str(path)!r} is not a torch.export program saved with torch.export.save "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    inputs = _program_inputs(program)
    module = program.module()
    if dtype is not None:
        module.to(dtype)
    return Loaded(module, device, PLATFORMS["export"], list(inputs), inputs)


def _program_inputs(program: torch.export.ExportedProgram) -> dict[str, ProgramInput]:
    names = set(program.graph_signature.user_inputs)
    found: dict[str, ProgramInput] = {}
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in names:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        dims = tuple(_dimension(size, program.range_constraints) for size in value.shape)
        found[node.name] = ProgramInput(value.dtype, dims)
    return found


def _dimension(size: Any, ranges: Mapping[Any, Any]) -> Dimension:
    if isinstance(size, int):
        return Dimension(size=size)
    bounds = ranges.get(size.node.expr)
    if bounds is None:
        return Dimension()
    return Dimension(low=_bound(bounds.lower) or 0, high=_bound(bounds.upper))


def _bound(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None  # infinite


def _state_dict(
    path: Path, device: torch.device, dtype: torch.dtype | None, config: TorchConfig, settings: ModelSettings
) -> Loaded:
    options = config.options
    assert options.module_class is not None
    try:
        cls = import_model_class(settings.model_copy(update={"implementation": options.module_class}))
    except (ImportError, RepositoryError) as exc:
        raise ValueError(f"cannot import module_class {options.module_class!r}: {exc}") from exc
    if not issubclass(cls, torch.nn.Module):
        raise TypeError(f"module_class {options.module_class!r} is not a torch.nn.Module")
    module = cls(**options.module_kwargs)
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(
            f"{str(path)!r} does not hold a state_dict (a mapping of names to tensors); "
            "save one with torch.save(module.state_dict(), path)"
        )
    module.load_state_dict(state, strict=options.strict)
    module.eval()
    module.to(device=device, dtype=dtype)
    return Loaded(module, device, PLATFORMS["state_dict"], _argument_names(module.forward))


def _argument_names(function: Callable[..., Any]) -> list[str] | None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values()):
        return None
    return [p.name for p in signature.parameters.values() if p.kind in kinds]
