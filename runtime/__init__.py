"""mlserver-like: an Open Inference Protocol model server.

Write a model by subclassing :class:`MLModel`; describe it in a ``model-settings.json``; serve a
folder of them with ``mlserver-like start FOLDER``.

The names below are imported on first use (a module ``__getattr__``), so that ``import runtime``
costs nothing until one is used and the command line imports what it needs in its own order.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from runtime.version import __version__

if TYPE_CHECKING:
    from runtime import codecs, errors, types
    from runtime.codecs import decode_args
    from runtime.continuous import ContinuousModel, StepResult, Stream
    from runtime.model import MLModel
    from runtime.model_settings import ModelParameters, ModelSettings
    from runtime.sequences import SequenceModel, SequenceStep
    from runtime.settings import Settings

__all__ = [
    "ContinuousModel",
    "MLModel",
    "ModelParameters",
    "ModelSettings",
    "SequenceModel",
    "SequenceStep",
    "Settings",
    "StepResult",
    "Stream",
    "__version__",
    "codecs",
    "decode_args",
    "errors",
    "types",
]

_EXPORTS = {
    "ContinuousModel": ".continuous",
    "StepResult": ".continuous",
    "Stream": ".continuous",
    "MLModel": ".model",
    "ModelParameters": ".model_settings",
    "ModelSettings": ".model_settings",
    "Settings": ".settings",
    "SequenceModel": ".sequences",
    "SequenceStep": ".sequences",
    "decode_args": ".codecs",
}


def __getattr__(name: str) -> Any:
    """A public name (imported from its module), or a submodule (imported), on first access."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif name.startswith("_") or not name.isidentifier() or not _is_submodule(name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        value = importlib.import_module(f"{__name__}.{name}")
    globals()[name] = value
    return value


def _is_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{__name__}.{name}") is not None
    except ImportError:
        return False


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
