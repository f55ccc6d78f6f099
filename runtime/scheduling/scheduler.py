"""The one interface every scheduling strategy implements.

The DataPlane hands each request (or stream of requests) to the model's scheduler and never
knows which strategy it is: direct (the default), adaptive batching, sequence batching or
continuous batching. A scheduler owns any queues and tasks it needs; ``stop`` ends them after
the work already accepted has finished.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from typing import Any

from runtime.model import MLModel
from runtime.scheduling.executor import Executor, InProcessExecutor
from runtime.settings import ModelSettings
from runtime.streams.pipeline import StreamError
from runtime.telemetry.stats import ExecutionStats
from runtime.types import InferenceRequest, InferenceResponse

__all__ = ["Scheduler", "StreamError"]


class Scheduler(abc.ABC):
    """Decides when and with what the model's ``predict`` / ``predict_stream`` are called."""

    def __init__(self, model: MLModel, settings: ModelSettings, executor: Executor | None = None) -> None:
        self.model = model
        self.settings = settings
        self.stats = ExecutionStats()
        """Model executions, for the metrics (each strategy reports where it calls the model)."""
        self.executor = executor if executor is not None else InProcessExecutor(model, settings)
        """Where the model's code is called (in this process unless told otherwise)."""

    async def start(self) -> None:
        """Start background tasks, if the strategy has any."""

    async def stop(self) -> None:
        """Finish accepted work and end background tasks."""

    def hurry(self) -> None:
        """The model is being unloaded once its work ends: hold nothing back for later (a batch
        waiting to fill goes now); new requests are still served. By default nothing waits."""

    async def hand_over(self) -> None:
        """The server drains: let other replicas take over now what this one holds and nothing here
        runs or waits for (sequences in a shared store); by default there is nothing to hand over."""

    @abc.abstractmethod
    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Serve one request and return its own response."""

    @abc.abstractmethod
    def stream(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse | StreamError]:
        """Serve a stream of requests; cancelling the iteration must stop the model's work.

        Raising ends the stream (the failure is reported for the latest request taken); yielding
        a ``StreamError`` reports one request's failure and the stream goes on."""

    async def refresh(self) -> None:
        """Bring counts kept elsewhere up to date (a batcher running in worker processes); the
        metrics call it before a scrape. Nothing to do for a scheduler that runs here."""

    def describe(self) -> dict[str, Any]:
        """The strategy's settings, shown in model metadata."""
        return {"scheduler": "direct"}

    def open_sequences(self) -> int:
        """How many sequences are open on the model now (a model with one is not unloaded to make
        room); read from ``describe``'s sequence statistics, where the strategy keeps sequences."""
        described = self.describe()
        sequences = described.get("sequence_stats") or (
            described.get("stats") if described.get("scheduler") == "sequence" else None
        )
        return int(sequences.get("open_sequences", 0)) if sequences else 0
