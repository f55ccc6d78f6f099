"""Scheduling strategies, chosen per model from its settings."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from runtime.continuous import ContinuousModel
from runtime.model import MLModel
from runtime.scheduling.direct import DirectScheduler
from runtime.scheduling.scheduler import Scheduler, StreamError
from runtime.sequences.sequence_model import SequenceModel, serves_stateless
from runtime.settings import ModelSettings

if TYPE_CHECKING:
    from runtime.scheduling.adaptive import AdaptiveScheduler
    from runtime.scheduling.continuous_batching import ContinuousScheduler
    from runtime.scheduling.forwarding import ForwardingScheduler
    from runtime.scheduling.sequence_batching import SequenceScheduler
    from runtime.scheduling.worker_executor import WorkerExecutor

logger = logging.getLogger(__name__)

# the batching schedulers are imported by the first model that asks for one: a server of
# unbatched models never loads them (nor numpy's concatenation helpers they bring)
_LAZY = {
    "AdaptiveScheduler": ".adaptive",
    "ContinuousScheduler": ".continuous_batching",
    "ForwardingScheduler": ".forwarding",
    "SequenceScheduler": ".sequence_batching",
    "WorkerExecutor": ".worker_executor",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def make_scheduler(
    model: MLModel, settings: ModelSettings, workers: WorkerExecutor | None = None
) -> Scheduler:
    """The scheduler a model's settings ask for: continuous batching when ``continuous_batching``
    is set; else sequence batching when ``sequence_batching`` is set; else adaptive batching when
    ``max_batch_size`` > 1 and ``max_batch_time`` > 0 (as in MLServer); else direct.

    With ``workers`` the model runs in worker processes: the scheduler hands them its batches,
    streams and sequence steps; a continuous batcher runs inside each worker instead, and the
    server forwards requests to them."""
    if settings.continuous_batching:
        if workers is not None:
            from runtime.scheduling.forwarding import ForwardingScheduler

            return ForwardingScheduler(model, settings, workers)
        from runtime.scheduling.continuous_batching import ContinuousScheduler

        return ContinuousScheduler(model, settings)
    if isinstance(model, ContinuousModel) and not _answers_alone(model):
        logger.warning(
            "Model %r is a ContinuousModel but its settings do not set continuous_batching: true; "
            "its step is not used",
            settings.name,
        )
    if settings.sequence_batching:
        # requests outside any sequence go to the model's predict, scheduled as for any model
        stateless = _stateless(model, settings, workers) if serves_stateless(model) else None
        from runtime.scheduling.sequence_batching import SequenceScheduler

        return SequenceScheduler(model, settings, stateless=stateless, executor=workers)
    if isinstance(model, SequenceModel) and not serves_stateless(model):
        logger.warning(
            "Model %r is a SequenceModel but its settings do not set sequence_batching: true; "
            "it gets no sequence state",
            settings.name,
        )
    return _stateless(model, settings, workers)


def _answers_alone(model: MLModel) -> bool:
    """Whether a model answers requests without stepping (it implements predict or predict_stream)."""
    cls = type(model)
    return cls.predict_stream is not MLModel.predict_stream or cls.predict not in (
        MLModel.predict,
        SequenceModel.predict,
    )


def _stateless(model: MLModel, settings: ModelSettings, workers: WorkerExecutor | None) -> Scheduler:
    if settings.max_batch_size > 1 and settings.max_batch_time > 0:
        from runtime.scheduling.adaptive import AdaptiveScheduler

        adaptive = AdaptiveScheduler(model, settings)
        if workers is not None:  # at least one batch in flight per worker
            adaptive.max_concurrent_batches = max(adaptive.max_concurrent_batches, workers.pool.target)
        scheduler: Scheduler = adaptive
    else:
        scheduler = DirectScheduler(model, settings)
    if workers is not None:
        scheduler.executor = workers
    return scheduler


__all__ = [
    "AdaptiveScheduler",
    "ContinuousScheduler",
    "DirectScheduler",
    "ForwardingScheduler",
    "Scheduler",
    "SequenceScheduler",
    "StreamError",
    "WorkerExecutor",
    "make_scheduler",
]
