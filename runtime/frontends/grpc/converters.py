"""gRPC messages ⇄ the core's types.

Requests: raw_input_contents go into ``RequestInput.data`` as the bytes they are (the core turns
them into ``np.frombuffer`` views and checks their size); typed contents become one numpy array
of the tensor's dtype, built from the repeated field protobuf gives. Responses: outputs go back in
raw_output_contents when the request was raw (that is where real clients read them), in typed
contents otherwise, and raw whatever the request when an output's datatype has no typed field
(FP16, BF16), since a response cannot mix the two forms.

Parameters keep their kind both ways: ``uint64_param`` arrives as :class:`runtime.types.UInt64`
and leaves as ``uint64_param``, like any integer of 2**63 or more; other integers travel as
``int64_param``, floats as ``double_param``, booleans as ``bool_param``, strings as ``string_param``.

Bytes that do not parse as the request message a method expects are bad input: the method's
deserializer (:func:`request_reader`) gives an :class:`Undecodable` in the message's place, and
the handler's first read of a field raises ``InvalidInput`` (INVALID_ARGUMENT, in band on a stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import orjson
from google.protobuf.message import DecodeError
from pydantic import ValidationError

from runtime.errors import InvalidInput, ModelFailed
from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.wire_codec import PACKED, packed_array, raw_bytes
from runtime.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataServerResponse,
    MetadataTensor,
    Parameters,
    RepositoryIndexResponseItem,
    RequestInput,
    RequestOutput,
    UInt64,
    built,
)

_DATATYPES: dict[str, Datatype] = {d.value: d for d in Datatype}

# datatype -> (the typed contents field that carries it, the numpy dtype it decodes to)
_CONTENTS: dict[str, tuple[str, Any]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype("<i1")),
    "INT16": ("int_contents", np.dtype("<i2")),
    "INT32": ("int_contents", np.dtype("<i4")),
    "INT64": ("int64_contents", np.dtype("<i8")),
    "UINT8": ("uint_contents", np.dtype("<u1")),
    "UINT16": ("uint_contents", np.dtype("<u2")),
    "UINT32": ("uint_contents", np.dtype("<u4")),
    "UINT64": ("uint64_contents", np.dtype("<u8")),
    "FP32": ("fp32_contents", np.dtype("<f4")),
    "FP64": ("fp64_contents", np.dtype("<f8")),
    "BYTES": ("bytes_contents", np.dtype(object)),
}

_INT64_MIN, _INT64_END, _UINT64_END = -(2**63), 2**63, 2**64

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- bytes that do not parse


class Undecodable:
    """What a request deserializer gives for bytes that are not the message it expects: reading
    any field raises ``InvalidInput`` (so a handler's first read answers INVALID_ARGUMENT, and a
    valid message costs nothing more than the deserializer's try)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def refusal(self) -> InvalidInput:
        """The error that answers this message."""
        return InvalidInput(self.message)

    def decode(self) -> InferenceRequest:
        """What decoding it would give: its refusal, raised."""
        raise self.refusal()

    def __getattr__(self, name: str) -> Any:
        raise self.refusal()


def request_reader(message_type: Any) -> Callable[[bytes], Any]:
    """A gRPC request deserializer of ``message_type``: the message, or an :class:`Undecodable`
    (logged on one line) when the bytes do not parse. grpc would otherwise log the DecodeError
    with its traceback and answer UNKNOWN, ending a stream."""
    parse = message_type.FromString
    full_name = message_type.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            logger.info(
                "Refused a gRPC message (%d bytes) that is not a valid %s: %s", len(data), full_name, exc
            )
            return Undecodable(
                f"The message is not a valid {full_name}: it does not parse as protobuf ({exc})"
            )

    return deserialize


# ---------------------------------------------------------------------- parameters


def parameters_from_proto(params: Mapping[str, pb.InferParameter], where: str) -> Parameters | None:
    """The core's Parameters of a protobuf parameter map (None when it is empty)."""
    if not params:
        return None
    values: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidInput(f"Parameter {key!r} of {where} has no value")
        value = getattr(param, kind)
        values[key] = UInt64(value) if kind == "uint64_param" else value
    try:
        return Parameters.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_url=False))
        raise InvalidInput(f"Invalid parameters of {where}: {problems}") from None


