"""What the built-in runtimes of tabular models share (scikit-learn, XGBoost, LightGBM, ONNX).

Each runtime (:mod:`runtime.sklearn`, :mod:`runtime.xgboost`, :mod:`runtime.lightgbm`,
:mod:`runtime.onnx`) is a :class:`TabularModel` that says which files it looks for, how it loads
one and how it computes its outputs from a request's features. This module does the rest, the
same way for all of them:

- the framework is imported when a model loads (:func:`require`), never on the server's import
  path; a missing one fails the load with the pip command that brings it;
- the model's file is found as MLServer finds it (:func:`model_file`): ``parameters.uri``
  (relative to the model's folder) or the runtime's well-known names in the model's folder;
- the request's one input is its features, a numpy array (the DataPlane made it one); a request or
  model ``content_type`` (``pd``, ``str``...) decodes it through the codecs instead, as MLServer's
  runtimes do;
- bad input is a 400 that names the input: a feature count the model does not take, a framework
  refusing the data (:class:`~runtime.errors.InvalidInput`), where MLServer answers 500;
- the framework's call runs inline on the event loop while it is measured to be short (under
  ``parameters.extra.inline_ms``, 1 ms by default, of the calling thread's CPU time per call, from
  the rows of the call and the CPU time per row of the last calls), and on a thread otherwise, so
  that a large batch or a slow model never stalls the server while a one-row call pays no thread
  hop. CPU time, not wall time: on a busy machine a short call is not mistaken for a long one;
- outputs are numpy arrays tagged ``content_type: np``, as MLServer's NumpyCodec answers them
  (:func:`numpy_output`; a 1-D array, labels or a regressor's values, is ``[N, 1]``).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from time import thread_time
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from runtime.codecs import NumpyCodec, NumpyRequestCodec, find_request_codec
from runtime.errors import InvalidInput, ModelNotReady
from runtime.model import MLModel
from runtime.tensors import datatype_of, input_array
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestInput,
    ResponseOutput,
    built,
)

Outputs = list[tuple[str, Any]]
"""A model's answer: (output name, value) pairs; values are numpy arrays, or what a codec encodes."""

DEFAULT_INLINE_MS = 1.0


