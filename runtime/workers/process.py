"""One worker process as the server sees it: starting it, talking to it, and noticing its death.

A :class:`WorkerProcess` sends calls, streams and sequence steps to its process and routes what
comes back to their callers. It counts the work the process holds (``busy``: every call and stream
until its final message, so a call whose caller gave up still counts while the model runs it).
When the process dies, every caller still waiting on it fails at once with :class:`WorkerLost`,
which names the worker, its pid and how it died; the pool decides what happens next.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

from runtime.errors import WorkerLost
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from runtime.workers.connection import Connection
from runtime.workers.messages import ACK_EVERY, FINAL, Credit, Inbox

logger = logging.getLogger(__name__)

Status = Literal["STARTING", "READY", "DRAINING", "STOPPING", "STOPPED", "DEAD"]

LOST_GRACE = 2.0
"""Seconds a worker whose socket closed gets to exit before it is killed."""


class _Stream:
    """What the server holds for one stream running in a worker: what it sent that the caller has
    not taken yet, and how many more requests it may be sent."""

    __slots__ = ("credit", "inbox")

    def __init__(self) -> None:
        self.inbox: Inbox[tuple[str, Any]] = Inbox()
        self.credit = Credit()


class WorkerStartTimeout(RuntimeError):
    """A worker did not load its model within the model's ``worker_start_timeout``; it was killed."""


