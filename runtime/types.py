"""The Open Inference Protocol's messages as pydantic models, with MLServer's names and fields.

Transports translate their wire formats to and from these; the core and the models speak only
these. A tensor's ``data`` may hold what the wire carried (a flat or nested list from JSON, raw
little-endian bytes from binary or gRPC raw contents) until the DataPlane has checked it; from
then on, and for everything a model receives, it is a numpy array of the tensor's shape
(BYTES tensors: an object array of ``bytes``). Outputs may carry a numpy array or a list.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, RootModel


class _Base(BaseModel):
    model_config = ConfigDict(
        arbitrary_types_allowed=True,
        protected_namespaces=(),
        use_enum_values=False,
        validate_assignment=False,
    )


_LATER = ConfigDict(defer_build=True)
"""The config of the models that no start-up and no infer request needs (metadata, errors, the
repository index): their validators are built by their first use, not when the server starts."""


class Datatype(str, Enum):
    """The tensor datatypes of the protocol (BF16 is Triton's addition)."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"

    def __str__(self) -> str:
        return self.value


class UInt64(int):
    """An integer parameter that a client sent as unsigned (gRPC ``uint64_param``).

    Parameters keep it as it came, so that a model or the core echoing it back answers with the
    kind the client used; the gRPC transport also sends any integer of 2**63 or more as
    ``uint64_param``. It is an ``int`` in every other respect.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"UInt64({int(self)})"


class Parameters(_Base):
    """Free-form parameters (request, tensor or response); unknown keys are kept as extra fields."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True, protected_namespaces=())

    content_type: str | None = None
    """How a codec should decode the tensor or request (e.g. ``np``, ``str``, ``base64``)."""
    headers: dict[str, Any] | None = None
    """Transport headers a model may want to read (filled by the REST transport when asked)."""


def set_field(model: BaseModel, name: str, value: Any) -> None:
    """``setattr(model, name, value)`` for a declared field of a request or response model: what
    pydantic's own handler does for it (these models neither validate assignments nor freeze),
    without its dispatch. A subclass made elsewhere goes through pydantic as usual."""
    if type(model) in _PLAIN:
        model.__dict__[name] = value
        model.__pydantic_fields_set__.add(name)
    else:
        setattr(model, name, value)


def set_extra(parameters: Parameters, name: str, value: Any) -> None:
    """``setattr(parameters, name, value)`` for a name that is not one of Parameters' fields.

    What pydantic does for such a name (it keeps it as an extra field), without the checks it runs
    on every such assignment, since it cannot remember its answer for a free-form name.
    """
    extra = parameters.__pydantic_extra__
    if extra is None or name in _NOT_EXTRA or type(parameters) is not Parameters:
        setattr(parameters, name, value)
        return
    extra[name] = value
    parameters.__pydantic_fields_set__.add(name)


def set_fields(model: BaseModel, values: dict[str, Any]) -> None:
    """``setattr(model, name, value)`` for each declared field in ``values``: one call for several
    fields (the response's names, say), as :func:`set_field` does for one."""
    if type(model) in _PLAIN:
        model.__dict__.update(values)
        model.__pydantic_fields_set__.update(values)
    else:
        for name, value in values.items():
            setattr(model, name, value)


def extras(parameters: Parameters | None) -> dict[str, Any] | None:
    """The extra (free-form) parameters of ``parameters``, the dict itself (what ``model_extra``
    answers, without the property's Python call); None for no parameters."""
    return parameters.__pydantic_extra__ if parameters is not None else None


def fields_set(model: BaseModel) -> set[str]:
    """The names of the fields set on ``model``, the set itself (``model_fields_set``, without the
    property's Python call): a caller that fills ``model.__dict__`` adds the names here."""
    return model.__pydantic_fields_set__


def model_state(model: BaseModel) -> tuple[dict[str, Any], set[str], dict[str, Any] | None]:
    """What an instance is made of (its values, fields set and extras: what pydantic pickles), the
    objects themselves, in :func:`built`'s order: ``built(type(model), *model_state(model))`` makes
    an instance that shares them."""
    return model.__dict__, model.__pydantic_fields_set__, model.__pydantic_extra__


_NOT_EXTRA = frozenset(Parameters.model_fields) | frozenset(dir(Parameters))

_new = object.__new__
# the setters of BaseModel's slots (what pydantic's model_construct sets, without the look-ups)
_set_dict = vars(BaseModel)["__dict__"].__set__
_set_fields_set = vars(BaseModel)["__pydantic_fields_set__"].__set__
_set_extra_slot = vars(BaseModel)["__pydantic_extra__"].__set__
_set_private = vars(BaseModel)["__pydantic_private__"].__set__
_PARAMETER_DEFAULTS = {name: field.default for name, field in Parameters.model_fields.items()}

_M = TypeVar("_M", bound=BaseModel)


def built(
    cls: type[_M], values: dict[str, Any], fields_set: set[str], extra: dict[str, Any] | None = None
) -> _M:
    """An instance of ``cls`` holding ``values`` (every field, each already of its field's type),
    with ``fields_set`` as its fields set and ``extra`` as its extras: what validating the same
    values gives (or pydantic's own unpickling), without the validation. The instance takes
    ``values``, ``fields_set`` and ``extra`` as they are: the caller hands over fresh ones. The one
    place the hot paths (gRPC requests, batch pieces, worker messages, sequence parameters) build
    models they know to be valid."""
    model = _new(cls)
    _set_dict(model, values)
    _set_fields_set(model, fields_set)
    _set_extra_slot(model, extra)
    _set_private(model, None)
    return model


def extra_parameters(extra: dict[str, Any]) -> Parameters:
    """``Parameters(**extra)`` when no name in ``extra`` is one of Parameters' fields or attributes
    (free-form names: the sequence parameters): the instance pydantic's validation makes (it keeps
    extras as given, the fields at their defaults), without the validation. ``extra`` becomes the
    instance's own extras (the caller hands over a fresh dict)."""
    return built(Parameters, _PARAMETER_DEFAULTS.copy(), set(extra), extra)


class TensorData(RootModel[Any]):
    """A tensor's data as MLServer models it; kept for code that imports the name."""


class RequestInput(_Base):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: Any = None


class RequestOutput(_Base):
    name: str
    parameters: Parameters | None = None


class ResponseOutput(_Base):
    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters | None = None
    data: Any = None


class InferenceRequest(_Base):
    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class InferenceResponse(_Base):
    model_name: str = ""
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput] = []


