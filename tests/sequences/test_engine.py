"""The sequence lifecycle engine on its own: a small strategy and a store that is not the LRU plugged
into it, then the sequence batcher's strategy through the same engine."""

from __future__ import annotations

import pytest

from runtime.errors import Cancelled, Overloaded, SequenceError
from tests.sequences.engine_helpers import Running, Told, control, done, make, request, run

pytestmark = pytest.mark.anyio


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
