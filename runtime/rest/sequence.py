"""TorchServe's sequence headers ⇄ the OIP sequence parameters (translation only; the core decides).

Requests: ``ts_request_sequence_id`` / ``ts_request_sequence_start`` / ``ts_request_sequence_end``
(any case) become the parameters ``sequence_id`` / ``sequence_start`` / ``sequence_end``.
Responses of a sequence carry ``ts_request_sequence_id`` (for sticky routers in front of replicas)
and, on the response that ends it, ``ts_request_sequence_end: true``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..sequences.identity import END, ID, START, apply_transport_fields
from ..types import InferenceRequest, InferenceResponse

HEADER_ID = "ts_request_sequence_id"
HEADER_START = "ts_request_sequence_start"
HEADER_END = "ts_request_sequence_end"
_HEADERS = ((HEADER_ID, ID), (HEADER_START, START), (HEADER_END, END))


def read_sequence_headers(request: InferenceRequest, headers: Mapping[str, str]) -> None:
    """Put the sequence headers (``headers`` must match names case-insensitively) into the request."""
    fields = {param: headers[header] for header, param in _HEADERS if header in headers}
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
    return headers
