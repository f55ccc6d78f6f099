"""``OnnxModel``: an ONNX graph (``model.onnx``, or ``parameters.uri``) run by onnxruntime.

- The graph's inputs and outputs, their datatypes and shapes (a dynamic dimension is ``-1``)
  become the model's metadata, unless model-settings.json declares them; requests are then
  checked against them by the server (names, datatypes, shapes) before the graph runs.
- Several inputs and outputs: every graph input must be in the request, by name; the request's
  ``outputs`` choose among the graph's outputs (none asked for: all of them). Only tensor outputs
  are served (a ``ZipMap``'s sequence of maps is not a tensor: convert without it).
- onnxruntime's threads are settings: ``parameters.extra.intra_op_threads`` (threads inside one
  operator; default 1) and ``parameters.extra.inter_op_threads`` (operators run in parallel;
  default 1), and ``parameters.extra.providers`` (default ``["CPUExecutionProvider"]``).

onnxruntime is imported when a model loads (``pip install 'mlserver-like[onnx]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runtime.codecs import NumpyCodec
from runtime.errors import InvalidInput
from runtime.tabular import Outputs, TabularModel, require
from runtime.types import Datatype, InferenceRequest, MetadataTensor

ONNX_DATATYPES: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
"""The protocol datatype of each ONNX tensor type onnxruntime reports."""


def _positive_int(extra: dict[str, Any], key: str, default: int) -> int:
    value = extra.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(
            f"parameters.extra.{key} must be a whole number >= 0 (0: onnxruntime's default), got {value!r}"
        )
    return value


def metadata_tensor(node: Any) -> MetadataTensor | None:
    """A graph input or output as metadata (None: not a tensor, e.g. a sequence of maps)."""
    datatype = ONNX_DATATYPES.get(node.type)
    if datatype is None:
        return None
    shape = [dim if isinstance(dim, int) and dim >= 0 else -1 for dim in node.shape]
    return MetadataTensor(name=node.name, datatype=Datatype(datatype), shape=shape)


class OnnxModel(TabularModel):
    """An ONNX graph on onnxruntime; see the module docstring."""

    framework = "onnxruntime"
    extra = "onnx"
    filenames = ("model.onnx",)
    default_outputs_all = True

    _session: Any = None

    def load_file(self, path: Path) -> None:
        ort = require("onnxruntime", self.extra)
        self.input_errors = (ValueError, TypeError, RuntimeError, ort.capi.onnxruntime_pybind11_state.Fail)
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        options = ort.SessionOptions()
        options.intra_op_num_threads = _positive_int(extra, "intra_op_threads", 1)
        options.inter_op_num_threads = _positive_int(extra, "inter_op_threads", 1)
        providers = extra.get("providers", ["CPUExecutionProvider"])
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        graph_inputs = [metadata_tensor(node) for node in session.get_inputs()]
        for node, tensor in zip(session.get_inputs(), graph_inputs, strict=True):
            if tensor is None:
                raise ValueError(f"graph input {node.name!r} is a {node.type}, not a tensor")
        inputs = [t for t in graph_inputs if t is not None]
        outputs = [t for t in (metadata_tensor(node) for node in session.get_outputs()) if t is not None]
        if not outputs:
            raise ValueError("the graph has no tensor output")
        self._session = session
        self._inputs = {t.name: t for t in inputs}
        self._outputs = [t.name for t in outputs]
        self._bytes = {t.name for t in inputs if t.datatype is Datatype.BYTES}
        if not self.settings.inputs:
            self.inputs = inputs
        if not self.settings.outputs:
            self.outputs = outputs
        if not self.settings.platform:
            self.settings.platform = "onnxruntime_onnx"

    @property
    def session(self) -> Any:
        """The onnxruntime ``InferenceSession``."""
        return self._session

    def output_names(self, payload: InferenceRequest) -> list[str]:
        if not payload.outputs:
            return self._outputs
        names = []
        for out in payload.outputs:
            if out.name not in self._outputs:
                raise InvalidInput(
                    f"Model {self.name!r} has no output {out.name!r}; its outputs are {self._outputs}"
                )
            if out.name not in names:
                names.append(out.name)
        return names

    def request_features(self, payload: InferenceRequest) -> tuple[Any, str]:
        feeds: dict[str, np.ndarray] = {}
        for inp in payload.inputs:
            if inp.name not in self._inputs:
                raise InvalidInput(
                    f"Model {self.name!r} has no input {inp.name!r}; its inputs are {list(self._inputs)}"
                )
            data = inp.data
            if inp.parameters is None and isinstance(data, np.ndarray) and data.shape == tuple(inp.shape):
                array: Any = data
            else:
                array = self.decode(inp, default_codec=NumpyCodec)
            if isinstance(array, list):
                array = np.asarray(array, dtype=object)
            if not isinstance(array, np.ndarray):
                raise InvalidInput(f"Input {inp.name!r} does not decode to a tensor")
            if inp.name in self._bytes:
                array = _text(array)
            feeds[inp.name] = array
        missing = [name for name in self._inputs if name not in feeds]
        if missing:
            raise InvalidInput(f"Model {self.name!r} needs input(s) {missing}, which the request lacks")
        if len(feeds) == 1:
            return feeds, next(iter(feeds))
        return feeds, ", ".join(feeds)

    def compute(self, features: Any, names: list[str]) -> Outputs:
        results = self._session.run(names, features)
        return list(zip(names, (_numeric(value) for value in results), strict=True))


def _text(array: np.ndarray) -> np.ndarray:
    """A BYTES input as onnxruntime's strings (it takes ``str``, not ``bytes``)."""
    if array.dtype != object:
        return array.astype(str).astype(object)
    flat = [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in array.reshape(-1)]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


def _numeric(value: Any) -> Any:
    """An output as the server encodes it (strings as ``bytes``, for a BYTES output)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "OU":
        flat = [item.encode("utf-8") if isinstance(item, str) else item for item in value.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(value.shape)
    return value
