"""Stateful sequences: identity, lifecycle, the state store and the model API.

The scheduler that serves them is ``runtime.scheduling.sequence_batching.SequenceScheduler``, its lifecycle
``runtime.sequences.engine.SequenceEngine``.
"""

from runtime.sequences.identity import SequenceControl, parse_control
from runtime.sequences.sequence_model import END_REASONS, EndReason, SequenceModel, SequenceStep
from runtime.sequences.store import LRUStateStore, StateStore

__all__ = [
    "END_REASONS",
    "EndReason",
    "LRUStateStore",
    "SequenceControl",
    "SequenceModel",
    "SequenceStep",
    "StateStore",
    "parse_control",
]