class MissingExtra(ImportError):
    """A runtime's framework is not installed; the message names the pip command that brings it."""


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` (a framework), or say which extra of this package brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"this model needs {module!r}, which is not installed ({exc}); "
            f"install it with: pip install 'mlserver-like[{extra}]'"
        ) from exc


def model_file(model: MLModel, filenames: Sequence[str]) -> Path:
    """The model's artefact, found as MLServer finds it.

    ``parameters.uri`` wins, relative to the model's folder (a ``file://`` prefix is allowed); a
    folder there, or no uri at all (the model's own folder), is searched for ``filenames`` in
    order; a uri naming a folder that holds none of them is returned as is (the runtime may read a
    folder).
    """
    settings = model.settings
    folder = settings.folder
    uri = settings.parameters.uri if settings.parameters else None
    if uri:
        uri = uri.removeprefix("file://")
        path = Path(uri)
        if not path.is_absolute() and folder is not None:
            path = folder / path
    elif folder is not None:
        path = folder
    else:
        raise FileNotFoundError(
            f"model {model.name!r} has neither a folder nor parameters.uri naming its file"
        )
    if path.is_file():
        return path
    if path.is_dir():
        for name in filenames:
            if (path / name).is_file():
                return path / name
        if uri:
            return path
        raise FileNotFoundError(
            f"no model file in {path.name or str(path)!r}: looked for {', '.join(filenames)} "
            '(or name it with "parameters": {"uri": "./FILE"})'
        )
    raise FileNotFoundError(f"model {model.name!r}: parameters.uri {uri!r} names no file or folder")


_NP_PARAMETERS: dict[str, Any] = {name: field.default for name, field in Parameters.model_fields.items()}
_NP_PARAMETERS["content_type"] = "np"
_OUTPUT_FIELDS = frozenset({"name", "shape", "datatype", "parameters", "data"})
_RESPONSE_FIELDS = frozenset({"model_name", "model_version", "outputs"})


def numpy_output(name: str, array: np.ndarray) -> ResponseOutput:
    """MLServer's ``NumpyCodec.encode_output(name, array)`` for a numeric or boolean array, without
    validation: the fields are known to be of their types (the fast path of every tabular answer).

    As MLServer's codec, a 1-D array is answered as ``[N, 1]`` (its ``inject_batch_dimension``)."""
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    parameters = built(Parameters, dict(_NP_PARAMETERS), {"content_type"}, {})
    values = {
        "name": name,
        "shape": list(array.shape),
        "datatype": Datatype(datatype_of(array.dtype)),
        "parameters": parameters,
        "data": array,
    }
    return built(ResponseOutput, values, set(_OUTPUT_FIELDS))


class TabularModel(MLModel):
    """A model whose file a framework loads and whose outputs are computed from one features array.

    Subclasses set ``framework`` and ``extra`` (the module imported at load, the pip extra that
    brings it) and ``filenames`` (the well-known model files, in order), and implement
    :meth:`load_file` and :meth:`compute`.
    """

    default_outputs_all = False  # scikit-learn's and XGBoost's default is ``predict`` alone
    framework: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    filenames: ClassVar[tuple[str, ...]] = ()
    input_errors: tuple[type[BaseException], ...] = (ValueError, TypeError)
    """Exceptions of the framework's call that mean the input was wrong (answered 400)."""

    features: int | None = None
    """How many features (columns) the model takes, when the file says; checked before the call."""

    _loaded: bool = False
    _inline_s: float = DEFAULT_INLINE_MS / 1000.0
    _per_row: float = 0.0
    """Measured CPU seconds per row of the framework's call (the last calls, smoothed)."""

    async def load(self) -> bool:
        require(self.framework, self.extra)
        path = model_file(self, self.filenames)
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self._inline_s = float(extra.get("inline_ms", DEFAULT_INLINE_MS)) / 1000.0
        await asyncio.to_thread(self.load_file, path)
        self._loaded = True
        return True

    async def unload(self) -> bool:
        self._loaded = False
        return True

    # ------------------------------------------------------------------ what a runtime implements

    def load_file(self, path: Path) -> None:
        """Load the model from ``path`` (runs on a thread)."""
        raise NotImplementedError

    def output_names(self, payload: InferenceRequest) -> list[str]:
        """The outputs to compute for this request; raises InvalidInput for one the model has not."""
        raise NotImplementedError

    def compute(self, features: Any, names: list[str]) -> Outputs:
        """The outputs ``names`` for ``features`` (runs inline or on a thread; see the module docstring)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ serving

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if not self._loaded:
            raise ModelNotReady(f"Model {self.name!r} is not loaded")
        names = self.output_names(payload)
        features, source = self.request_features(payload)
        rows = _rows(features)
        if self._per_row * rows < self._inline_s:
            began = thread_time()
            outputs = self._call(features, names, source)
            self._measured(thread_time() - began, rows)
        else:
            outputs = await asyncio.to_thread(self._timed_call, features, names, source, rows)
        return self.response(outputs)

    def _timed_call(self, features: Any, names: list[str], source: str, rows: int) -> Outputs:
        began = thread_time()
        outputs = self._call(features, names, source)
        self._measured(thread_time() - began, rows)
        return outputs

    def _measured(self, seconds: float, rows: int) -> None:
        per_row = seconds / max(rows, 1)
        self._per_row = per_row if self._per_row == 0.0 else 0.7 * self._per_row + 0.3 * per_row

    def _call(self, features: Any, names: list[str], source: str) -> Outputs:
        try:
            return self.compute(features, names)
        except InvalidInput:
            raise
        except self.input_errors as exc:
            raise InvalidInput(f"Input {source!r} was refused by model {self.name!r}: {exc}") from exc

    def request_features(self, payload: InferenceRequest) -> tuple[Any, str]:
        """The request's features (a 2-D array, or what the request's content type decodes it to),
        and the name of the input they came from."""
        inputs = payload.inputs
        if len(inputs) != 1:
            raise InvalidInput(
                f"Model {self.name!r} takes one input (its features, [rows, columns]); the request has "
                f"{len(inputs)}: {[inp.name for inp in inputs]}"
            )
        inp = inputs[0]
        if self._decoded(payload, inp):
            if inp.parameters is not None and inp.parameters.content_type is not None:
                value = self.decode(inp)
            else:
                value = self.decode_request(payload, default_codec=NumpyRequestCodec)
            if isinstance(value, (InferenceRequest, RequestInput)):
                raise InvalidInput(
                    f"Input {inp.name!r}: no codec decodes its content type for model {self.name!r}"
                )
            return value, inp.name
        data = inp.data
        array = data if isinstance(data, np.ndarray) and data.shape == tuple(inp.shape) else input_array(inp)
        self.check_features(inp, array)
        return array, inp.name

    def _decoded(self, payload: InferenceRequest, inp: RequestInput) -> bool:
        """Whether a content type asks for the codecs rather than the input's plain array."""
        if payload.parameters is not None and payload.parameters.content_type not in (None, "np"):
            return True
        if inp.parameters is not None and inp.parameters.content_type not in (None, "np"):
            return True
        default = self.settings.parameters.content_type if self.settings.parameters else None
        return default not in (None, "np")

    def check_features(self, inp: RequestInput, array: np.ndarray) -> None:
        """Refuse (400) an array that is not [rows, features] of this model."""
        expected = self.features
        if array.ndim != 2:
            columns = f"{expected} features" if expected is not None else "features"
            raise InvalidInput(
                f"Input {inp.name!r} must be 2-D, [rows, {columns}]; got shape {list(array.shape)}"
            )
        if expected is not None and array.shape[1] != expected:
            raise InvalidInput(
                f"Input {inp.name!r} has {array.shape[1]} features (shape {list(array.shape)}) but "
                f"model {self.name!r} takes {expected}"
            )
        if array.dtype == object:
            raise InvalidInput(f"Input {inp.name!r} is BYTES, but model {self.name!r} takes numbers")

    def response(self, outputs: Outputs) -> InferenceResponse:
        """The response holding ``outputs``: numpy arrays as MLServer's NumpyCodec encodes them,
        anything else (a DataFrame) by the request codec that can encode it."""
        encoded: list[ResponseOutput] = []
        for name, value in outputs:
            if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                encoded.append(numpy_output(name, value))
                continue
            codec = find_request_codec(payload=value)
            if codec is not None and codec is not NumpyRequestCodec:
                encoded.extend(codec.encode_response(self.name, value, self.version).outputs)
            else:
                encoded.append(self.encode_output(name, np.asarray(value)))
        return built(
            InferenceResponse,
            {
                "model_name": self.name,
                "model_version": self.version,
                "id": None,
                "parameters": None,
                "outputs": encoded,
            },
            set(_RESPONSE_FIELDS),
        )

    @staticmethod
    def encode_output(name: str, array: np.ndarray) -> ResponseOutput:
        return NumpyCodec.encode_output(name, array)


def _rows(features: Any) -> int:
    """The rows of a call's features (an array, or a dict of arrays: the first one's)."""
    if isinstance(features, dict):
        features = next(iter(features.values()), None)
    shape = getattr(features, "shape", None)
    return int(shape[0]) if shape else 1


def thread_count(model: MLModel, default: int = 1) -> int:
    """``parameters.extra.threads``: the threads a framework may use for one call (default 1: the
    server's concurrency comes from serving many requests, and one pinned core shared by a
    framework's thread pool is slower than one thread)."""
    extra = model.settings.parameters.extra if model.settings.parameters else {}
    value = extra.get("threads", default)
    if not isinstance(value, int) or value < 0:
        raise ValueError(
            f"parameters.extra.threads must be a whole number >= 0 (0: all cores), got {value!r}"
        )
    return value if value > 0 else (os.cpu_count() or 1)
