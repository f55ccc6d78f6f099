"""Triton's model configuration (GET /v2/models/{m}/config), derived from a model's settings.

Load generators such as perf_analyzer read it before they send traffic: it tells them the
tensors, whether the first dimension is a batch dimension (``max_batch_size`` > 0) and which
batching the model uses.
"""

from __future__ import annotations

from typing import Any

from runtime.settings import ModelSettings
from runtime.types import MetadataTensor


def _tensor(tensor: MetadataTensor, batched: bool) -> dict[str, Any]:
    datatype = tensor.datatype.value
    dims = list(tensor.shape[1:]) if batched and tensor.shape else list(tensor.shape)
    found: dict[str, Any] = {
        "name": tensor.name,
        "data_type": "TYPE_" + ("STRING" if datatype == "BYTES" else datatype),
        "dims": dims,
    }
    if tensor.optional:
        found["optional"] = True
    return found


def model_config(settings: ModelSettings, scheduler: dict[str, Any]) -> dict[str, Any]:
    """The model's configuration in Triton's JSON form; ``scheduler`` is its scheduler's description."""
    # a continuous model's max_batch_size counts streams, not rows of a batch dimension
    batched = settings.max_batch_size > 1 and scheduler.get("scheduler") != "continuous"
    config: dict[str, Any] = {
        "name": settings.name,
        "platform": settings.platform,
        "backend": "python",
        "max_batch_size": settings.max_batch_size if batched else 0,
        "input": [_tensor(t, batched) for t in settings.inputs],
        "output": [_tensor(t, batched) for t in settings.outputs],
    }
    if scheduler.get("scheduler") == "continuous":
        config["model_transaction_policy"] = {"decoupled": True}  # Triton's name for a streaming model
        if settings.sequence_batching:
            config["sequence_batching"] = {
                "max_sequence_idle_microseconds": settings.max_sequence_idle_ms * 1000,
                "oldest": {"max_candidate_sequences": settings.max_sequences},
            }
    if scheduler.get("scheduler") == "adaptive":
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": int(settings.max_batch_time * 1_000_000),
        }
    if scheduler.get("scheduler") == "sequence":
        config["sequence_batching"] = {
            "max_sequence_idle_microseconds": settings.max_sequence_idle_ms * 1000,
            "oldest": {
                "max_candidate_sequences": settings.max_sequences,
                "max_queue_delay_microseconds": int(settings.max_batch_time * 1_000_000),
            },
            **{key: value for key, value in scheduler.items() if key not in ("scheduler", "stats")},
        }
    return config
