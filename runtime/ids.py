"""Server-made ids: for requests that came without one (uuid4 text, made without uuid's overhead;
``assign_id`` is the one place a request gets one), and for sequences started without one (from the
``secrets`` module: a sequence id is all a client needs to send requests into that sequence and read
its state, so it must not be guessable)."""

from __future__ import annotations

import secrets
from random import getrandbits

from runtime.types import InferenceRequest, set_field

_VERSION_4 = (0xFFFFFFFF_FFFF_0FFF_3FFF_FFFFFFFFFFFF, 0x00000000_0000_4000_8000_000000000000)


def new_id() -> str:
    """A random version-4 UUID in its usual text form (not for secrets: ids only need to be unique)."""
    return _uuid_text(getrandbits(128))


def assign_id(request: InferenceRequest) -> str:
    """The request's id, made now if it came without one: the one place request ids are assigned."""
    if request.id is None:
        made = _uuid_text(getrandbits(128))  # (new_id without its frame: once per request)
        set_field(request, "id", made)
        return made
    return request.id


def new_secret_id() -> str:
    """A version-4 UUID from a cryptographically strong source (``secrets``), for ids that grant access."""
    return _uuid_text(secrets.randbits(128))


def _uuid_text(bits: int) -> str:
    """The version-4 UUID made of 128 random ``bits``, in its usual text form."""
    value = (bits & _VERSION_4[0]) | _VERSION_4[1]
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
