"""The worker process: one copy of one model, serving what its server sends over a socket.

Started by the server as ``python -m runtime.server.worker FD`` with one end of a socket pair as file
descriptor FD. It loads the model from the settings it is sent, answers ``ready`` (or ``failed``
and exits 1), then serves calls, streams and sequence steps, each as a task of its own, so that a
stream or a slow call never holds up the others, and cancellation reaches the model's code.
A plain ``def predict`` runs on the model's own threads, as in the server process.

Sequence states live here: ``seq`` steps get the state the previous step of their sequence left,
and ``seq_end`` drops it (and calls the model's ``sequence_ended``). The server keeps only a
:class:`~runtime.workers.messages.HeldState` that says which worker holds it.

The worker exits when its server's end of the socket closes (the server died or gave it up), and
ignores SIGINT: the server decides when its workers stop (``stop``: unload, then exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from runtime.model import MLModel
from runtime.repository import import_model_class
from runtime.scheduling import make_scheduler
from runtime.scheduling.continuous_batching import ContinuousScheduler
from runtime.scheduling.executor import InProcessExecutor
from runtime.scheduling.scheduler import Scheduler, StreamError
from runtime.sequences.sequence_model import SequenceModel, SequenceStep
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from runtime.workers.connection import Connection
from runtime.workers.messages import ACK_EVERY, Credit, Inbox, portable

logger = logging.getLogger(__name__)

_END = object()


class Worker:
    """Serves one model over one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn = Connection(self._on_message, self._on_lost)
        self.model: MLModel | None = None
        self.settings: ModelSettings | None = None
        self.states: dict[str, Any] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.inboxes: dict[int, Inbox[Any]] = {}
        self.credits: dict[int, Credit] = {}
        self.executor: InProcessExecutor | None = None
        """Calls the model here as the server would in process (a plain ``predict`` on threads)."""
        self.scheduler: Scheduler | None = None
        """With continuous batching, the model's batcher runs here (the server forwards requests)."""
        self.done: asyncio.Future[int] | None = None
        self.idle_at_exit = False
        """The worker ends after a drain (or a failed load): no model code is running."""

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        await loop.connect_accepted_socket(lambda: self.conn, self.sock)
        code = await self.done
        self.conn.close()  # what is written goes out first
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.conn.gone.wait(), 5)
        return code

    # ------------------------------------------------------------------ messages

    def _on_lost(self) -> None:
        # the server is gone: nobody is left to answer
        if self.done is not None and not self.done.done():
            self.done.set_result(0)

    def _on_message(self, message: tuple[str, int, Any]) -> None:
        kind, ident, payload = message
        if kind == "call":  # most messages
            self._spawn(ident, self._call(ident, payload))
        elif kind == "item":
            self.inboxes[ident].put(payload)
        elif kind == "ack":
            credit = self.credits.get(ident)
            if credit is not None:
                credit.give(payload)
        elif kind == "close_in":
            self.inboxes[ident].put(_END)
        elif kind == "cancel":
            task = self.tasks.get(ident)
            if task is not None:
                task.cancel()
        elif kind == "open":
            self.inboxes[ident] = Inbox[Any]()
            self.credits[ident] = Credit()
            self._spawn(ident, self._stream(ident))
        elif kind == "seq":
            self._spawn(ident, self._sequences(ident, payload))
        elif kind == "seq_end":
            self._spawn(ident, self._sequence_ended(ident, *payload))
        elif kind == "stats":  # the executions of this worker's own batcher (continuous batching)
            scheduler = self.scheduler
            self._send(("ok", ident, scheduler.stats.snapshot() if scheduler is not None else None))
        elif kind == "init":
            self._spawn(0, self._init(*payload))
        elif kind == "stop":
            self._spawn(0, self._stop())

    def _spawn(self, ident: int, work: Any) -> None:
        task = self.conn.loop.create_task(work)
        if ident:
            self.tasks[ident] = task
            task.add_done_callback(lambda _: self._forget(ident, task))
        else:
            self.tasks[-id(task)] = task
            task.add_done_callback(lambda _: self.tasks.pop(-id(task), None))

    def _forget(self, ident: int, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # perhaps before it even began: its final message is still owed
            self._send(("gone", ident, None))
        self.tasks.pop(ident, None)
        self.inboxes.pop(ident, None)
        self.credits.pop(ident, None)

    def _send(self, message: tuple[str, int, Any], now: bool = False) -> None:
        if not self.conn.closed:
            self.conn.send(message, now)

    def _fail(self, ident: int, exc: BaseException) -> None:
        self._send(("err", ident, portable(exc)))

    # ------------------------------------------------------------------ lifecycle

    async def _init(self, path: list[str], blob: bytes, worker_id: int) -> None:
        for entry in reversed(path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        try:
            settings: ModelSettings = pickle.loads(blob)
            cls = import_model_class(settings)
            if not issubclass(cls, MLModel):
                raise TypeError(f"{cls.__qualname__} is not a subclass of runtime.MLModel")
            model = cls(settings)
            if await model.load() is False:
                raise RuntimeError("load() returned False")
            model.ready = True
        except Exception as exc:
            logger.exception("Worker %d of model failed to load", worker_id)
            self._send(("failed", 0, f"{type(exc).__name__}: {exc}"))
            self.idle_at_exit = True
            await self.conn.drain()
            assert self.done is not None
            self.done.set_result(1)
            return
        self.model, self.settings = model, settings
        self.executor = InProcessExecutor(model, settings)
        if settings.continuous_batching:
            # the worker runs the model's continuous batcher; the server sends it whole requests
            self.scheduler = make_scheduler(model, settings.model_copy(update={"workers": 0}))
            scheduler = self.scheduler
            if isinstance(scheduler, ContinuousScheduler) and scheduler.sequences is not None:
                # its batcher ends sequences by itself (idle, lifetime): the server hears of each
                scheduler.sequences.engine.on_end.append(self._sequence_gone)
            await self.scheduler.start()
        self._send(("ready", 0, os.getpid()))

    def _sequence_gone(self, key: str, reason: str) -> None:
        """A sequence ended here (whatever ended it): the server forgets that this worker holds it,
        and counts why it ended."""
        self._send(("ended", 0, (key, reason)))

    async def _stop(self) -> None:
        others = [t for t in self.tasks.values() if t is not asyncio.current_task()]
        await asyncio.gather(*others, return_exceptions=True)
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.model is not None:
            self.model.ready = False
            try:
                await self.model.unload()
            except Exception:
                logger.exception("Model %r failed to unload in its worker", self.model.name)
        if self.executor is not None:
            self.executor.close()
        self._send(("stopped", 0, None))
        self.idle_at_exit = True
        await self.conn.drain()
        assert self.done is not None
        if not self.done.done():
            self.done.set_result(0)

    # ------------------------------------------------------------------ calling the model

    def _open(
        self, requests: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse | StreamError]:
        if self.scheduler is not None:
            return self.scheduler.stream(requests)
        assert self.executor is not None
        return self.executor.open_stream(requests)

    async def _call(self, ident: int, request: InferenceRequest) -> None:
        try:
            if self.scheduler is not None:
                response = await self.scheduler.infer(request)
            else:
                assert self.executor is not None
                response = await self.executor.call_predict(request)
        except Exception as exc:
            self._fail(ident, exc)
            return
        self._send(("ok", ident, response))

    async def _requests(self, ident: int, inbox: Inbox[Any]) -> AsyncIterator[InferenceRequest]:
        taken = 0
        while True:
            item = await inbox.get()
            if item is _END:
                return
            taken += 1
            if taken % ACK_EVERY == 0:
                self._send(("ack", ident, ACK_EVERY))
            yield item

    async def _stream(self, ident: int) -> None:
        inbox, credit = self.inboxes[ident], self.credits[ident]
        try:
            async with aclosing(self._open(self._requests(ident, inbox))) as responses:  # type: ignore[type-var]
                async for response in responses:
                    await credit.take()
                    if isinstance(response, StreamError):  # one request of the stream failed
                        response.error = portable(response.error)  # type: ignore[assignment]
                    self._send(("chunk", ident, response), now=True)  # as it comes
        except Exception as exc:
            self._fail(ident, exc)
            return
        self._send(("end", ident, None))

    async def _sequences(self, ident: int, items: list[tuple[str, bool, bool, InferenceRequest]]) -> None:
        model = self.model
        assert isinstance(model, SequenceModel)
        states = self.states
        steps = [
            SequenceStep(request, key, start, end, None if start else states.get(key))
            for key, start, end, request in items
        ]
        try:
            results = list(await model.predict_sequences(steps))
            if len(results) != len(steps):
                raise RuntimeError(
                    f"predict_sequences returned {len(results)} results for {len(steps)} steps"
                )
        except Exception as exc:
            self._fail(ident, exc)
            return
        answers: list[tuple[Any, bool]] = []
        for step, result in zip(steps, results, strict=True):
            if isinstance(result, BaseException):
                answers.append((portable(result), False))
            else:
                states[step.sequence_id] = step.state
                answers.append((result, step.ends))
        self._send(("ok", ident, answers))

    async def _sequence_ended(self, ident: int, key: str, reason: Any) -> None:
        model = self.model
        assert isinstance(model, SequenceModel)
        state = self.states.pop(key, None)
        try:
            await model.sequence_ended(key, reason, state)
        except Exception as exc:
            self._fail(ident, exc)
            return
        self._send(("ok", ident, None))


def _batch_scheduling() -> None:
    """Ask Linux to treat this process as batch work (``SCHED_BATCH``): it still gets its share
    of the CPU, but waking it (a request arriving) does not preempt the server's event loop,
    which would otherwise lose its CPU at every message it writes on a busy machine."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this process when the server dies, even if a model keeps
    the event loop from noticing that the socket closed (``PR_SET_PDEATHSIG``)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl: the socket still ends it
        pass
    if os.getppid() == 1:  # the server died before the call above took effect
        os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    _batch_scheduling()
    logging.basicConfig(
        level=os.environ.get("MLSERVER_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s [worker {os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    sock = socket.socket(fileno=int(args[0]))
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency where it exists
        runner = asyncio.run
    worker = Worker(sock)
    code: int = runner(worker.run())
    if worker.idle_at_exit:  # a drain or a failed load: nothing runs, exit as usual
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the server is gone: threads still inside a model's code must not hold the exit up


if __name__ == "__main__":
    sys.exit(main())
