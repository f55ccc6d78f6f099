"""Which sequence a request belongs to: the ``sequence_id`` / ``sequence_start`` / ``sequence_end``
request parameters, read once, checked and turned into a typed ``SequenceControl``.

- An id is an unsigned integer (up to 2**64 - 1) or a string of at most 128 bytes of printable
  text. ``42`` and ``"42"`` name the same sequence: the key is the id's text; the id is echoed
  back in the type each request used. ``0`` and ``""`` mean "not a sequence" (Triton's convention).
- Flags are booleans in request parameters (REST body, gRPC ``bool_param``); anything else
  (``"yes"``, ``1``) is refused, naming the parameter. Only flags a transport read as text (HTTP
  headers) may say ``"true"``/``"false"``, ``"1"``/``"0"``, ``"yes"``/``"no"`` (any case).
- A START without an id gets a server-made id, ``seq-<uuid4>``, from the ``secrets`` module.
- ``sequence_step`` (optional) numbers a sequence's steps 1, 2, 3, ... so that a retried step is
  applied once: an unsigned integer (from text only in an HTTP header); a START's is 1.

Transports translate their own ways of saying these (REST: the TorchServe headers
``ts_request_sequence_id`` / ``_start`` / ``_end``) into the same parameters with
``apply_transport_fields``; every decision is made here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.errors import SequenceError
from runtime.ids import new_secret_id
from runtime.types import (
    InferenceRequest,
    InferenceResponse,
    Parameters,
    extra_parameters,
    extras,
    fields_set,
    set_extra,
    set_field,
)

ID = "sequence_id"
START = "sequence_start"
END = "sequence_end"
STEP = "sequence_step"
REPLICA = "sequence_replica"
FIELDS = (ID, START, END, STEP)

MAX_ID_BYTES = 128
MAX_INT_ID = 2**64 - 1
_SHORT_ID = MAX_ID_BYTES // 4
"""An id of at most this many code points is at most MAX_ID_BYTES in UTF-8."""
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}

SequenceId = str | int


@dataclass(frozen=True, slots=True)
class SequenceControl:
    """A request's sequence fields, checked."""

    key: str
    """The sequence's identity: the id's text (``42`` and ``"42"`` share the key ``"42"``)."""
    echo: SequenceId
    """The id as this request gave it (or the server made it), echoed in the response."""
    start: bool
    end: bool
    generated: bool = False
    """True when the server made the id (a START without one)."""
    step: int | None = None
    """The client's number for this step (``sequence_step``), or None when it numbers none."""


_new = object.__new__
_SET_KEY, _SET_ECHO, _SET_START, _SET_END, _SET_GENERATED, _SET_STEP = (
    vars(SequenceControl)[name].__set__ for name in ("key", "echo", "start", "end", "generated", "step")
)


def _control(key: str, echo: SequenceId, start: bool, end: bool, step: int | None) -> SequenceControl:
    """``SequenceControl(key=key, echo=echo, start=start, end=end, step=step)``: the same frozen
    instance, its slots set directly (the frozen dataclass's ``__init__`` sets each field
    by name through ``object``'s own setter: twice the cost, once per request)."""
    control = _new(SequenceControl)
    _SET_KEY(control, key)
    _SET_ECHO(control, echo)
    _SET_START(control, start)
    _SET_END(control, end)
    _SET_GENERATED(control, False)
    _SET_STEP(control, step)
    return control


def _extra(parameters: Parameters | None) -> dict[str, Any]:
    if parameters is None:
        return {}
    return parameters.model_extra or {}


def _flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise SequenceError(f"{name} must be a boolean (true or false), got {type(value).__name__} {value!r}")


def _text_flag(value: Any, name: str) -> bool:
    """A flag as a transport read it from text (an HTTP header)."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    return _flag(value, name)


def _step(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SequenceError(f"{STEP} must be an unsigned integer, got {type(value).__name__} {value!r}")
    if value < 1 or value > MAX_INT_ID:
        raise SequenceError(f"{STEP} must be an integer from 1 up, got {value}")
    return value


def _text_step(value: Any) -> int | None:
    """A step number as a transport read it from text (an HTTP header)."""
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise SequenceError(f"{STEP} must be an unsigned integer, got {value!r}")
        value = int(text)
    return _step(value)


def _id(value: Any) -> SequenceId | None:
    """The id as given, or None for "not a sequence"; raises for a malformed one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SequenceError(
            f"sequence_id must be an unsigned integer or a string, got {type(value).__name__} {value!r}"
        )
    if isinstance(value, int):
        if value < 0 or value > MAX_INT_ID:
            raise SequenceError(f"sequence_id must be an unsigned 64-bit integer, got {value}")
        return value or None
    if value == "":
        return None
    # a code point takes at most 4 bytes in UTF-8 (a lone surrogate 3): a short id needs no encoding
    if len(value) > _SHORT_ID:
        size = len(value.encode("utf-8", "surrogatepass"))  # (a lone surrogate counts its 3 bytes)
        if size > MAX_ID_BYTES:
            raise SequenceError(f"sequence_id must be at most {MAX_ID_BYTES} bytes, got {size}")
    if not value.isprintable():
        raise SequenceError(f"sequence_id must be printable text, got {value!r}")
    return value


