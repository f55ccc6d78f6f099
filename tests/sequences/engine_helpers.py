"""What the tests of the sequence engine's parts share: a small strategy, a store that is not the
LRU, the model's ``sequence_ended`` recorded, and a request run the way a continuous strategy runs it."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Any

from runtime.sequences.engine import SequenceEngine
from runtime.sequences.identity import SequenceControl
from runtime.sequences.lifecycle import Pending, Sequence
from runtime.sequences.store import StateStore
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest


class DictStore(StateStore):
    """A store that is not the LRU: oldest-written first out, eviction reported by ``save``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.states: OrderedDict[str, Any] = OrderedDict()

    async def load(self, keys: Seq[str]) -> list[Any]:
        return [self.states.get(key) for key in keys]

    async def save(self, items: Seq[tuple[str, Any]]) -> list[tuple[str, Any]]:
        evicted = []
        for key, state in items:
            self.states[key] = state
            while len(self.states) > self.capacity:
                evicted.append(self.states.popitem(last=False))
        return evicted

    async def pop(self, key: str) -> Any:
        return self.states.pop(key, None)

    async def clear(self) -> list[tuple[str, Any]]:
        items = list(self.states.items())
        self.states.clear()
        return items

    def __len__(self) -> int:
        return len(self.states)


class Running:
    """A strategy that runs whatever the test says runs, holding states in memory while it does."""

    def __init__(self) -> None:
        self.running: dict[Sequence, Any] = {}
        self.readied: list[str] = []
        self.woken = asyncio.Event()

    def busy(self, seq: Sequence) -> bool:
        return seq in self.running

    def ready(self, seq: Sequence) -> None:
        self.readied.append(seq.key)

    def wake(self) -> None:
        self.woken.set()

    def detach(self, seq: Sequence) -> tuple[bool, Any]:
        if seq in self.running:
            return True, self.running.pop(seq)
        return False, None


class Told:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def __call__(self, key: str, reason: str, state: Any) -> None:
        self.calls.append((key, reason, state))


def make(strategy: Any, told: Told, capacity: int = 10, **limits: Any) -> SequenceEngine:
    settings: dict[str, Any] = {
        "max_sequences": 3,
        "max_sequence_queue_size": 2,
        "sequence_ended_memory": 2,
        "max_sequence_idle_ms": 0,
        **limits,
    }
    return SequenceEngine(ModelSettings(name="m", **settings), told, strategy, DictStore(capacity))


def control(key: str, start: bool = False, end: bool = False, step: int | None = None) -> SequenceControl:
    return SequenceControl(key=key, echo=key, start=start, end=end, step=step)


def request() -> InferenceRequest:
    return InferenceRequest(inputs=[])


async def run(engine: SequenceEngine, strategy: Running, pending: Pending, state: Any = None) -> None:
    """Run ``pending`` as a continuous strategy would: the state leaves the store while it runs."""
    engine.withdraw(pending)
    await engine.opening(pending)
    held = state if pending.control.start else await engine.store.pop(pending.sequence.key)
    strategy.running[pending.sequence] = held
    pending.sequence.live = True
    pending.sequence.running = pending
    pending.running = True


async def done(engine: SequenceEngine, strategy: Running, pending: Pending, state: Any) -> None:
    seq = pending.sequence
    del strategy.running[seq]
    seq.running = None
    pending.running = False
    await engine.finished(seq, ended=pending.control.end, state=state, keep=True)
