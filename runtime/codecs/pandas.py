"""pandas DataFrames ("pd"), MLServer's PandasCodec: a request's inputs are the columns of a
DataFrame, and a DataFrame is answered as one output per column (and the same both ways for
clients that encode requests and decode responses).

Each column is decoded by its own content type (its ``parameters.content_type``, else the one its
declared tensor gives, else numpy): ``str`` columns hold text, ``base64`` bytes, ``datetime``
datetimes, ``pd_json`` one JSON value per row. A column may be ``[N]`` or ``[N, 1]``; a wider one
(``[N, k]``) holds one array per row. Every column must have the same number of rows.

Encoding, as MLServer does: each column becomes an output of shape ``[N, 1]``; numbers and booleans
keep their dtype's datatype, text is BYTES with content type ``str``, datetimes BYTES with
``datetime``, anything else BYTES holding one JSON document per row (``pd_json``).

pandas is imported when a DataFrame is made or read, never when this module is imported (it is
brought by the ``[pandas]`` and ``[mlflow]`` extras).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from runtime.codecs.datetime import DatetimeCodec
from runtime.codecs.interfaces import RequestCodec
from runtime.codecs.string import Base64Codec, StringCodec, bytes_column, bytes_elements
from runtime.errors import InvalidInput
from runtime.tensors import datatype_of, input_array, output_array
from runtime.types import (
    InferenceRequest,
    InferenceResponse,
    MetadataTensor,
    Parameters,
    RequestInput,
    ResponseOutput,
)

if TYPE_CHECKING:
    import pandas

PANDAS_MISSING = "The pd content type needs pandas: pip install 'mlserver-like[pandas]'"

JSON_CONTENT_TYPE = "pd_json"
"""A BYTES column holding one JSON document per row (lists, objects, mixed values)."""

_TEXT_CODECS = {c.ContentType: c for c in (StringCodec, Base64Codec, DatetimeCodec)}

Tensor = RequestInput | ResponseOutput


def import_pandas() -> Any:
    """The pandas module, imported now; a RuntimeError naming the extra when it is missing."""
    try:
        import pandas
    except ImportError as exc:
        raise RuntimeError(PANDAS_MISSING) from exc
    return pandas


class _DataFrameHint:
    """``pandas.DataFrame`` as a type hint, without importing pandas: it equals the class once
    pandas has been imported (a caller holding the class has imported it)."""

    def __eq__(self, other: object) -> bool:
        pd = sys.modules.get("pandas")
        return pd is not None and other is getattr(pd, "DataFrame", None)

    def __hash__(self) -> int:
        return hash("pandas.DataFrame")

    def __repr__(self) -> str:
        return "pandas.DataFrame"


def is_dataframe(payload: Any) -> bool:
    """Whether ``payload`` is a DataFrame (False, without importing pandas, when pandas is not loaded)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(payload, pd.DataFrame)


def column_content_type(tensor: Tensor, declared: Mapping[str, MetadataTensor] | None = None) -> str | None:
    """A tensor's content type: its own, else its declared tensor's, else None."""
    if tensor.parameters is not None and tensor.parameters.content_type:
        return tensor.parameters.content_type
    spec = declared.get(tensor.name) if declared else None
    if spec is not None and spec.parameters is not None:
        return spec.parameters.content_type
    return None


def _array(tensor: Tensor) -> np.ndarray:
    data = tensor.data
    if isinstance(data, np.ndarray) and list(data.shape) == list(tensor.shape):
        return data
    if isinstance(tensor, RequestInput):
        return input_array(tensor)
    return output_array(tensor).reshape(tensor.shape)


def column_values(tensor: Tensor, declared: Mapping[str, MetadataTensor] | None = None) -> Any:
    """One column's values (a 1-D array or a list, one item per row), decoded by its content type."""
    content_type = column_content_type(tensor, declared)
    codec = _TEXT_CODECS.get(content_type or "")
    if codec is not None:
        if len(tensor.shape) > 2 or (len(tensor.shape) == 2 and tensor.shape[1] != 1):
            raise InvalidInput(
                f"Input {tensor.name!r} is a {content_type} column: its shape must be [N] or [N, 1], "
                f"got {list(tensor.shape)}"
            )
        if isinstance(tensor, RequestInput):
            return codec.decode_input(tensor)
        return codec.decode_output(tensor)
    if content_type == JSON_CONTENT_TYPE:
        try:
            return [orjson.loads(item) for item in bytes_elements(tensor)]
        except orjson.JSONDecodeError:
            raise InvalidInput(f"Input {tensor.name!r} holds a row that is not JSON") from None
    array = _array(tensor)
    if array.ndim == 0:
        return array.reshape(1)
    if array.ndim == 1:
        return array
    if array.ndim == 2 and array.shape[1] == 1:
        return array[:, 0]
    return list(array)  # one array per row


