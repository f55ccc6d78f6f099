"""Worker processes: a model served by N processes, each with its own copy of it.

``runtime.scheduling.worker_executor.WorkerExecutor`` puts them behind the executor seam of the
schedulers; ``WorkerPool`` supervises
the processes (restart, least-busy dispatch, sequence affinity, scaling, drain); the wire format
is in ``connection`` (pickle protocol 5, out-of-band buffers) and ``messages`` (what they say).
"""

from .messages import HeldState
from .pool import WorkerPool
from .process import WorkerProcess, WorkerStartTimeout

__all__ = ["HeldState", "WorkerPool", "WorkerProcess", "WorkerStartTimeout"]
