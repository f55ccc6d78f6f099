"""A request checked against an MLflow model's signature before the model sees it, so that bad
input is a 400 that names the input (MLServer answers a bare 500), then decoded as
mlserver-mlflow decodes it; and the model's answer encoded as mlserver-mlflow encodes it.

Checks (a signature without inputs checks nothing; mlflow's own schema enforcement runs after):
- a column the signature lacks, a required column missing, an unnamed tensor given twice;
- a datatype that cannot hold the column's type (text for a number, a number for text);
  numbers are converted when numpy can do it without loss (INT32 to an INT64 column, FP32 to
  FP64), refused otherwise (FP64 to a ``long`` column);
- shapes: a column is ``[N]`` or ``[N, 1]``; a tensor has the spec's rank and its fixed sizes
  (a wrong number of features), and every column the same number of rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.codecs import NumpyCodec, NumpyRequestCodec, PandasCodec, decode_inference_request
from runtime.codecs.pandas import is_dataframe
from runtime.errors import InvalidInput, shown
from runtime.mlflow.signature import Signature, Spec
from runtime.tensors import datatype_of, dtype_of
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    ResponseOutput,
    UInt64,
)

_TEXT = "text (BYTES)"


def _described(spec: Spec) -> str:
    return f"{spec.datatype.value} ({spec.mlflow_type})"


def _converted(inp: RequestInput, spec: Spec) -> RequestInput:
    """``inp`` with the spec's datatype, converted when that loses nothing; InvalidInput otherwise."""
    if inp.datatype == spec.datatype:
        return inp
    wanted_bytes = spec.datatype is Datatype.BYTES
    given_bytes = inp.datatype is Datatype.BYTES
    if wanted_bytes or given_bytes:
        wanted = _TEXT if wanted_bytes else f"numbers: {_described(spec)}"
        given = _TEXT if given_bytes else inp.datatype.value
        raise InvalidInput(f"Input {shown(inp.name)} must hold {wanted}, got {given}")
    array = np.asarray(inp.data)
    target = dtype_of(spec.datatype)
    if not np.can_cast(array.dtype, target, "safe"):
        raise InvalidInput(
            f"Input {shown(inp.name)} must be {_described(spec)}; {inp.datatype.value} cannot be converted "
            "to it without loss"
        )
    return RequestInput(
        name=inp.name,
        shape=inp.shape,
        datatype=spec.datatype,
        parameters=inp.parameters,
        data=array.astype(target),
    )


def _check_column(inp: RequestInput, spec: Spec) -> RequestInput:
    if spec.content_type in ("np", "str", "base64", "datetime") and not (
        len(inp.shape) == 1 or (len(inp.shape) == 2 and inp.shape[1] == 1)
    ):
        raise InvalidInput(
            f"Input {shown(inp.name)} is a column: its shape must be [N] or [N, 1], got {inp.shape}"
        )
    return _converted(inp, spec)


def _check_tensor(inp: RequestInput, spec: Spec) -> RequestInput:
    fits = len(inp.shape) == len(spec.shape) and all(
        s in (-1, d) for d, s in zip(inp.shape, spec.shape, strict=True)
    )
    if not fits:
        raise InvalidInput(f"Input {shown(inp.name)} must have shape {spec.shape} (-1: any), got {inp.shape}")
    return _converted(inp, spec)