def _frame(tensors: list[Any], declared: Mapping[str, MetadataTensor] | None, kind: str) -> pandas.DataFrame:
    pd = import_pandas()
    columns: dict[str, Any] = {}
    rows: tuple[str, int] | None = None
    for tensor in tensors:
        values = column_values(tensor, declared)
        if rows is not None and len(values) != rows[1]:
            raise InvalidInput(
                f"{kind} {tensor.name!r} has {len(values)} rows but {kind.lower()} {rows[0]!r} has "
                f"{rows[1]}: the columns of a DataFrame must all have the same number of rows"
            )
        rows = rows or (tensor.name, len(values))
        columns[tensor.name] = pd.Series(values, dtype=object if isinstance(values, list) else None)
    return pd.DataFrame(columns)


def _output(name: str, series: Any) -> ResponseOutput:
    """One column of a DataFrame as an output of shape ``[N, 1]`` (see the module docstring)."""
    pd = import_pandas()
    rows = len(series)
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        items = [b"" if v is pd.NaT else v.isoformat().encode("ascii") for v in series]
        return _bytes_output(name, items, DatetimeCodec.ContentType)
    dtype = series.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "biuf":
        array = series.to_numpy()
        return ResponseOutput(
            name=name, shape=[rows, 1], datatype=datatype_of(array.dtype), data=array.reshape(rows, 1)
        )
    values = series.tolist()
    if all(isinstance(v, (str, bytes)) for v in values):
        items = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        return _bytes_output(name, items, StringCodec.ContentType)
    try:
        items = [orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY) for v in values]
    except TypeError as exc:
        raise TypeError(f"Column {name!r} holds values that cannot be written as JSON: {exc}") from None
    return _bytes_output(name, items, JSON_CONTENT_TYPE)


def _bytes_output(name: str, items: list[bytes], content_type: str) -> ResponseOutput:
    return ResponseOutput(
        name=name,
        shape=[len(items), 1],
        datatype="BYTES",
        parameters=Parameters(content_type=content_type),
        data=bytes_column(items),
    )


class PandasCodec(RequestCodec):
    """A request as a DataFrame (one column per input), a DataFrame as a response (one output per column)."""

    ContentType = "pd"
    JsonContentType = JSON_CONTENT_TYPE
    TypeHint = _DataFrameHint()

    @classmethod
    def can_encode(cls, payload: Any) -> bool:
        return is_dataframe(payload)

    @classmethod
    def encode_outputs(cls, payload: pandas.DataFrame) -> list[ResponseOutput]:
        """One output per column of ``payload``, named after the column."""
        return [_output(str(name), payload[name]) for name in payload.columns]

    @classmethod
    def encode_response(
        cls, model_name: str, payload: Any, model_version: str | None = None, **kwargs: Any
    ) -> InferenceResponse:
        return InferenceResponse(
            model_name=model_name,
            model_version=model_version,
            parameters=Parameters(content_type=cls.ContentType),
            outputs=cls.encode_outputs(payload),
        )

    @classmethod
    def decode_response(cls, response: InferenceResponse) -> pandas.DataFrame:
        return _frame(list(response.outputs), None, "Output")

    @classmethod
    def encode_request(cls, payload: Any, **kwargs: Any) -> InferenceRequest:
        inputs = [
            RequestInput(
                name=out.name,
                shape=out.shape,
                datatype=out.datatype,
                parameters=out.parameters,
                data=out.data,
            )
            for out in cls.encode_outputs(payload)
        ]
        return InferenceRequest(parameters=Parameters(content_type=cls.ContentType), inputs=inputs)

    @classmethod
    def decode_request(
        cls, request: InferenceRequest, inputs: Mapping[str, MetadataTensor] | None = None
    ) -> pandas.DataFrame:
        """The request's inputs as the columns of a DataFrame; ``inputs`` (the model's declared
        tensors, by name) give the content type of a column that does not say its own."""
        return _frame(list(request.inputs), inputs, "Input")
