"""Counts a scheduler keeps about its own model executions, read by the metrics at scrape time.

Plain integers and floats, updated at the one place where a scheduler calls its model; nothing here
decides anything, and nothing here imports a metrics library (the core does not pay for one).
"""

from __future__ import annotations

from typing import Any


class ExecutionStats:
    """Model executions of one loaded model version (a batch, a sequence batch or a step is one).

    ``executed(size)`` is called once per execution that served at least one request, with the
    number of requests (or streams) it served successfully, the seconds those requests waited
    before it (summed over them), the seconds the model computed, and the batch items (rows) they
    held when that is not one each. As in Triton, what failed is counted by the failures alone: an
    execution whose requests all failed is no execution here, and a failed request adds no
    inference, queue or compute time.
    """

    __slots__ = ("batch_sizes", "compute_seconds", "executions", "inferences", "queue_seconds")

    def __init__(self) -> None:
        self.executions = 0
        self.inferences = 0
        """Batch items served (Triton's inference count): a request's rows under adaptive batching,
        one per request (or stream step) otherwise."""
        self.batch_sizes: dict[int, int] = {}
        """Executions by the number of requests they served."""
        self.queue_seconds = 0.0
        self.compute_seconds = 0.0
        """Model time summed over the requests served (a batch of 4 taking 1 s counts 4 s, as Triton)."""

    def executed(
        self, size: int, queued: float = 0.0, compute: float = 0.0, items: int | None = None
    ) -> None:
        self.executions += 1
        self.inferences += size if items is None else items
        self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1
        self.queue_seconds += queued
        self.compute_seconds += compute * size

    @classmethod
    def of(cls, snapshot: dict[str, Any]) -> ExecutionStats:
        """Counts as a :meth:`snapshot` (or a sum of snapshots) gives them."""
        stats = cls()
        stats.executions = int(snapshot.get("executions", 0))
        stats.inferences = int(snapshot.get("inferences", 0))
        stats.batch_sizes = {int(k): int(v) for k, v in snapshot.get("batch_sizes", {}).items()}
        stats.queue_seconds = float(snapshot.get("queue_seconds", 0.0))
        stats.compute_seconds = float(snapshot.get("compute_seconds", 0.0))
        return stats

    def snapshot(self) -> dict[str, Any]:
        return {
            "executions": self.executions,
            "inferences": self.inferences,
            "batch_sizes": dict(self.batch_sizes),
            "queue_seconds": self.queue_seconds,
            "compute_seconds": self.compute_seconds,
        }
