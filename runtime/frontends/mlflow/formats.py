"""MLflow's scoring formats (``mlflow models serve``) to an inference request, and an inference
response to MLflow's ``{"predictions": ...}``.

Bodies, as mlflow's scoring server reads them:
- ``application/json``, an object with exactly one of ``dataframe_split`` (``columns``, ``data``,
  optional ``index``), ``dataframe_records`` (a list of objects), ``instances`` (a list of
  objects: columns; else rows of one tensor), ``inputs`` (an object: columns or named tensors;
  else one tensor), and optionally ``params`` (the model's signature params);
- ``text/csv`` with a header row (one column per field).
Columns become one input each, ``[N]``, with the request content type ``pd``; a tensor becomes one
input. Each input's datatype is the one the model declares for it (its signature), else the one
its JSON values need. A list of rows sent to a model with a column signature is refused with
mlflow's "Model is missing inputs" (400).

Answers: a DataFrame answer (``pd``) becomes a list of records (one object per row, as mlflow's
``orient="records"``); one output becomes its values, the ``[N, 1]`` that mlserver-mlflow gives a
1-D prediction read back as ``[N]`` unless the signature says the output is a 2-D tensor; several
outputs an object of their values by name. BYTES values are text.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np
import orjson

from runtime.codecs.pandas import column_values
from runtime.errors import InvalidInput, shown
from runtime.tensors import output_array
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
)

CSV = "text/csv"
JSON = "application/json"
FORMATS = ("dataframe_split", "dataframe_records", "instances", "inputs")
REQUIRED_FORMAT = f"The input must be a JSON dictionary with exactly one of the input fields {set(FORMATS)}"


class UnsupportedContentType(InvalidInput):
    """A body of a content type (or charset) the scoring route does not read: 415, as mlflow answers."""


def content_type_of(header: str) -> str:
    """The body's media type, refusing what mlflow's scoring server refuses (415)."""
    parts = [part.strip() for part in header.split(";")]
    mime, options = parts[0].lower(), dict(p.partition("=")[::2] for p in parts[1:] if p)
    if options.get("charset", "utf-8").lower() != "utf-8":
        raise UnsupportedContentType("The scoring server only supports UTF-8")
    unexpected = set(options) - {"charset"}
    if unexpected:
        raise UnsupportedContentType(
            f"Unrecognized content type parameters: {', '.join(sorted(unexpected))}."
        )
    if mime not in (CSV, JSON):
        raise UnsupportedContentType(
            f"This predictor only supports the following content types: Types: {[CSV, JSON]}. Got '{header}'."
        )
    return mime


Columns = dict[str, list[Any]]


def _split(value: Any) -> Columns:
    if not isinstance(value, dict):
        raise InvalidInput(
            f"Invalid input. Dataframe split format must be a dictionary. Got {type(value).__name__}."
        )
    keys = set(value)
    if "data" not in keys or keys - {"columns", "data", "index"}:
        raise InvalidInput(
            "Invalid input. Dataframe split format must have 'data' field and optionally 'columns' "
            f"and 'index' fields. Got {sorted(keys)}."
        )
    data, names = value["data"], value.get("columns")
    if not isinstance(data, list) or not all(isinstance(row, list) for row in data):
        raise InvalidInput("Invalid input. Dataframe split format's 'data' must be a list of rows (lists)")
    width = len(data[0]) if data else len(names or [])
    names = [str(n) for n in names] if names is not None else [str(i) for i in range(width)]
    if any(len(row) != len(names) for row in data):
        raise InvalidInput(
            f"Invalid input. Every row of 'data' must have {len(names)} values, one per column {names}"
        )
    return {name: [row[i] for row in data] for i, name in enumerate(names)}


def _records(rows: Any, key: str) -> Columns:
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise InvalidInput(
            f"Invalid input. Dataframe records format must be a list of records. Got {key} of another shape."
        )
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(str(k) for k in row))
    return {name: [row.get(name) for row in rows] for name in names}


def parse_json(body: bytes, columns_model: bool, column_names: list[str]) -> tuple[Columns | None, Any, Any]:
    """(columns, tensor, params) of a JSON body: columns by name, or one tensor's nested rows, or
    (for ``inputs`` as an object to a tensor model) named tensors as columns."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(
            f"Invalid input. Ensure that input is a valid JSON formatted string. Error: '{exc}'"
        ) from None
    if isinstance(document, list):
        raise InvalidInput(f"{REQUIRED_FORMAT}. Received a list.")
    if not isinstance(document, dict):
        raise InvalidInput(f"{REQUIRED_FORMAT}. Received unexpected input type '{type(document).__name__}'.")
    found = [key for key in document if key in FORMATS]
    if len(found) != 1:
        raise InvalidInput(f"{REQUIRED_FORMAT}. Received dictionary with input fields: {list(document)}.")
    key, params = found[0], document.get("params")
    if params is not None and not isinstance(params, dict):
        raise InvalidInput("Invalid input. 'params' must be an object of the model's parameters")
    value = document[key]
    if key == "dataframe_split":
        return _split(value), None, params
    if key == "dataframe_records":
        return _records(value, key), None, params
    if key == "instances":
        if isinstance(value, list) and value and isinstance(value[0], dict):
            return _records(value, key), None, params
    elif isinstance(value, dict):
        return {str(k): v if isinstance(v, list) else [v] for k, v in value.items()}, None, params
    if columns_model:
        raise InvalidInput(
            f"Model is missing inputs {column_names}: its signature has columns, and a list of rows "
            "names none; send objects (instances), an object of columns (inputs), dataframe_split or "
            "dataframe_records"
        )
    if not isinstance(value, list):
        raise InvalidInput(f"Invalid input. '{key}' must be a list of rows or an object of inputs")
    return None, value, params


