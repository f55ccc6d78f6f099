"""A sequence's idle and lifetime timers (``runtime.sequences.timers``, part of the engine): idle time
counts only while nothing is queued or running, one timer per spell, and the endings they decide
become notices that the worker delivers."""

from __future__ import annotations

import asyncio

import pytest

from runtime.errors import SequenceError
from tests.sequences.engine_helpers import Running, Told, control, done, make, request, run

pytestmark = pytest.mark.anyio


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
