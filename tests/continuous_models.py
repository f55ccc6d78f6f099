"""Models for the continuous batching tests: an instrumented ticker whose steps a test can hold."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime import ContinuousModel, StepResult, Stream
from runtime.continuous import StreamEnd
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


def _param(request: InferenceRequest, key: str, default: int = 0) -> int:
    extra = request.parameters.model_extra if request.parameters else None
    return int((extra or {}).get(key, default))


@dataclass
class Ticks:
    length: int
    fail_at: int
    raise_at: int
    delay: float
    base: int


class Ticker(ContinuousModel):
    """Streams ``length`` chunks; chunk ``i`` (from 1) holds ``base + i`` in output ``tick``.

    Request parameters: ``length`` (default 3), ``fail_at`` (the stream fails with StepResult(error)
    at that chunk), ``raise_at`` (the whole ``step`` raises while this stream is at that chunk),
    ``refuse`` (start_stream raises InvalidInput), ``slow_start`` (start_stream sets ``starting`` and
    waits for ``start_gate``), ``delay_ms`` (each step sleeps that long: the cost
    of a step, for tests over a real server). Input ``base`` (INT64, optional) offsets the values.

    It records every step's stream ids (``batches``) and every ``end_stream`` (``ended``). A test
    in the same process can hold the steps: after ``hold()``, each step waits for one ``advance()``
    and ``stepping`` is set while a step waits.
    """

    async def load(self) -> bool:
        self.batches: list[list[str]] = []
        self.ended: list[tuple[str, StreamEnd]] = []
        self.started: list[str] = []
        self._tickets: asyncio.Semaphore | None = None
        self.stepping = asyncio.Event()
        self.starting = asyncio.Event()
        self.start_gate = asyncio.Event()
        return True

    # ------------------------------------------------------------------ test controls

    def hold(self) -> None:
        self._tickets = asyncio.Semaphore(0)

    def advance(self, steps: int = 1) -> None:
        assert self._tickets is not None
        for _ in range(steps):
            self._tickets.release()

    def release(self) -> None:
        """Stop holding steps."""
        tickets, self._tickets = self._tickets, None
        if tickets is not None:
            for _ in range(1000):
                tickets.release()

    async def wait_stepping(self) -> None:
        """Until a held step is waiting (then clears the flag for the next one)."""
        await self.stepping.wait()
        self.stepping.clear()

    # ------------------------------------------------------------------ the model

    async def start_stream(self, stream: Stream) -> None:
        request = stream.request
        if _param(request, "refuse"):
            raise InvalidInput("refused as asked")
        if _param(request, "slow_start"):
            self.starting.set()
            await self.start_gate.wait()
        base = next((inp for inp in request.inputs if inp.name == "base"), None)
        stream.state = Ticks(
            length=_param(request, "length", 3),
            fail_at=_param(request, "fail_at"),
            raise_at=_param(request, "raise_at"),
            delay=_param(request, "delay_ms") / 1000,
            base=int(np.asarray(base.data).reshape(-1)[0]) if base is not None else 0,
        )
        self.started.append(stream.id)

    async def step(self, streams: list[Stream]) -> list[StepResult]:  # type: ignore[override]  # async, as the base allows
        self.batches.append([s.id for s in streams])
        if self._tickets is not None:
            self.stepping.set()
            await self._tickets.acquire()
        delay = max(s.state.delay for s in streams)
        if delay:
            await asyncio.to_thread(time.sleep, delay)  # the cost of a step, off the event loop
        for s in streams:
            if s.state.raise_at == s.steps + 1:
                raise RuntimeError(f"step broke on {s.id}")
        results = []
        for s in streams:
            tick = s.steps + 1
            if s.state.fail_at == tick:
                results.append(StepResult(error=RuntimeError(f"stream {s.id} failed at {tick}")))
                continue
            results.append(StepResult(self._chunk(s.state.base + tick), finished=tick >= s.state.length))
        return results

    async def end_stream(self, stream: Stream, reason: StreamEnd) -> None:
        self.ended.append((stream.id, reason))

    def _chunk(self, value: int) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name="tick", shape=[1], datatype="INT64", data=np.array([value]))],
        )


class SyncTicker(ContinuousModel):
    """A ``def step`` (run on the scheduler's step thread): ``length`` chunks counting from 1."""

    async def start_stream(self, stream: Stream) -> None:
        stream.state = _param(stream.request, "length", 3)

    def step(self, streams: list[Stream]) -> list[StepResult]:
        import threading

        thread = threading.current_thread().name
        return [
            StepResult(
                InferenceResponse(
                    model_name=self.name,
                    outputs=[
                        ResponseOutput(
                            name="tick", shape=[1], datatype="INT64", data=np.array([s.steps + 1])
                        ),
                        ResponseOutput(name="thread", shape=[1], datatype="BYTES", data=[thread.encode()]),
                    ],
                ),
                finished=s.steps + 1 >= s.state,
            )
            for s in streams
        ]


class SequenceTicker(Ticker):
    """The ticker with sequences: each stream adds its id to its sequence's state (a list) in its first
    step, and its chunks carry that list's length in output ``seen``. Records every ``sequence_ended``
    (``sequences_ended``) and sets ``told`` after each."""

    async def load(self) -> bool:
        await super().load()
        self.sequences_ended: list[tuple[str, str, Any]] = []
        self.told = asyncio.Event()
        self.joined_with: dict[str, Any] = {}
        return True

    async def step(self, streams: list[Stream]) -> list[StepResult]:  # type: ignore[override]  # async, as the base allows
        for s in streams:
            if s.sequence is not None and s.steps == 0:
                self.joined_with[s.id] = None if s.sequence.state is None else list(s.sequence.state)
                s.sequence.state = [*(s.sequence.state or []), s.id]
        return await super().step(streams)

    async def sequence_ended(self, sequence_id: str, reason: str, state: Any) -> None:
        self.sequences_ended.append((sequence_id, reason, state))
        self.told.set()