def set_parameters(target: Any, params: Parameters, where: str) -> None:
    """Fill a protobuf parameter map from Parameters; ``headers`` do not travel as parameters."""
    for key, value in params:
        if value is None or key == "headers":
            continue
        set_parameter(target[key], value, key, where)


def set_parameter(param: pb.InferParameter, value: Any, key: str, where: str) -> None:
    if isinstance(value, (bool, np.bool_)):
        param.bool_param = bool(value)
    elif isinstance(value, (int, np.integer)):
        number = int(value)
        if isinstance(value, (UInt64, np.unsignedinteger)) or number >= _INT64_END:
            if not 0 <= number < _UINT64_END:
                raise ModelFailed(f"Parameter {key!r} of {where} is {number}, outside uint64's range")
            param.uint64_param = number
        elif number < _INT64_MIN:
            raise ModelFailed(f"Parameter {key!r} of {where} is {number}, outside int64's range")
        else:
            param.int64_param = number
    elif isinstance(value, (float, np.floating)):
        param.double_param = float(value)
    elif isinstance(value, str):
        param.string_param = value
    else:
        # lists, dicts…: the protocol's parameters are scalars; keep the value, as JSON text
        try:
            param.string_param = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
        except TypeError:
            raise ModelFailed(
                f"Parameter {key!r} of {where} is a {type(value).__name__}, which gRPC cannot carry"
            ) from None


def headers_of(params: Parameters | None) -> tuple[tuple[str, str], ...]:
    """A response's ``headers`` parameter as gRPC metadata (sent as trailing metadata)."""
    if params is None or not params.headers:
        return ()
    return tuple((str(k).lower(), str(v)) for k, v in params.headers.items())


# ---------------------------------------------------------------------- requests


def request_from_proto(msg: pb.ModelInferRequest) -> InferenceRequest:
    """An InferenceRequest whose inputs hold raw bytes or a numpy array each."""
    raw = msg.raw_input_contents
    tensors = msg.inputs
    if raw and len(raw) != len(tensors):
        raise InvalidInput(
            f"The request has {len(tensors)} inputs but {len(raw)} raw_input_contents entries; "
            "raw contents need one entry per input, in order"
        )
    inputs = []
    for index, tensor in enumerate(tensors):
        name = tensor.name
        datatype = _DATATYPES.get(tensor.datatype)
        if datatype is None:
            raise InvalidInput(f"Input {name!r} has unknown datatype {tensor.datatype!r}")
        if raw:
            if tensor.HasField("contents") and tensor.contents.ByteSize():
                raise InvalidInput(
                    f"Input {name!r} has typed contents in a request that uses raw_input_contents"
                )
            data: Any = raw[index]
        else:
            data = _typed_array(tensor, datatype.value)
        parameters = tensor.parameters
        fields = {
            "name": name,
            "shape": tensor.shape[:],  # a list of int (faster than list())
            "datatype": datatype,
            "parameters": parameters_from_proto(parameters, f"input {name!r}") if parameters else None,
            "data": data,
        }
        inputs.append(built(RequestInput, fields, set(_INPUT_FIELDS)))
    outputs = None
    if msg.outputs:
        outputs = [
            RequestOutput(
                name=out.name,
                parameters=parameters_from_proto(out.parameters, f"output {out.name!r}")
                if out.parameters
                else None,
            )
            for out in msg.outputs
        ]
    parameters = msg.parameters
    fields = {
        "id": msg.id or None,
        "parameters": parameters_from_proto(parameters, "the request") if parameters else None,
        "inputs": inputs,
        "outputs": outputs,
    }
    return built(InferenceRequest, fields, set(_REQUEST_FIELDS))


_INPUT_FIELDS = frozenset(RequestInput.model_fields)
_REQUEST_FIELDS = frozenset(InferenceRequest.model_fields)


