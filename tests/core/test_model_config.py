"""Triton's model configuration derived from a model's settings (``runtime.core.model_config``)."""

from __future__ import annotations

from typing import Any

from runtime.core.model_config import model_config
from runtime.settings import ModelSettings
from runtime.types import Datatype, MetadataTensor, Parameters


def _tensor(name: str, shape: list[int], datatype: str, **parameters: Any) -> MetadataTensor:
    return MetadataTensor(
        name=name,
        shape=shape,
        datatype=Datatype(datatype),
        parameters=Parameters.model_validate(parameters) if parameters else None,
    )


def _settings(**fields: Any) -> ModelSettings:
    return ModelSettings(
        name="m",
        platform="pytorch",
        inputs=[_tensor("x", [-1, 3], "FP32"), _tensor("mask", [-1, 3], "BOOL", optional=True)],
        outputs=[_tensor("label", [-1, 1], "BYTES")],
        **fields,
    )


def test_an_unbatched_model_keeps_whole_shapes_and_names_bytes_string() -> None:
    config = model_config(_settings(), {"scheduler": "direct"})
    assert config == {
        "name": "m",
        "platform": "pytorch",
        "backend": "python",
        "max_batch_size": 0,
        "input": [
            {"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 3]},
            {"name": "mask", "data_type": "TYPE_BOOL", "dims": [-1, 3], "optional": True},
        ],
        "output": [{"name": "label", "data_type": "TYPE_STRING", "dims": [-1, 1]}],
    }


def test_an_adaptively_batched_model_drops_the_batch_dimension_and_says_its_delay() -> None:
    config = model_config(_settings(max_batch_size=8, max_batch_time=0.005), {"scheduler": "adaptive"})
    assert config["max_batch_size"] == 8
    assert [tensor["dims"] for tensor in config["input"] + config["output"]] == [[3], [3], [1]]
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 5000}
    assert "sequence_batching" not in config and "model_transaction_policy" not in config


def test_a_continuous_model_is_decoupled_and_counts_no_batch_dimension() -> None:
    plain = model_config(_settings(max_batch_size=4, continuous_batching=True), {"scheduler": "continuous"})
    assert plain["max_batch_size"] == 0 and plain["input"][0]["dims"] == [-1, 3]
    assert plain["model_transaction_policy"] == {"decoupled": True} and "sequence_batching" not in plain
    sequences = model_config(
        _settings(
            max_batch_size=4,
            continuous_batching=True,
            sequence_batching=True,
            max_sequences=7,
            max_sequence_idle_ms=250,
        ),
        {"scheduler": "continuous"},
    )
    assert sequences["sequence_batching"] == {
        "max_sequence_idle_microseconds": 250_000,
        "oldest": {"max_candidate_sequences": 7},
    }
