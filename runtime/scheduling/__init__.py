"""Scheduling strategies, chosen per model from its settings."""

from __future__ import annotations

from ..model import MLModel
from ..settings import ModelSettings
from .base import Scheduler
from .direct import DirectScheduler


def make_scheduler(model: MLModel, settings: ModelSettings) -> Scheduler:
    """The scheduler a model's settings ask for (direct when nothing else is asked)."""
    return DirectScheduler(model, settings)


__all__ = ["DirectScheduler", "Scheduler", "make_scheduler"]
