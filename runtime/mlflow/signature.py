"""An MLflow model's signature, read from its ``MLmodel`` file without importing mlflow, as the
model's metadata (MLServer's mlserver-mlflow ``to_metadata_tensors``, with the choices below).

- A column signature (``{"type": "double", "name": "a"}``...) is one input per column, named as
  the column (``input-{i}`` when unnamed), content type ``pd`` for the request: booleans BOOL,
  integers INT32, longs INT64, floats FP32, doubles FP64, strings BYTES (``str``), binary BYTES
  (``base64``), datetimes BYTES (``datetime``), arrays, objects, maps and ``any`` BYTES holding
  JSON (``pd_json``). Its metadata shape is ``[-1, 1]`` (MLServer's); a request may send ``[N]``
  or ``[N, 1]``.
- A tensor signature is one input per tensor spec with its dtype and shape, content type ``np``
  (one unnamed tensor) or ``dict`` (named tensors, one array each).
- Outputs are named as the signature names them. An unnamed output is ``output-1`` when it is the
  only one (MLServer's metadata says ``output-0``, but its answers, which clients read, say
  ``output-1``: the metadata here names what the answers carry), else ``output-{i}``.
- ``params`` are kept by name with their type and default: they are read from the request's
  parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runtime.types import Datatype, MetadataTensor, Parameters

MLMODEL = "MLmodel"

# an MLflow column type: (datatype, content type of the column)
_COLUMN_TYPES: dict[str, tuple[Datatype, str]] = {
    "boolean": (Datatype.BOOL, "np"),
    "integer": (Datatype.INT32, "np"),
    "long": (Datatype.INT64, "np"),
    "float": (Datatype.FP32, "np"),
    "double": (Datatype.FP64, "np"),
    "string": (Datatype.BYTES, "str"),
    "binary": (Datatype.BYTES, "base64"),
    "datetime": (Datatype.BYTES, "datetime"),
}
_JSON_COLUMN = (Datatype.BYTES, "pd_json")

_DTYPES: dict[str, Datatype] = {
    "bool": Datatype.BOOL,
    "int8": Datatype.INT8,
    "int16": Datatype.INT16,
    "int32": Datatype.INT32,
    "int64": Datatype.INT64,
    "uint8": Datatype.UINT8,
    "uint16": Datatype.UINT16,
    "uint32": Datatype.UINT32,
    "uint64": Datatype.UINT64,
    "float16": Datatype.FP16,
    "float32": Datatype.FP32,
    "float64": Datatype.FP64,
    "str": Datatype.BYTES,
    "object": Datatype.BYTES,
    "bytes": Datatype.BYTES,
}


class SignatureError(ValueError):
    """The MLmodel file cannot be read, or its signature is not one this runtime understands."""


@dataclass(frozen=True)
class Spec:
    """One column or tensor of a signature."""

    name: str
    datatype: Datatype
    shape: list[int]
    content_type: str
    mlflow_type: str
    """The column's MLflow type (``double``, ``string``...), or the tensor's dtype."""
    required: bool = True
    named: bool = True
    """Whether the signature names it (an unnamed tensor takes whatever name a request gives it)."""

    def metadata(self) -> MetadataTensor:
        return MetadataTensor(
            name=self.name,
            datatype=self.datatype,
            shape=list(self.shape),
            parameters=Parameters(content_type=self.content_type),
        )


@dataclass(frozen=True)
class Param:
    """One of the signature's ``params``: read from a request's parameters of the same name."""

    name: str
    mlflow_type: str
    default: Any = None


@dataclass(frozen=True)
class Signature:
    """What the MLmodel file says the model takes and answers (empty when it has no signature)."""

    inputs: list[Spec] = field(default_factory=list)
    outputs: list[Spec] = field(default_factory=list)
    params: list[Param] = field(default_factory=list)
    columns: bool = False
    """A column signature: the request is a DataFrame, one input per column."""

    @property
    def content_type(self) -> str | None:
        """The model's default content type: ``pd`` for columns, ``np`` for one unnamed tensor,
        ``dict`` for named tensors; None without a signature."""
        if not self.inputs:
            return None
        if self.columns:
            return "pd"
        return "dict" if all(s.named for s in self.inputs) else "np"


def _specs(text: Any, prefix: str, outputs: bool) -> tuple[list[Spec], bool]:
    if not text:
        return [], False
    try:
        items = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise SignatureError(f"the signature's {prefix}s are not JSON: {exc}") from None
    if not isinstance(items, list):
        raise SignatureError(f"the signature's {prefix}s are not a list")
    specs: list[Spec] = []
    columns = False
    for index, item in enumerate(items):
        if not isinstance(item, dict) or "type" not in item:
            raise SignatureError(f"the signature's {prefix} {index} has no type: {item!r}")
        name = item.get("name")
        if outputs and not name:
            default = f"{prefix}-1" if len(items) == 1 else f"{prefix}-{index}"
        else:
            default = f"{prefix}-{index}"
        if item["type"] == "tensor":
            tensor = item.get("tensor-spec") or {}
            dtype = str(tensor.get("dtype", "object"))
            datatype = _DTYPES.get(dtype)
            if datatype is None:
                raise SignatureError(f"the signature's {prefix} {name or index} has dtype {dtype!r}")
            shape = [int(d) for d in tensor.get("shape") or [-1]]
            content_type = "str" if datatype is Datatype.BYTES else "np"
            specs.append(Spec(name or default, datatype, shape, content_type, dtype, True, bool(name)))
            continue
        columns = True
        mlflow_type = str(item["type"])
        datatype, content_type = _COLUMN_TYPES.get(mlflow_type, _JSON_COLUMN)
        required = bool(item.get("required", True))
        specs.append(
            Spec(name or default, datatype, [-1, 1], content_type, mlflow_type, required, bool(name))
        )
    return specs, columns


def read_signature(folder: Path) -> Signature:
    """The signature of the MLflow model in ``folder`` (an empty one when it has none)."""
    path = folder / MLMODEL
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SignatureError(f"no {MLMODEL} file in {folder}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SignatureError(f"{path} cannot be read: {exc}") from None
    if not isinstance(document, dict):
        raise SignatureError(f"{path} is not an MLflow model description")
    signature = document.get("signature")
    if not isinstance(signature, dict):
        return Signature()
    inputs, columns = _specs(signature.get("inputs"), "input", outputs=False)
    outputs, _ = _specs(signature.get("outputs"), "output", outputs=True)
    params: list[Param] = []
    raw_params = signature.get("params")
    if raw_params:
        try:
            items = json.loads(raw_params) if isinstance(raw_params, str) else raw_params
        except json.JSONDecodeError as exc:
            raise SignatureError(f"the signature's params are not JSON: {exc}") from None
        params = [Param(str(p["name"]), str(p.get("type", "")), p.get("default")) for p in items]
    return Signature(inputs, outputs, params, columns)


def model_folder(uri: str | None, folder: str | None) -> Path:
    """The folder holding ``MLmodel``: ``parameters.uri`` (relative to the model's folder) when
    given, else the model's folder; a ``uri`` naming the MLmodel file itself means its folder."""
    base = Path(folder) if folder else Path.cwd()
    path = base / uri if uri else base
    if path.name == MLMODEL and path.is_file():
        path = path.parent
    return path