def _typed_array(tensor: pb.ModelInferRequest.InferInputTensor, datatype: str) -> np.ndarray | None:
    has_contents = tensor.HasField("contents")
    if has_contents and datatype in PACKED:  # read straight from the bytes (wire_codec)
        array = packed_array(tensor.contents.SerializeToString(), datatype)
        if array is not None:
            return array
    fields = tensor.contents.ListFields() if has_contents else []
    spec = _CONTENTS.get(datatype)
    if spec is None:
        if fields:
            raise InvalidInput(
                f"Input {tensor.name!r} is {datatype}, which has no typed contents field; "
                "send it in raw_input_contents"
            )
        return None
    field, dtype = spec
    if not fields:
        return np.empty(0, dtype=dtype)
    if len(fields) != 1 or fields[0][0].name != field:
        sent = ", ".join(f.name for f, _ in fields)
        raise InvalidInput(f"Input {tensor.name!r} of {datatype} must carry its data in {field}, not {sent}")
    values = fields[0][1]
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
    # protobuf hands its repeated scalars to numpy as one buffer (no Python objects per element)
    array = np.asarray(values)
    if array.dtype == dtype:
        return array
    # int_contents / uint_contents carry 8 and 16 bit integers in 32 bits: check they fit
    info = np.iinfo(dtype)
    if array.size and (array.min() < info.min or array.max() > info.max):
        raise InvalidInput(
            f"Input {tensor.name!r} has data that is not valid {datatype}: "
            f"values must lie in [{info.min}, {info.max}]"
        )
    return array.astype(dtype)


# ---------------------------------------------------------------------- responses


def response_to_proto(
    response: InferenceResponse, raw: bool, into: pb.ModelInferResponse | None = None
) -> pb.ModelInferResponse:
    """The ModelInferResponse of a checked response (outputs hold numpy arrays).

    ``into``: an empty message to fill (e.g. the ``infer_response`` of a stream message), which
    saves copying a finished one into it.
    """
    if into is None:
        msg = pb.ModelInferResponse(
            model_name=response.model_name, model_version=response.model_version or "", id=response.id or ""
        )
    else:
        msg = into
        msg.model_name = response.model_name
        msg.model_version = response.model_version or ""
        msg.id = response.id or ""
    if response.parameters is not None:
        set_parameters(msg.parameters, response.parameters, "the response")
    outputs = response.outputs
    if not raw:
        raw = any(out.datatype is Datatype.FP16 or out.datatype is Datatype.BF16 for out in outputs)
    tensors = msg.outputs
    raw_contents = msg.raw_output_contents
    for out in outputs:
        datatype = out.datatype.value
        tensor = tensors.add(name=out.name, datatype=datatype, shape=out.shape)
        if out.parameters is not None:
            set_parameters(tensor.parameters, out.parameters, f"output {out.name!r}")
        if raw:
            raw_contents.append(raw_bytes(out.data, datatype))
        else:
            _set_typed(tensor.contents, out.data, datatype)
    return msg


def _set_typed(contents: pb.InferTensorContents, array: np.ndarray, datatype: str) -> None:
    field = _CONTENTS[datatype][0]
    if datatype == "BYTES":
        contents.bytes_contents.extend(_as_bytes(item) for item in array.reshape(-1))
    else:
        getattr(contents, field).extend(array.reshape(-1).tolist())


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    return str(item).encode()


# ---------------------------------------------------------------------- metadata and repository


def server_metadata_to_proto(meta: MetadataServerResponse) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=meta.name, version=meta.version, extensions=meta.extensions)


def _tensors(tensors: Iterable[MetadataTensor] | None) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [
        pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype.value, shape=t.shape)
        for t in tensors or ()
    ]


def model_metadata_to_proto(meta: MetadataModelResponse) -> pb.ModelMetadataResponse:
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions or [],
        platform=meta.platform,
        inputs=_tensors(meta.inputs),
        outputs=_tensors(meta.outputs),
    )


def repository_index_to_proto(items: Iterable[RepositoryIndexResponseItem]) -> pb.RepositoryIndexResponse:
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=item.name, version=item.version or "", state=item.state.value, reason=item.reason
            )
            for item in items
        ]
    )
