"""Which sequence a request belongs to: the ``sequence_id`` / ``sequence_start`` / ``sequence_end``
request parameters, read once, checked and turned into a typed ``SequenceControl``.

- An id is an unsigned integer (up to 2**64 - 1) or a string of at most 128 bytes of printable
  text. ``42`` and ``"42"`` name the same sequence: the key is the id's text; the id is echoed
  back in the type each request used. ``0`` and ``""`` mean "not a sequence" (Triton's convention).
- Flags are booleans in request parameters (REST body, gRPC ``bool_param``); anything else
  (``"yes"``, ``1``) is refused, naming the parameter. Only flags a transport read as text (HTTP
  headers) may say ``"true"``/``"false"``, ``"1"``/``"0"``, ``"yes"``/``"no"`` (any case).
- A START without an id gets a server-made id, ``seq-<uuid4>``, from the ``secrets`` module.

Transports translate their own ways of saying these (REST: the TorchServe headers
``ts_request_sequence_id`` / ``_start`` / ``_end``) into the same parameters with
``apply_transport_fields``; every decision is made here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SequenceError
from ..ids import new_secret_id
from ..types import InferenceRequest, InferenceResponse, Parameters, set_extra

ID = "sequence_id"
START = "sequence_start"
END = "sequence_end"
FIELDS = (ID, START, END)

MAX_ID_BYTES = 128
MAX_INT_ID = 2**64 - 1
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
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise SequenceError(f"sequence_id must be at most {MAX_ID_BYTES} bytes, got {len(value.encode())}")
    if not value.isprintable():
        raise SequenceError(f"sequence_id must be printable text, got {value!r}")
    return value


def parse_control(parameters: Parameters | None) -> SequenceControl | None:
    """The request's sequence fields, or None when the request is not part of a sequence."""
    extra = _extra(parameters)
    if ID not in extra and START not in extra and END not in extra:
        return None
    given = _id(extra.get(ID))
    start = _flag(extra.get(START), START)
    end = _flag(extra.get(END), END)
    if given is None:
        if not start:
            if end:
                raise SequenceError("sequence_end needs the sequence_id of the sequence it ends")
            return None
        made = f"seq-{new_secret_id()}"
        return SequenceControl(key=made, echo=made, start=True, end=end, generated=True)
    return SequenceControl(key=str(given), echo=given, start=start, end=end)


def apply_transport_fields(request: InferenceRequest, fields: Mapping[str, Any]) -> None:
    """Merge sequence fields a transport read elsewhere (e.g. HTTP headers) into the request's parameters.

    A field the body already has must agree with the transport's value (after the same parsing);
    otherwise the request is refused, since the two disagree on which sequence it belongs to.
    """
    if not fields:
        return
    if request.parameters is None:
        request.parameters = Parameters()
    extra = _extra(request.parameters)
    for name, value in fields.items():
        if name not in FIELDS:
            raise ValueError(f"{name!r} is not a sequence field")
        if name != ID:
            value = _text_flag(value, name)
        if name not in extra or extra[name] is None:
            set_extra(request.parameters, name, value)
            continue
        same = str(_id(extra[name])) == str(_id(value)) if name == ID else _flag(extra[name], name) == value
        if not same:
            raise SequenceError(
                f"The request's parameters say {name}={extra[name]!r} but its headers say {value!r}"
            )


def mark_response(response: InferenceResponse, control: SequenceControl, ended: bool) -> None:
    """Echo the sequence id (in the client's type) and, on the last response, ``sequence_end: true``."""
    if response.parameters is None:
        response.parameters = Parameters()
    set_extra(response.parameters, "sequence_id", control.echo)
    if ended:
        set_extra(response.parameters, "sequence_end", True)
    elif "sequence_end" in (response.parameters.model_extra or {}):
        del response.parameters.model_extra["sequence_end"]  # type: ignore[union-attr]
