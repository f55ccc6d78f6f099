"""Scheduling strategies, chosen per model from its settings."""

from __future__ import annotations

import logging

from ..model import MLModel
from ..sequences.model import SequenceModel
from ..settings import ModelSettings
from .base import RequestFailed, Scheduler
from .direct import DirectScheduler
from .sequence import SequenceScheduler

logger = logging.getLogger(__name__)


def make_scheduler(model: MLModel, settings: ModelSettings) -> Scheduler:
    """The scheduler a model's settings ask for (direct when nothing else is asked)."""
    if settings.sequence_batching:
        return SequenceScheduler(model, settings)
    if isinstance(model, SequenceModel):
        logger.warning(
            "Model %r is a SequenceModel but its settings do not set sequence_batching: true; "
            "it gets no sequence state",
            settings.name,
        )
    return DirectScheduler(model, settings)


__all__ = ["DirectScheduler", "RequestFailed", "Scheduler", "SequenceScheduler", "make_scheduler"]
