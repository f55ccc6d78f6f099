"""mlserver-like: an Open Inference Protocol model server.

Write a model by subclassing :class:`MLModel`; describe it in a ``model-settings.json``; serve a
folder of them with ``mlserver-like start FOLDER``.
"""

from . import codecs, errors, types
from .codecs import decode_args
from .continuous import ContinuousModel, StepResult, Stream
from .model import MLModel
from .sequences import SequenceModel, SequenceStep
from .settings import ModelParameters, ModelSettings, Settings
from .version import __version__

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
