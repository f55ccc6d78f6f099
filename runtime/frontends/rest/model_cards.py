"""The served models described as ``GET /v1/models`` answers them: KServe V1's and OpenAI's alike.

One description for both protocols' clients: KServe's read ``models`` (the names), OpenAI's read
``data`` (a card per model: ``id``, ``object``, ``created``, ``owned_by``). Transport-free: the
front ends (``runtime.frontends.kserve.v1``, ``runtime.frontends.openai.openai_routes``) write it.
"""

from __future__ import annotations

import time
from typing import Any

OWNER = "mlserver-like"
"""OpenAI's ``owned_by`` of every served model."""


def model_card(name: str) -> dict[str, Any]:
    """One model, as OpenAI's ``GET /v1/models/{model}`` answers it."""
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": OWNER}


def models_list(names: list[str]) -> dict[str, Any]:
    """``GET /v1/models`` for KServe's clients (``models``) and OpenAI's (``data``) alike."""
    return {"object": "list", "data": [model_card(n) for n in names], "models": names}
