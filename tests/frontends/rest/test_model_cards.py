"""``GET /v1/models``'s one description of the served models (``runtime.frontends.rest.model_cards``)."""

from __future__ import annotations

import time

from runtime.frontends.rest.model_cards import OWNER, model_card, models_list


def test_a_card_has_openai_s_keys() -> None:
    before = int(time.time())
    card = model_card("m")
    assert card["id"] == "m" and card["object"] == "model" and card["owned_by"] == OWNER == "mlserver-like"
    assert before <= card["created"] <= int(time.time())
    assert sorted(card) == ["created", "id", "object", "owned_by"]


def test_the_list_serves_kserve_s_and_openai_s_clients() -> None:
    listed = models_list(["a", "b"])
    assert listed["models"] == ["a", "b"]  # KServe V1
    assert listed["object"] == "list" and [card["id"] for card in listed["data"]] == ["a", "b"]  # OpenAI
    assert models_list([]) == {"object": "list", "data": [], "models": []}