class MetadataTensor(_Base):
    name: str
    datatype: Datatype
    shape: list[int]
    parameters: Parameters | None = None

    @property
    def optional(self) -> bool:
        """An input the client may omit (``"parameters": {"optional": true}``, Triton's ``optional``)."""
        extra = self.parameters.model_extra if self.parameters is not None else None
        return bool(extra and extra.get("optional") is True)


class MetadataModelResponse(_Base):
    model_config = _LATER

    name: str
    versions: list[str] | None = None
    platform: str = ""
    inputs: list[MetadataTensor] | None = None
    outputs: list[MetadataTensor] | None = None
    parameters: Parameters | None = None


class MetadataServerResponse(_Base):
    model_config = _LATER

    name: str
    version: str
    extensions: list[str]


class MetadataServerErrorResponse(_Base):
    model_config = _LATER

    error: str


class MetadataModelErrorResponse(_Base):
    model_config = _LATER

    error: str


class InferenceErrorResponse(_Base):
    model_config = _LATER

    error: str | None = None


class State(str, Enum):
    """A model version's state in the repository index."""

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


class RepositoryIndexRequest(_Base):
    model_config = _LATER

    ready: bool | None = None


class RepositoryIndexResponseItem(_Base):
    model_config = _LATER

    name: str
    version: str | None = None
    state: State
    reason: str = ""


class RepositoryIndexResponse(RootModel[list[RepositoryIndexResponseItem]]):
    pass


_PLAIN = frozenset({InferenceRequest, InferenceResponse, RequestInput, ResponseOutput})

request_from_json: Callable[[bytes | bytearray | str], InferenceRequest] = (
    InferenceRequest.__pydantic_validator__.validate_json
)
"""``InferenceRequest.model_validate_json(data)``: pydantic's own validator, called without the
classmethod's Python frame (raises ``ValidationError`` as it does)."""

__all__ = [
    "Datatype",
    "InferenceErrorResponse",
    "InferenceRequest",
    "InferenceResponse",
    "MetadataModelErrorResponse",
    "MetadataModelResponse",
    "MetadataServerErrorResponse",
    "MetadataServerResponse",
    "MetadataTensor",
    "Parameters",
    "RepositoryIndexRequest",
    "RepositoryIndexResponse",
    "RepositoryIndexResponseItem",
    "RequestInput",
    "RequestOutput",
    "ResponseOutput",
    "State",
    "TensorData",
    "UInt64",
    "built",
    "extra_parameters",
    "extras",
    "fields_set",
    "model_state",
    "request_from_json",
    "set_extra",
    "set_field",
    "set_fields",
]
