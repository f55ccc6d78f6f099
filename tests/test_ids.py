"""``runtime.ids``: server-made ids, and ``assign_id``, the one place a request gets one."""

from __future__ import annotations

import uuid

from runtime.ids import assign_id, new_id, new_secret_id
from runtime.types import InferenceRequest


def test_assign_id_names_a_request_once_and_keeps_a_clients_id() -> None:
    unnamed = InferenceRequest(inputs=[])
    made = assign_id(unnamed)
    assert unnamed.id == made and uuid.UUID(made).version == 4
    assert assign_id(unnamed) == made
    named = InferenceRequest(id="mine", inputs=[])
    assert assign_id(named) == "mine" and named.id == "mine"


def test_ids_are_version_4_uuids_in_their_usual_text() -> None:
    for made in (new_id(), new_secret_id()):
        parsed = uuid.UUID(made)
        assert parsed.version == 4 and str(parsed) == made
    assert len({new_id() for _ in range(1000)}) == 1000