def how_it_ended(returncode: int | None) -> str:
    """A process's end in words: ``killed by SIGKILL``, ``exited with code 3``."""
    if returncode is None:
        return "lost its connection"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _environment() -> dict[str, str]:
    """The server's environment, with this ``runtime`` package first on the worker's import path."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


class WorkerProcess:
    """One worker process of one model."""

    def __init__(
        self,
        settings: ModelSettings,
        worker_id: int,
        on_exit: Callable[[WorkerProcess], None],
        on_ended: Callable[[WorkerProcess, str, str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.id = worker_id
        self.on_exit = on_exit
        self.on_ended = on_ended
        """Told of each sequence that ended in the process's own batcher (continuous batching), and why."""
        self.status: Status = "STARTING"
        self.pid: int | None = None
        self.started_at = time.time()
        self.ready_at: float | None = None
        self.returncode: int | None = None
        self.reason = ""
        """Why it is not serving (its load failure, or how it died)."""
        self.busy = 0
        """Calls and streams it holds (until their final message)."""
        self.sequences: set[str] = set()
        """Keys of the open sequences whose state it holds."""
        self.expected_exit = False
        self._proc: asyncio.subprocess.Process | None = None
        self._conn = Connection(self._on_message, self._on_lost)
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, _Stream | None] = {}
        self._ready: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop  # the loop it was started in
        self.idle = asyncio.Event()
        self.idle.set()

    @property
    def name(self) -> str:
        return self.settings.name

    def __repr__(self) -> str:
        return f"<worker {self.id} of {self.name!r} pid={self.pid} {self.status}>"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the process and wait until its model has loaded; raise if it cannot."""
        loop = self._loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        ours, theirs = socket.socketpair()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "runtime.server.worker",
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_environment(),
            )
        finally:
            theirs.close()
        self.pid = self._proc.pid
        self.started_at = time.time()
        await loop.connect_accepted_socket(lambda: self._conn, ours)
        self._monitor = loop.create_task(self._watch(), name=f"worker-{self.name}-{self.id}")
        blob = pickle.dumps(self.settings, protocol=5)
        self._conn.send(("init", 0, (list(sys.path), blob, self.id)))
        limit = self.settings.worker_start_timeout
        try:
            async with asyncio.timeout(limit):
                await self._ready
        except TimeoutError:
            self.expected_exit = True  # not restarted by the pool: its starter fails
            self.reason = (
                f"Model {self.name!r}: worker {self.id} (pid {self.pid}) did not load the model within "
                f"worker_start_timeout ({limit:g}s) and was killed"
            )
            logger.error("%s", self.reason)
            self.kill()
            raise WorkerStartTimeout(self.reason) from None
        except BaseException:  # it could not load, or its starter gave up: it serves nobody
            self.expected_exit = True
            self.kill()
            raise
        self.status = "READY"
        self.ready_at = time.time()

    async def _watch(self) -> None:
        assert self._proc is not None
        self.returncode = await self._proc.wait()
        self._conn.close()
        self._exited()

    def _exited(self) -> None:
        ended = how_it_ended(self.returncode)
        if self.status not in ("STOPPED",):
            if not self.expected_exit:
                self.reason = f"worker {self.id} (pid {self.pid}) {ended}"
                logger.error("Model %r: %s", self.name, self.reason)
            self.status = "STOPPED" if self.expected_exit else "DEAD"
        error = WorkerLost(
            f"Model {self.name!r}: worker {self.id} (pid {self.pid}) died ({ended}) while serving this request"
        )
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(WorkerLost(self.reason or f"worker {self.id} {ended} while loading"))
            self._ready.exception()  # retrieved: the starter may be gone
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        for stream in self._streams.values():
            if stream is not None:
                stream.inbox.put(("err", error))
        self._streams.clear()
        self.busy = 0
        self.idle.set()
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        self.on_exit(self)

    def _on_lost(self) -> None:
        # the socket closed: the process is dying or gone; make sure it ends
        if self._proc is not None and self._proc.returncode is None:
            asyncio.get_running_loop().call_later(LOST_GRACE, self.kill)

    def kill(self) -> None:
        """End the process at once (SIGKILL)."""
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    async def stop(self, grace: float) -> None:
        """Let its work finish, have it unload its model and exit; kill it after ``grace`` seconds."""
        self.expected_exit = True
        if self._proc is None or self._proc.returncode is not None:
            return
        self.status = "STOPPING"
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        try:
            async with asyncio.timeout(grace):
                await self.idle.wait()
                if not self._conn.closed:
                    self._conn.send(("stop", 0, None))
                await asyncio.shield(self._stopped)
        except TimeoutError:
            logger.warning(
                "Model %r: worker %d did not stop within %.1fs; killing it", self.name, self.id, grace
            )
            self.kill()
            await asyncio.shield(self._stopped)
        if self._monitor is not None:
            await asyncio.gather(self._monitor, return_exceptions=True)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self._conn.closed

    def memory(self) -> int | None:
        """Resident memory of the process in bytes (None if unknown)."""
        if self.pid is None or not self.alive:
            return None
        try:
            with open(f"/proc/{self.pid}/statm") as statm:
                return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    # ------------------------------------------------------------------ messages from the worker

    def _on_message(self, message: tuple[str, int, Any]) -> None:
        kind, ident, payload = message
        if kind == "ok":  # most messages: a call's result
            self._finished(ident, kind, payload)
            return
        if ident == 0:
            self._on_control(kind, payload)
            return
        if kind == "chunk" or kind == "ack":
            stream = self._streams.get(ident)
            if stream is not None:
                if kind == "chunk":
                    stream.inbox.put((kind, payload))
                else:
                    stream.credit.give(payload)
            return
        if kind in FINAL:
            self._finished(ident, kind, payload)

    def _on_control(self, kind: str, payload: Any) -> None:
        if kind == "ended":
            if self.on_ended is not None:
                key, reason = payload
                self.on_ended(self, key, reason)
        elif kind == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
        elif kind == "failed":
            self.reason = f"worker {self.id} failed to load: {payload}"
            self.expected_exit = True
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(RuntimeError(payload))

    def _finished(self, ident: int, kind: str, payload: Any) -> None:
        future = self._calls.pop(ident, None)
        if future is not None:
            self._done_one()
            if not future.done():
                if kind == "ok":
                    future.set_result(payload)
                elif kind == "err":
                    future.set_exception(payload)
                else:
                    future.cancel()
            return
        if ident in self._streams:
            stream = self._streams.pop(ident)
            self._done_one()
            if stream is not None:
                stream.inbox.put((kind, payload))

    def _done_one(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.idle.set()

    def _begin(self) -> int:
        if not self.alive:
            raise WorkerLost(f"Model {self.name!r}: worker {self.id} (pid {self.pid}) is not running")
        self.busy += 1
        if self.busy == 1:
            self.idle.clear()
        return next(self._ids)

    # ------------------------------------------------------------------ work

    async def call(self, kind: str, payload: Any) -> Any:
        """Send one call (``call``, ``seq`` or ``seq_end``) and wait for its result."""
        ident = self._begin()
        future: asyncio.Future[Any] = self._loop.create_future()
        self._calls[ident] = future
        self._conn.send((kind, ident, payload))
        try:
            return await future
        except asyncio.CancelledError:
            if ident in self._calls and not self._conn.closed:
                self._conn.send(("cancel", ident, None))
            raise

    async def stream(self, requests: AsyncIterator[InferenceRequest]) -> AsyncIterator[InferenceResponse]:
        """Run a stream in the worker: its requests are sent as they come, its responses yielded as
        they come back. Closing the iterator cancels the stream in the worker."""
        ident = self._begin()
        stream = _Stream()
        self._streams[ident] = stream
        self._conn.send(("open", ident, None))
        pump = asyncio.get_running_loop().create_task(self._pump(ident, stream, requests))
        taken = 0
        try:
            while True:
                kind, payload = await stream.inbox.get()
                if kind == "chunk":
                    taken += 1
                    if taken % ACK_EVERY == 0 and not self._conn.closed:
                        self._conn.send(("ack", ident, ACK_EVERY))
                    yield payload
                elif kind == "end" or kind == "gone":
                    return
                else:  # "err" from the worker, or the requests' own failure
                    raise payload
        finally:
            if self._streams.get(ident) is stream:
                self._streams[ident] = None  # its final message is still owed
                if not self._conn.closed:
                    self._conn.send(("cancel", ident, None))
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    async def _pump(self, ident: int, stream: _Stream, requests: AsyncIterator[InferenceRequest]) -> None:
        try:
            async for request in requests:
                await stream.credit.take()
                if self._conn.closed:
                    return
                self._conn.send(("item", ident, request))
                await self._conn.drain()
            if not self._conn.closed:
                self._conn.send(("close_in", ident, None))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            stream.inbox.put(("err", exc))