def parse_control(parameters: Parameters | None) -> SequenceControl | None:
    """The request's sequence fields, or None when the request is not part of a sequence."""
    extra = extras(parameters)
    if not extra or (ID not in extra and START not in extra and END not in extra):
        return None
    given = extra.get(ID)
    # the common id without a call: short printable text (what _id lets through as it is)
    if type(given) is not str or not 0 < len(given) <= _SHORT_ID or not given.isprintable():
        given = _id(given)
    start = extra.get(START)
    if start is not True:  # the common cases without a call: absent, or a boolean
        start = start is not None and start is not False and _flag(start, START)
    end = extra.get(END)
    if end is not True:
        end = end is not None and end is not False and _flag(end, END)
    step = extra.get(STEP)
    if step is not None:
        step = _step(step)
        if start and step != 1:
            raise SequenceError(
                f"A request with sequence_start=true is step 1 of its sequence, not {STEP}={step}"
            )
    if given is None:
        if not start:
            if end:
                raise SequenceError("sequence_end needs the sequence_id of the sequence it ends")
            return None
        made = f"seq-{new_secret_id()}"
        return SequenceControl(key=made, echo=made, start=True, end=end, generated=True, step=step)
    return _control(given if type(given) is str else str(given), given, start, end, step)


def apply_transport_fields(request: InferenceRequest, fields: Mapping[str, Any]) -> None:
    """Merge sequence fields a transport read elsewhere (e.g. HTTP headers) into the request's parameters.

    A field the body already has must agree with the transport's value (after the same parsing);
    otherwise the request is refused, since the two disagree on which sequence it belongs to.
    """
    if not fields:
        return
    parameters = request.parameters
    if parameters is None:
        # the common case (no parameters in the body): the fields go into fresh parameters, built
        # as validating them would (extras are kept as given) and filled as set_extra would
        extra: dict[str, Any] = {}
        parameters = extra_parameters(extra)
        set_field(request, "parameters", parameters)
        given = fields_set(parameters)
        for name, value in fields.items():
            extra[name] = _transport_value(name, value)
            given.add(name)
        return
    extra = _extra(parameters)
    for name, value in fields.items():
        value = _transport_value(name, value)
        if name not in extra or extra[name] is None:
            set_extra(parameters, name, value)
            continue
        if name == ID:
            same = str(_id(extra[name])) == str(_id(value))
        elif name == STEP:
            same = _step(extra[name]) == value
        else:
            same = _flag(extra[name], name) == value
        if not same:
            raise SequenceError(
                f"The request's parameters say {name}={extra[name]!r} but its headers say {value!r}"
            )


_TEXT_FLAGS = {"true": True, "false": False}
"""The usual spellings of a flag in a header, answered without a call."""


def _transport_value(name: str, value: Any) -> Any:
    """A sequence field as a transport gave it, parsed (ids are checked later, by parse_control)."""
    if name == ID:
        return value
    if name == START or name == END:
        flag = _TEXT_FLAGS.get(value) if type(value) is str else None
        return flag if flag is not None else _text_flag(value, name)
    if name == STEP:
        return _text_step(value)
    raise ValueError(f"{name!r} is not a sequence field")


HEADERS = {
    "ts_request_sequence_id": ID,
    "ts_request_sequence_start": START,
    "ts_request_sequence_end": END,
    STEP: STEP,
}
"""Transport headers (HTTP headers, gRPC metadata; lower-case names) -> the sequence fields they set."""


def apply_headers(request: InferenceRequest, headers: Iterable[tuple[str, str]]) -> None:
    """Merge the sequence headers among ``headers`` (lower-case names) into the request's parameters."""
    fields = {}
    for name, value in headers:
        field = HEADERS.get(name)
        if field is not None:
            fields[field] = value
    if fields:
        apply_transport_fields(request, fields)


def response_headers(response: InferenceResponse) -> dict[str, str]:
    """The headers (HTTP) / metadata (gRPC) that echo a sequence response's id, end and replica,
    for routers in front of replicas and for clients that let the server make the id."""
    extra = extras(response.parameters)
    if not extra or ID not in extra:
        return {}
    echo = extra[ID]
    headers = {"ts_request_sequence_id": echo if type(echo) is str else str(echo)}
    if extra.get(END) is True:
        headers["ts_request_sequence_end"] = "true"
    replica = extra.get(REPLICA)
    if replica is not None:
        headers[REPLICA] = str(replica)
    return headers


def mark_response(
    response: InferenceResponse, control: SequenceControl, ended: bool, replica: str | None = None
) -> None:
    """Echo the sequence id (in the client's type) and, on the last response, ``sequence_end: true``;
    with replicas sharing the states, name the ``replica`` that served the step (``sequence_replica``)."""
    parameters = response.parameters
    if parameters is None:
        values: dict[str, Any] = {ID: control.echo}
        if replica is not None:
            values[REPLICA] = replica
        if ended:
            values[END] = True
        set_field(response, "parameters", extra_parameters(values))
        return
    set_extra(parameters, ID, control.echo)
    if replica is not None:
        set_extra(parameters, REPLICA, replica)
    if ended:
        set_extra(parameters, END, True)
    elif END in (parameters.model_extra or {}):
        del parameters.model_extra[END]  # type: ignore[union-attr]
