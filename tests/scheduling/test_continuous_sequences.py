"""Continuous batching with sequences, in process: a request joins while its sequence still streams."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runtime.errors import Cancelled, Overloaded, SequenceError
from runtime.scheduling import ContinuousScheduler
from runtime.settings import ModelSettings
from tests.conftest import InProcess
from tests.continuous_helpers import Client, extra, request, ticks, turns_until
from tests.continuous_models import SequenceTicker

pytestmark = pytest.mark.anyio


def settings(**fields: Any) -> ModelSettings:
    values: dict[str, Any] = {"max_batch_size": 4, **fields}
    return ModelSettings(
        name="seq",
        implementation="tests.continuous_models.SequenceTicker",
        continuous_batching=True,
        sequence_batching=True,
        **values,
    )


async def loaded(inprocess: InProcess, **fields: Any) -> tuple[SequenceTicker, ContinuousScheduler]:
    await inprocess.load(settings(**fields))
    entry = inprocess.registry.get("seq")
    assert isinstance(entry.model, SequenceTicker) and isinstance(entry.scheduler, ContinuousScheduler)
    return entry.model, entry.scheduler


def client(inprocess: InProcess, request_id: str, **parameters: Any) -> Client:
    return Client(inprocess.dataplane, request_id, model="seq", **parameters)


async def test_a_request_joins_while_an_earlier_one_of_its_sequence_streams(inprocess: InProcess) -> None:
    """Race: the second request of a sequence arrives during a step of the first one's stream. It
    must join the next step beside it (not wait for it to finish, as the sequence batcher would),
    and both must share the sequence's state, the earlier stream first."""
    model, scheduler = await loaded(inprocess)
    model.hold()
    first = client(inprocess, "first", sequence_id="s", sequence_start=True, length=6)
    await model.wait_stepping()
    update = client(inprocess, "update", sequence_id="s", length=1)
    await turns_until(lambda: scheduler.queued == 1)
    model.advance()
    await model.wait_stepping()
    assert model.batches[-1] == ["first", "update"]
    model.release()
    await update.finished()
    assert not first.done.is_set()  # the update was answered while the first one still streams
    await first.finished()
    assert model.joined_with == {"first": None, "update": ["first"]}
    assert {extra(c)["sequence_id"] for c in first.chunks + update.chunks} == {"s"}
    assert not any("sequence_end" in extra(c) for c in first.chunks + update.chunks)
    assert model.sequences_ended == []  # still open


async def test_the_sequence_ends_once_its_end_request_and_every_stream_of_it_have_finished(
    inprocess: InProcess,
) -> None:
    model, _ = await loaded(inprocess)
    model.hold()  # steps one at a time: "long" must still stream when "end" has finished
    long = client(inprocess, "long", sequence_id=7, sequence_start=True, length=8)
    await model.wait_stepping()
    model.advance()
    await turns_until(lambda: len(long.chunks) >= 1)
    end = client(inprocess, "end", sequence_id=7, sequence_end=True, length=1)
    while not end.done.is_set():  # "end" joins at the next step and takes one
        await model.wait_stepping()
        model.advance()
        await turns_until(lambda: end.done.is_set() or model.stepping.is_set())
    assert extra(end.chunks[-1])["sequence_end"] is True and extra(end.chunks[-1])["sequence_id"] == 7
    assert model.sequences_ended == [] and not long.done.is_set()
    model.release()
    refused = await client(inprocess, "late", sequence_id=7).finished()  # closed by the accepted END
    assert isinstance(refused.error, SequenceError) and "has ended (reason: end)" in str(refused.error)
    await long.finished()
    assert ticks(long.chunks) == list(range(1, 9))
    await model.told.wait()
    assert model.sequences_ended == [("7", "end", ["long", "end"])]


async def test_a_client_leaving_cancels_its_sequence(inprocess: InProcess) -> None:
    """Race: the client of one stream of a sequence goes away while another stream of it runs and a
    third waits. The sequence is cancelled: the running one ends with Cancelled (in band), the
    waiting one fails, the model is told once, and the id is refused afterwards."""
    model, scheduler = await loaded(inprocess, max_batch_size=2)
    model.hold()
    a = client(inprocess, "a", sequence_id="s", sequence_start=True, length=100)
    b = client(inprocess, "b", sequence_id="s", length=100)
    await model.wait_stepping()
    while model.batches[-1] != ["a", "b"]:
        model.advance()
        await model.wait_stepping()
    c = client(inprocess, "c", sequence_id="s", length=2)
    await turns_until(lambda: scheduler.queued == 1)
    a.task.cancel()
    await a.done.wait()
    for waiting in (b, c):
        await waiting.finished()
        assert isinstance(waiting.error, Cancelled) and "cancels the sequence" in str(waiting.error)
    model.release()
    await model.told.wait()
    assert [(key, reason) for key, reason, _ in model.sequences_ended] == [("s", "cancel")]
    assert {("a", "cancelled"), ("b", "cancelled")} <= set(model.ended)
    assert "c" not in model.started
    refused = await client(inprocess, "d", sequence_id="s").finished()
    assert isinstance(refused.error, SequenceError) and "cancelled" in str(refused.error)
    await turns_until(lambda: scheduler.running == 0)


