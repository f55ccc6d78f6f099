"""Server-made ids for requests that came without one (uuid4 text, made without uuid's overhead)."""

from __future__ import annotations

from random import getrandbits

_VERSION_4 = (0xFFFFFFFF_FFFF_0FFF_3FFF_FFFFFFFFFFFF, 0x00000000_0000_4000_8000_000000000000)


def new_id() -> str:
    """A random version-4 UUID in its usual text form (not for secrets: ids only need to be unique)."""
    value = (getrandbits(128) & _VERSION_4[0]) | _VERSION_4[1]
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