def checked_inputs(request: InferenceRequest, signature: Signature, model: str) -> list[RequestInput]:
    """The request's inputs checked against ``signature`` (see the module docstring)."""
    if not signature.inputs:
        return list(request.inputs)
    if not signature.columns and len(signature.inputs) == 1 and not signature.inputs[0].named:
        if len(request.inputs) != 1:
            names = [inp.name for inp in request.inputs]
            raise InvalidInput(
                f"Model {shown(model)} takes one tensor; the request has {len(names)}: {names}"
            )
        return [_check_tensor(request.inputs[0], signature.inputs[0])]
    specs = {spec.name: spec for spec in signature.inputs}
    checked: list[RequestInput] = []
    rows: tuple[str, int] | None = None
    for inp in request.inputs:
        spec = specs.get(inp.name)
        if spec is None:
            raise InvalidInput(
                f"Model {shown(model)} has no input {shown(inp.name)}; its signature's inputs are {sorted(specs)}"
            )
        checked.append(_check_column(inp, spec) if signature.columns else _check_tensor(inp, spec))
        if signature.columns and inp.shape:
            if rows is not None and inp.shape[0] != rows[1]:
                raise InvalidInput(
                    f"Input {shown(inp.name)} has {inp.shape[0]} rows but input {shown(rows[0])} has "
                    f"{rows[1]}: every column must have the same number of rows"
                )
            rows = rows or (inp.name, inp.shape[0])
    given = {inp.name for inp in request.inputs}
    missing = [spec.name for spec in signature.inputs if spec.required and spec.name not in given]
    if missing:
        raise InvalidInput(f"Model {shown(model)} expects input(s) {missing} which the request lacks")
    return checked


def decoded(
    request: InferenceRequest, signature: Signature, model_content_type: str | None, model: str
) -> Any:
    """What the MLflow model is called with: a DataFrame (``pd``), an array (``np``), a dict of
    arrays (``dict``: named tensors), as the request's and the model's content types say (a
    model without a signature: one input is an array, several a dict of arrays)."""
    inputs = checked_inputs(request, signature, model)
    request = InferenceRequest(
        id=request.id, parameters=request.parameters, inputs=inputs, outputs=request.outputs
    )
    declared = {spec.name: spec.metadata() for spec in signature.inputs} if signature.columns else None
    content_type = request.parameters.content_type if request.parameters else None
    content_type = content_type or model_content_type
    if content_type == "dict" or (content_type is None and len(inputs) > 1):
        return {inp.name: NumpyCodec.decode_input(inp) for inp in inputs}
    return decode_inference_request(request, content_type, declared, NumpyRequestCodec)


def params_of(request: InferenceRequest, signature: Signature) -> dict[str, Any] | None:
    """The signature's ``params`` the request's parameters give (None when it names none)."""
    extra = request.parameters.model_extra if request.parameters is not None else None
    if not signature.params or not extra:
        return None
    found = {p.name: extra[p.name] for p in signature.params if p.name in extra}
    return {k: int(v) if isinstance(v, UInt64) else v for k, v in found.items()} or None


def _array_output(name: str, value: Any) -> ResponseOutput:
    """An array as MLServer's NumpyCodec answers it: a 1-D array gets a second dimension ``[N, 1]``."""
    array = np.asarray(value)
    if array.dtype.kind in "SU":
        array = array.astype(object)
    if array.dtype == object:
        flat = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in array.reshape(-1)]
        data = np.empty(len(flat), dtype=object)
        data[:] = flat
        array = data.reshape(array.shape)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    return ResponseOutput(
        name=name,
        shape=list(array.shape),
        datatype=datatype_of(array.dtype),
        parameters=Parameters(content_type="str" if array.dtype == object else "np"),
        data=array,
    )


def encoded(model: str, version: str | None, prediction: Any) -> InferenceResponse:
    """The model's answer as mlserver-mlflow answers it: a DataFrame as one output per column
    (``pd``), a dict as one output per key (``dict``), anything else as one array ``output-1``
    (``np``)."""
    if is_dataframe(prediction):
        return PandasCodec.encode_response(model, prediction, version)
    if isinstance(prediction, dict):
        outputs = [_array_output(str(name), value) for name, value in prediction.items()]
        content_type = "dict"
    else:
        if hasattr(prediction, "to_numpy"):  # a pandas Series
            prediction = prediction.to_numpy()
        outputs = [_array_output("output-1", prediction)]
        content_type = "np"
    return InferenceResponse(
        model_name=model,
        model_version=version,
        parameters=Parameters(content_type=content_type),
        outputs=outputs,
    )


def declared_tensors(specs: list[Spec]) -> list[MetadataTensor]:
    return [spec.metadata() for spec in specs]
