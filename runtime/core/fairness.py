"""Fair turns for REST and gRPC in the one event loop they share.

Why: grpc.aio accepts calls one at a time. For each method its server keeps ONE call request
open in gRPC core; a call that arrives is handed to the loop through gRPC's completion-queue
thread, and the next call is only asked for after a few loop iterations (the request's future
completes, ``asyncio.wait`` wakes the serving task, which creates the handler task and a new
request task). So gRPC starts about one call every three or four loop iterations however many
calls wait, while uvicorn starts a REST request for every connection that has one ready in each
iteration. Under REST load an iteration runs a request of every busy REST connection (16
connections: several milliseconds), and the gRPC calls queue in front of the accept: beside 16
REST connections gRPC fell to a fraction of its rate alone, with p99 latencies of 200-600 ms spent
before the handler started (the handler and the answer stayed under a millisecond).

What: while gRPC inference calls are being served (one started within ``GRPC_ACTIVE_WINDOW``),
REST ``infer`` requests (the hot path) take turns, at most ``REST_STARTS_PER_ITERATION``
starting per loop iteration and the others waiting their turn in order of arrival. Iterations stay short, so
gRPC's accept gets its iterations and each transport keeps a fair share of the loop. With no
gRPC traffic nothing waits: REST alone runs as before. Health, metadata and every other cheap
request never wait. ``Settings.transport_fairness`` turns it off.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

REST_STARTS_PER_ITERATION = 1
"""REST inference requests started per event-loop iteration while gRPC is busy."""

GRPC_ACTIVE_WINDOW = 0.5
"""Seconds after a gRPC inference call starts during which REST takes turns."""


class LoopTurns:
    """Lets REST inference requests start one per loop iteration while gRPC calls are being served."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.grpc_seen = float("-inf")
        """When (``time.monotonic()``) the last gRPC inference call started."""
        self._started = 0  # REST requests started in this iteration
        self.queue: deque[asyncio.Future[None]] = deque()
        """The REST requests waiting for their turn (a transport reads it, with ``grpc_seen``, to
        skip ``rest_turn`` at the cost of two attribute reads when nothing waits)."""
        self._waiting = self.queue
        self._next_scheduled = False

    def grpc_call(self) -> None:
        """A gRPC inference call (or stream message) starts: REST takes turns for a while."""
        self.grpc_seen = time.monotonic()

    def contended(self) -> bool:
        """Whether REST should take turns now (fairness on, and gRPC served recently)."""
        return self.enabled and time.monotonic() - self.grpc_seen < GRPC_ACTIVE_WINDOW

    async def rest_turn(self) -> None:
        """Return when this REST request may start: at once unless REST is taking turns."""
        if not self.contended() and not self._waiting:
            return
        if self._started < REST_STARTS_PER_ITERATION and not self._waiting:
            self._started += 1
            self._schedule_next()
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        self._schedule_next()
        await turn

    @property
    def waiting(self) -> int:
        """REST requests waiting for their turn now."""
        return len(self._waiting)

    def _schedule_next(self) -> None:
        if not self._next_scheduled:
            self._next_scheduled = True
            asyncio.get_running_loop().call_soon(self._next_iteration)

    def _next_iteration(self) -> None:
        """Runs once in the next loop iteration: hand out its turns in arrival order (every waiting
        request's when gRPC has gone quiet)."""
        self._next_scheduled = False
        self._started = 0
        turns = REST_STARTS_PER_ITERATION if self.contended() else len(self._waiting)
        while self._waiting and self._started < turns:
            turn = self._waiting.popleft()
            if not turn.done():  # a request cancelled while waiting gives its turn away
                turn.set_result(None)
                self._started += 1
        if self._waiting or self._started:
            self._schedule_next()
