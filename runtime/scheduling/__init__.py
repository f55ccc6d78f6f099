"""Scheduling strategies, chosen per model from its settings."""

from __future__ import annotations

from ..model import MLModel
from ..settings import ModelSettings
from .adaptive import AdaptiveScheduler
from .base import Scheduler
from .continuous import ContinuousScheduler
from .direct import DirectScheduler


def make_scheduler(model: MLModel, settings: ModelSettings) -> Scheduler:
    """The scheduler a model's settings ask for: continuous batching when ``continuous_batching``
    is on; adaptive batching when ``max_batch_size`` > 1 and ``max_batch_time`` > 0 (as in
    MLServer); else direct."""
    if settings.continuous_batching:
        return ContinuousScheduler(model, settings)
    if settings.max_batch_size > 1 and settings.max_batch_time > 0:
        return AdaptiveScheduler(model, settings)
    return DirectScheduler(model, settings)


__all__ = ["AdaptiveScheduler", "ContinuousScheduler", "DirectScheduler", "Scheduler", "make_scheduler"]
