"""Worker processes: a model served by N processes, each with its own copy of it.

``runtime.scheduling.worker_executor.WorkerExecutor`` puts them behind the executor seam of the
schedulers; ``WorkerPool`` supervises
the processes (restart, least-busy dispatch, sequence affinity, scaling, drain); the wire format
is in ``wire`` (pickle protocol 5, out-of-band buffers), read and written by ``connection``, and
``messages`` holds what both ends of a stream keep (inbox, credit).
"""

from runtime.workers.messages import HeldState
from runtime.workers.pool import WorkerPool
from runtime.workers.process import WorkerProcess, WorkerStartTimeout

__all__ = ["HeldState", "WorkerPool", "WorkerProcess", "WorkerStartTimeout"]
