"""The PyTorch runtime: serve a saved model (TorchScript, torch.export .pt2, or a state_dict and
its nn.Module class) from model-settings.json alone, with ``"implementation": "runtime.torch.TorchModel"``,
under direct, adaptive, sequence or continuous batching as the settings say.

This is the only package of the server that imports torch, and it does so only when a model that
uses it is loaded: ``import runtime`` and models that do not use it never import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.torch.torch_settings import TorchSettings

if TYPE_CHECKING:
    from runtime.torch.runner import TensorSpec, TorchRunner
    from runtime.torch.torch_model import TorchModel

__all__ = ["TensorSpec", "TorchModel", "TorchRunner", "TorchSettings"]

_LAZY = {
    "TorchModel": ".torch_model",
    "TorchRunner": ".runner",
    "TensorSpec": ".runner",
    "TorchSequenceModel": ".torch_model",  # the earlier name of TorchModel, for settings that name it
}


def __getattr__(name: str) -> Any:
    # torch is imported on first use of the runtime, not when its settings are read
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
