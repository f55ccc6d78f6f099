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

from ..sequences.identity import END, ID, REPLICA, START, STEP, apply_transport_fields
from ..types import InferenceRequest, InferenceResponse

HEADER_ID = "ts_request_sequence_id"
HEADER_START = "ts_request_sequence_start"
HEADER_END = "ts_request_sequence_end"
HEADER_STEP = STEP
HEADER_REPLICA = REPLICA
_HEADERS = ((HEADER_ID, ID), (HEADER_START, START), (HEADER_END, END), (HEADER_STEP, STEP))


_PREFIX = b"ts_request_sequence_"
_STEP = HEADER_STEP.encode()


def read_sequence_headers(request: InferenceRequest, raw_headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Put the sequence headers into the request.

    ``raw_headers`` are the ASGI scope's (names already lower-case); one pass finds them, so a
    request without them pays a few prefix comparisons.
    """
    found = {name: value for name, value in raw_headers if name[:20] == _PREFIX or name == _STEP}
    if not found:
        return
    fields = {
        param: found[header.encode()].decode("latin-1")
        for header, param in _HEADERS
        if header.encode() in found
    }
    if fields:
        apply_transport_fields(request, fields)


def sequence_headers(response: InferenceResponse) -> dict[str, str]:
    """The headers that echo a sequence response's id and end."""
    extra = response.parameters.model_extra if response.parameters is not None else None
    if not extra or ID not in extra:
        return {}
    headers = {HEADER_ID: str(extra[ID])}
    if extra.get(END) is True:
        headers[HEADER_END] = "true"
    replica = extra.get(REPLICA)
    if replica is not None:
        headers[HEADER_REPLICA] = str(replica)
    return headers