def parse_csv(body: bytes) -> Columns:
    """The columns of a CSV body with a header row (values as text; typed by ``to_request``)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"Invalid input. Ensure that input is a valid UTF-8 encoded string. Error: '{exc}'"
        ) from None
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise InvalidInput(
            f"Failed to parse input as a CSV table with a header row. Error: '{exc}'"
        ) from None
    rows = [row for row in rows if row]
    if not rows:
        raise InvalidInput("Failed to parse input as a CSV table: it has no header row")
    header, data = rows[0], rows[1:]
    if any(len(row) != len(header) for row in data):
        raise InvalidInput(f"Failed to parse input as a CSV table: every row must have {len(header)} fields")
    return {name: [row[i] if row[i] != "" else None for row in data] for i, name in enumerate(header)}


def _from_text(value: Any, datatype: Datatype) -> Any:
    """A CSV field (text) as the declared datatype wants it."""
    if value is None or datatype is Datatype.BYTES or not isinstance(value, str):
        return value
    if datatype is Datatype.BOOL:
        return value.strip().lower() in ("true", "1")
    try:
        return float(value) if datatype.value.startswith(("FP", "BF")) else int(value)
    except ValueError:
        return value  # refused below, naming the input


def _guess(values: list[Any]) -> Any:
    """CSV text values as numbers when every one of them is one (pandas' read_csv does this)."""
    for kind in (int, float):
        try:
            return [None if v is None else kind(v) for v in values]
        except (TypeError, ValueError):
            continue
    return values


def _input(name: str, values: Any, spec: MetadataTensor | None, from_csv: bool) -> RequestInput:
    if from_csv:
        values = [_from_text(v, spec.datatype) for v in values] if spec is not None else _guess(values)
    datatype = spec.datatype if spec is not None else None
    if datatype is Datatype.BYTES or (datatype is None and _texts(values)):
        flat = np.asarray(values, dtype=object)
        items = np.empty(flat.size, dtype=object)
        items[:] = [v.encode("utf-8") if isinstance(v, str) else _bytes_of(name, v) for v in flat.reshape(-1)]
        return RequestInput(
            name=name, shape=list(flat.shape), datatype=Datatype.BYTES, data=items.reshape(flat.shape)
        )
    try:
        array = np.asarray(values) if datatype is None else np.asarray(values, dtype=_numpy_dtype(datatype))
    except (TypeError, ValueError) as exc:
        wanted = (
            f"{datatype.value} values"
            if datatype is not None
            else "values of one type, in rows of one length"
        )
        raise InvalidInput(f"Input {shown(name)} must hold {wanted}: {exc}") from None
    if array.dtype == object or array.dtype.kind in "SUMmV":
        raise InvalidInput(
            f"Input {shown(name)} must hold numbers, booleans or text of one kind, in rows of one length"
        )
    if datatype is None:
        datatype = (
            Datatype.BOOL
            if array.dtype.kind == "b"
            else Datatype.INT64
            if array.dtype.kind in "iu"
            else Datatype.FP64
        )
        array = array.astype({"BOOL": np.bool_, "INT64": np.int64, "FP64": np.float64}[datatype.value])
    return RequestInput(name=name, shape=list(array.shape), datatype=datatype, data=array)


def _texts(values: Any) -> bool:
    flat = values
    while isinstance(flat, list) and flat and isinstance(flat[0], list):
        flat = flat[0]
    return isinstance(flat, list) and any(isinstance(v, str) for v in flat)


def _bytes_of(name: str, value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, (dict, list)):
        return orjson.dumps(value)
    return str(value).encode("utf-8")


def _numpy_dtype(datatype: Datatype) -> Any:
    return {
        "BOOL": np.bool_,
        "INT8": np.int8,
        "INT16": np.int16,
        "INT32": np.int32,
        "INT64": np.int64,
        "UINT8": np.uint8,
        "UINT16": np.uint16,
        "UINT32": np.uint32,
        "UINT64": np.uint64,
        "FP16": np.float16,
        "FP32": np.float32,
        "FP64": np.float64,
    }.get(datatype.value, np.float32)


def to_request(
    columns: Columns | None,
    tensor: Any,
    params: Any,
    declared: list[MetadataTensor],
    columns_model: bool,
    from_csv: bool = False,
) -> InferenceRequest:
    """The inference request for parsed columns or one tensor. Columns are sent with the content
    type ``pd`` to a model with a column signature or none, ``dict`` (named tensors) otherwise."""
    specs = {spec.name: spec for spec in declared}
    parameters = Parameters(**(params or {}))
    if columns is not None:
        inputs = [_input(name, values, specs.get(name), from_csv) for name, values in columns.items()]
        parameters.content_type = "pd" if columns_model or not declared else "dict"
        return InferenceRequest(parameters=parameters, inputs=inputs)
    spec = declared[0] if len(declared) == 1 else None
    name = spec.name if spec is not None else "input-0"
    return InferenceRequest(parameters=parameters, inputs=[_input(name, tensor, spec, from_csv)])


def _plain(values: np.ndarray) -> Any:
    if values.dtype == object:
        return [_text(v) for v in values.reshape(-1)] if values.ndim == 1 else [_plain(row) for row in values]
    return values.tolist()


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def to_predictions(response: InferenceResponse, two_dimensional: bool) -> Any:
    """``predictions`` for a response (see the module docstring); ``two_dimensional``: the model's
    signature says its one output is a 2-D tensor, whose ``[N, 1]`` stays as it is."""
    content_type = response.parameters.content_type if response.parameters else None
    if content_type == "pd":
        names = [out.name for out in response.outputs]
        columns = [column_values(out) for out in response.outputs]
        rows = len(columns[0]) if columns else 0
        return [
            {name: _text(_item(col[i])) for name, col in zip(names, columns, strict=True)}
            for i in range(rows)
        ]
    values = {}
    for out in response.outputs:
        array = output_array(out).reshape(out.shape)
        if array.ndim == 2 and array.shape[1] == 1 and not two_dimensional:
            array = array[:, 0]
        values[out.name] = _plain(array)
    if len(values) == 1:
        return next(iter(values.values()))
    return values


def _item(value: Any) -> Any:
    return (
        value.item()
        if isinstance(value, np.generic)
        else value.tolist()
        if isinstance(value, np.ndarray)
        else value
    )
