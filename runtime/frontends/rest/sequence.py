"""TorchServe's sequence headers ⇄ the OIP sequence parameters (translation only; the core decides).

Requests: ``ts_request_sequence_id`` / ``ts_request_sequence_start`` / ``ts_request_sequence_end``
(any case) become the parameters ``sequence_id`` / ``sequence_start`` / ``sequence_end``; the header
``sequence_step`` (for proxies that retry) the parameter of the same name.
Responses of a sequence carry ``ts_request_sequence_id`` (for sticky routers in front of replicas;
a START without an id learns the id the server made), on the response that ends it
``ts_request_sequence_end: true``, and with replicas sharing the states ``sequence_replica``, the
replica that served the step.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.sequences.identity import END, HEADERS, ID, REPLICA, STEP, apply_headers, response_headers
from runtime.types import InferenceRequest, InferenceResponse, extras

SEQUENCE_PREFIX = b"ts_request_sequence_"
STEP_HEADER = STEP.encode()
"""The raw names of the sequence headers (a REST request reader finds them by these)."""
_REPLICA = REPLICA.encode()


def read_sequence_headers(request: InferenceRequest, raw_headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Put the sequence headers into the request.

    ``raw_headers`` are the ASGI scope's (names already lower-case); one pass finds them, so a
    request without them pays a few prefix comparisons.
    """
    found = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in raw_headers
        if name[:20] == SEQUENCE_PREFIX or name == STEP_HEADER
    ]
    if found:
        apply_headers(request, found)


def sequence_headers(response: InferenceResponse) -> dict[str, str]:
    """The headers that echo a sequence response's id, end and replica."""
    return response_headers(response)


def raw_sequence_headers(response: InferenceResponse) -> list[tuple[bytes, bytes]]:
    """``sequence_headers(response)`` as an ASGI response's raw headers (UTF-8), in one call."""
    extra = extras(response.parameters)
    if not extra or ID not in extra:
        return []
    echo = extra[ID]
    raw = [(b"ts_request_sequence_id", (echo if type(echo) is str else str(echo)).encode())]
    if extra.get(END) is True:
        raw.append((b"ts_request_sequence_end", b"true"))
    replica = extra.get(REPLICA)
    if replica is not None:
        raw.append((_REPLICA, str(replica).encode()))
    return raw


__all__ = [
    "HEADERS",
    "SEQUENCE_PREFIX",
    "STEP_HEADER",
    "raw_sequence_headers",
    "read_sequence_headers",
    "sequence_headers",
]
