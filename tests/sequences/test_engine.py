"""The sequence lifecycle engine on its own: a small strategy and a store that is not the LRU plugged
into it, then the sequence batcher's strategy through the same engine."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Any

import pytest

from runtime.errors import Cancelled, Overloaded, SequenceError
from runtime.sequences.engine import SequenceEngine
from runtime.sequences.identity import SequenceControl
from runtime.sequences.lifecycle import Pending, Sequence
from runtime.sequences.store import StateStore
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest

pytestmark = pytest.mark.anyio


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


def control(key: str, start: bool = False, end: bool = False) -> SequenceControl:
    return SequenceControl(key=key, echo=key, start=start, end=end)


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


async def test_admission_refusals_name_their_reason_and_are_counted() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told, max_sequences=1, max_sequence_queue_size=1)
    with pytest.raises(SequenceError, match="is not open"):
        engine.admit(request(), control("a"))
    first = engine.admit(request(), control("a", start=True))
    assert strategy.readied == ["a"] and engine.get("a") is first.sequence
    with pytest.raises(Overloaded, match="max_sequences"):
        engine.admit(request(), control("b", start=True))
    with pytest.raises(Overloaded, match="max_sequence_queue_size=1"):
        engine.admit(request(), control("a"))
    await run(engine, strategy, first)
    engine.admit(request(), control("a", end=True))
    with pytest.raises(SequenceError, match=r"has ended \(reason: end\)"):
        engine.admit(request(), control("a"))  # closed by the accepted END
    assert engine.stats()["rejected"] == {"capacity": 1, "queue_full": 1, "not_open": 1, "ended": 1}
    assert engine.stats()["open_sequences"] == 1 and engine.stats()["queued_requests"] == 1


async def test_a_start_on_an_open_id_restarts_it_and_the_model_is_told_with_the_old_state() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told)
    first = engine.admit(request(), control("a", start=True))
    await run(engine, strategy, first)
    await done(engine, strategy, first, ["one"])
    assert await engine.store.load(["a"]) == [["one"]]
    again = engine.admit(request(), control("a", start=True))
    assert again.replaces == "restart"
    await run(engine, strategy, again, state=[])
    assert told.calls == [("a", "restart", ["one"])]
    assert engine.stats()["ended"]["restart"] == 1 and len(engine.store) == 0


async def test_an_end_is_told_with_the_final_state_and_remembered_in_bounded_memory() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told, sequence_ended_memory=2)
    for key in ("a", "b", "c"):
        pending = engine.admit(request(), control(key, start=True, end=True))
        await run(engine, strategy, pending)
        await done(engine, strategy, pending, f"last of {key}")
    assert told.calls == [(k, "end", f"last of {k}") for k in ("a", "b", "c")]
    assert list(engine.table.ended) == ["b", "c"]  # "a" is forgotten: the memory holds two
    with pytest.raises(SequenceError, match="is not open"):
        engine.admit(request(), control("a"))
    with pytest.raises(SequenceError, match=r"reason: end"):
        engine.admit(request(), control("b"))


async def test_eviction_from_the_store_ends_the_evicted_sequence() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told, capacity=1)
    a = engine.admit(request(), control("a", start=True))
    await run(engine, strategy, a)
    await done(engine, strategy, a, "state of a")
    b = engine.admit(request(), control("b", start=True))
    await run(engine, strategy, b)
    await done(engine, strategy, b, "state of b")  # the store holds one: a's state goes
    assert told.calls == [("a", "eviction", "state of a")]
    assert engine.get("a") is None and engine.table.ended["a"] == "eviction"
    with pytest.raises(SequenceError, match="evicted"):
        engine.admit(request(), control("a"))
    assert engine.stats()["states_held"] == 1


async def test_idle_time_counts_from_the_last_step_with_one_timer_per_spell_of_the_first() -> None:
    """A step stops the idle time and the next one starts it again without a timer of its own: the
    timer armed for the first spell, when it fires, arms itself again for what is left of the last."""
    told, strategy = Told(), Running()
    engine = make(strategy, told, max_sequence_idle_ms=150)
    a = engine.admit(request(), control("a", start=True))
    await run(engine, strategy, a)
    await done(engine, strategy, a, "one")
    first = a.sequence.idle_timer
    assert first is not None and a.sequence.idle_since is not None
    await asyncio.sleep(0.1)
    b = engine.admit(request(), control("a"))
    assert a.sequence.idle_since is None  # queued: not idle
    await run(engine, strategy, b)
    await done(engine, strategy, b, "two")
    assert a.sequence.idle_timer is first  # the same timer, for the first spell's end
    await asyncio.sleep(0.1)  # 200 ms after the first step, 100 ms after the last
    assert engine.notices == 0 and engine.get("a") is a.sequence
    assert a.sequence.idle_timer is not None and a.sequence.idle_timer is not first  # armed again
    await asyncio.wait_for(strategy.woken.wait(), 2)
    assert engine.notices == 1 and engine.get("a") is None
    await engine.deliver_notices()
    assert told.calls == [("a", "idle", "two")]


async def test_an_idle_timer_that_fires_while_the_sequence_runs_ends_nothing() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told, max_sequence_idle_ms=20)
    a = engine.admit(request(), control("a", start=True))
    await run(engine, strategy, a)
    await done(engine, strategy, a, "one")
    b = engine.admit(request(), control("a"))
    await run(engine, strategy, b)
    await asyncio.sleep(0.08)  # the first spell's timer fired meanwhile
    assert a.sequence.idle_timer is None and engine.notices == 0 and engine.get("a") is a.sequence
    await done(engine, strategy, b, "two")
    assert a.sequence.idle_timer is not None  # a fresh spell, a fresh timer
    await asyncio.wait_for(strategy.woken.wait(), 2)
    await engine.deliver_notices()
    assert told.calls == [("a", "idle", "two")]


async def test_idle_and_lifetime_timeouts_become_notices_the_worker_delivers() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told, max_sequence_idle_ms=1)
    a = engine.admit(request(), control("a", start=True))
    await run(engine, strategy, a)
    await done(engine, strategy, a, "a's")
    await strategy.woken.wait()  # the idle timer fired and left a notice
    assert engine.notices == 1 and told.calls == []
    await engine.deliver_notices()
    assert told.calls == [("a", "idle", "a's")] and engine.notices == 0

    strategy.woken.clear()
    engine = make(strategy, told, sequence_timeout_ms=1)
    b = engine.admit(request(), control("b", start=True))
    await run(engine, strategy, b)
    queued = engine.admit(request(), control("b"))
    timer = b.sequence.life_timer
    assert timer is not None
    passed = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_at(timer.when() + 0.001, passed.set_result, None)
    await passed  # the lifetime ended while b runs: the accepted requests finish
    assert b.sequence.pending_end == "timeout"
    with pytest.raises(SequenceError, match=r"reason: timeout"):
        engine.admit(request(), control("b"))
    await done(engine, strategy, b, "b's")
    assert strategy.readied[-1] == "b" and not queued.future.done()  # the accepted request runs
    await run(engine, strategy, queued)
    await done(engine, strategy, queued, "b's last")
    assert told.calls[-1] == ("b", "timeout", "b's last")


async def test_a_cancel_fails_what_waits_and_ends_the_sequence_once_nothing_runs() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told)
    a = engine.admit(request(), control("a", start=True))
    await run(engine, strategy, a)
    waiting = engine.admit(request(), control("a"))
    assert engine.cancel(a) is True  # it runs: the strategy ends what runs
    assert engine.cancel(a) is False  # once
    with pytest.raises(Cancelled):
        waiting.future.result()
    await done(engine, strategy, a, "a's")
    assert told.calls == [("a", "cancel", "a's")]

    b = engine.admit(request(), control("b", start=True))  # cancelled before it ran
    assert engine.cancel(b) is False and engine.table.ended["b"] == "cancel"
    assert told.calls == [("a", "cancel", "a's")]  # the model never saw b


async def test_stop_tells_every_live_sequence_unload_with_the_state_wherever_it_is() -> None:
    told, strategy = Told(), Running()
    engine = make(strategy, told)
    a = engine.admit(request(), control("a", start=True))
    await run(engine, strategy, a)
    await done(engine, strategy, a, "stored")
    b = engine.admit(request(), control("b", start=True))
    await run(engine, strategy, b, state="held")
    c = engine.admit(request(), control("c", start=True))  # never ran: the model does not know it
    await engine.stop()
    with pytest.raises(SequenceError, match=r"reason: unload"):
        c.future.result()
    assert sorted(told.calls) == [("a", "unload", "stored"), ("b", "unload", "held")]
    assert engine.stats()["open_sequences"] == 0 and len(engine.store) == 0