async def test_a_start_on_an_open_id_waits_for_the_old_streams(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess)
    old = client(inprocess, "old", sequence_id="s", sequence_start=True, length=5)
    await turns_until(lambda: len(old.chunks) >= 1)
    fresh = await client(inprocess, "fresh", sequence_id="s", sequence_start=True, length=2).finished()
    assert old.done.is_set() and ticks(old.chunks) == [1, 2, 3, 4, 5]  # it ran to its end first
    assert ticks(fresh.chunks) == [1, 2] and model.joined_with["fresh"] is None  # a fresh state
    assert model.sequences_ended == [("s", "restart", ["old"])]


async def test_sequence_rules_apply_to_streams(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess, max_sequences=1, max_sequence_idle_ms=30)
    unknown = await client(inprocess, "u", sequence_id="nope").finished()
    assert isinstance(unknown.error, SequenceError) and "sequence_start=true" in str(unknown.error)
    one = await client(inprocess, "one", sequence_id="a", sequence_start=True, length=1).finished()
    assert one.error is None
    full = await client(inprocess, "full", sequence_id="b", sequence_start=True).finished()
    assert isinstance(full.error, Overloaded) and "max_sequences" in str(full.error)
    await model.told.wait()  # the idle timeout, counted once nothing of "a" runs or waits
    assert model.sequences_ended == [("a", "idle", ["one"])]
    plain = await client(inprocess, "plain", length=2).finished()  # a stream outside any sequence
    assert ticks(plain.chunks) == [1, 2] and "sequence_id" not in extra(plain.chunks[0])
    made = await client(inprocess, "made", sequence_start=True, sequence_end=True, length=1).finished()
    assert str(extra(made.chunks[0])["sequence_id"]).startswith("seq-")


async def test_unary_requests_of_a_sequence_and_unloading(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess)
    response = await inprocess.dataplane.infer(
        request("u1", sequence_id="s", sequence_start=True, length=2), "seq"
    )
    assert list(response.outputs[0].data) == [1, 2] and extra(response)["sequence_id"] == "s"
    stream = client(inprocess, "s2", sequence_id="s", length=3)
    await stream.finished()
    await inprocess.registry.unload("seq")
    assert model.sequences_ended == [("s", "unload", ["u1", "s2"])]


async def test_the_model_hears_of_every_stream_and_sequence_once(inprocess: InProcess) -> None:
    model, _ = await loaded(inprocess)
    streams = [
        client(inprocess, f"r{i}", sequence_id=f"s{i % 3}", sequence_start=i < 3, length=1 + i % 4)
        for i in range(9)
    ]
    await asyncio.gather(*(s.finished() for s in streams))
    assert all(s.error is None for s in streams)
    assert sorted(stream for stream, reason in model.ended if reason == "finished") == sorted(
        s.id for s in streams
    )
    ends = [client(inprocess, f"e{i}", sequence_id=f"s{i}", sequence_end=True, length=1) for i in range(3)]
    await asyncio.gather(*(e.finished() for e in ends))
    await turns_until(lambda: len(model.sequences_ended) == 3)
    assert sorted((key, reason) for key, reason, _ in model.sequences_ended) == [
        ("s0", "end"),
        ("s1", "end"),
        ("s2", "end"),
    ]


async def test_an_evicted_state_ends_its_sequence(inprocess: InProcess) -> None:
    """The state store holds one state: when b's streams leave and its state goes back, a's (idle)
    is evicted; a ends (the model is told) and its next request is refused, never started afresh."""
    model, _ = await loaded(inprocess, sequence_state_capacity=1)
    assert (
        await client(inprocess, "a1", sequence_id="a", sequence_start=True, length=1).finished()
    ).error is None
    assert (
        await client(inprocess, "b1", sequence_id="b", sequence_start=True, length=1).finished()
    ).error is None
    await model.told.wait()
    assert model.sequences_ended == [("a", "eviction", ["a1"])]
    late = await client(inprocess, "a2", sequence_id="a", length=1).finished()
    assert isinstance(late.error, SequenceError) and "evicted" in str(late.error)
    again = await client(inprocess, "b2", sequence_id="b", length=1).finished()  # b's state was kept
    assert again.error is None and model.joined_with["b2"] == ["b1"]
