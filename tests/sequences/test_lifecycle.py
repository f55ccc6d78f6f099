"""The sequence lifecycle over REST (in process): start, end, restart, idle, timeout, cancel, eviction,
unload, capacity and queue bounds, and the end hook's reason every time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from tests.conftest import InProcess
from tests.models.seqzoo import StatelessToo
from tests.sequencing import body, history, scheduler, serve, step, total, until

pytestmark = pytest.mark.anyio


async def test_a_sequence_keeps_its_sum_and_ends_with_end(inprocess: InProcess) -> None:
    model = await serve(inprocess)
    async with inprocess.client() as client:
        first = await step(client, 5, sequence_id=42, sequence_start=True)
        assert total(first) == 5
        assert first.json()["parameters"] == {"sequence_id": 42}
        assert first.headers["ts_request_sequence_id"] == "42"
        assert total(await step(client, 3, sequence_id="42")) == 8  # 42 and "42" are one sequence
        last = await step(client, 2, sequence_id=42, sequence_end=True)
        assert total(last) == 10
        assert last.json()["parameters"] == {"sequence_id": 42, "sequence_end": True}
        assert last.headers["ts_request_sequence_end"] == "true"
        assert await model.ending("42") == ("end", (10, (5, 3, 2)))
        late = await step(client, 1, sequence_id=42)
        assert late.status_code == 400 and "reason: end" in late.json()["error"]


async def test_start_and_end_on_one_request_and_server_made_ids(inprocess: InProcess) -> None:
    model = await serve(inprocess)
    async with inprocess.client() as client:
        once = await step(client, 4, sequence_id="one", sequence_start=True, sequence_end=True)
        assert total(once) == 4 and once.json()["parameters"]["sequence_end"] is True
        assert await model.ending("one") == ("end", (4, (4,)))
        made = await step(client, 1, sequence_start=True)
        made_id = made.json()["parameters"]["sequence_id"]
        assert made_id.startswith("seq-") and made.headers["ts_request_sequence_id"] == made_id
        assert total(await step(client, 1, sequence_id=made_id)) == 2


async def test_unknown_ids_and_stateless_requests_are_refused_with_a_reason(inprocess: InProcess) -> None:
    await serve(inprocess)
    async with inprocess.client() as client:
        unknown = await step(client, 1, sequence_id="nobody")
        assert unknown.status_code == 400 and "sequence_start=true" in unknown.json()["error"]
        stateless = await step(client, 1)
        assert stateless.status_code == 400 and "serves only sequences" in stateless.json()["error"]
        bad = await step(client, 1, sequence_id="x" * 129, sequence_start=True)
        assert bad.status_code == 400 and "128 bytes" in bad.json()["error"]
        assert (await client.get("/v2/health/ready")).status_code == 200


async def test_a_model_with_predict_also_serves_stateless_requests(inprocess: InProcess) -> None:
    await serve(inprocess, cls=StatelessToo, max_batch_size=4, max_batch_time=0.001)
    async with inprocess.client() as client:
        answer = await step(client, 7)
        assert total(answer) == 7 and answer.json()["parameters"]["batch_size"] == 1  # adaptive batching
        meta = (await client.get("/v2/models/seq")).json()["parameters"]
        assert meta["scheduler"] == "sequence" and meta["stateless_requests"]["scheduler"] == "adaptive"
        assert total(await step(client, 7, sequence_start=True, sequence_id=1)) == 7
        assert total(await step(client, 1, sequence_id=1)) == 8


async def test_torchserve_headers_in_any_case_mean_the_parameters(inprocess: InProcess) -> None:
    model = await serve(inprocess)
    async with inprocess.client() as client:
        start = await step(
            client, 2, headers={"TS_Request_Sequence_Id": "ts-1", "ts_request_sequence_start": "true"}
        )
        assert total(start) == 2 and start.json()["parameters"]["sequence_id"] == "ts-1"
        end = await step(
            client, 3, headers={"ts_request_sequence_id": "ts-1", "TS_REQUEST_SEQUENCE_END": "1"}
        )
        assert total(end) == 5 and end.headers["ts_request_sequence_end"] == "true"
        assert await model.ending("ts-1") == ("end", (5, (2, 3)))
        clash = await step(client, 1, headers={"ts_request_sequence_id": "b"}, sequence_id="a")
        assert clash.status_code == 400 and "headers say" in clash.json()["error"]


async def test_the_model_can_end_a_sequence_itself(inprocess: InProcess) -> None:
    """TorchServe's counter: an input of 0 ends the sequence; the response says so."""
    model = await serve(inprocess)
    async with inprocess.client() as client:
        await step(client, 3, sequence_id="z", sequence_start=True)
        zero = await step(client, 0, sequence_id="z")
        assert total(zero) == 3 and zero.json()["parameters"] == {"sequence_id": "z", "sequence_end": True}
        assert await model.ending("z") == ("end", (3, (3, 0)))
        assert "reason: end" in (await step(client, 1, sequence_id="z")).json()["error"]


async def test_restart_ends_the_old_sequence_after_its_queued_requests(inprocess: InProcess) -> None:
    """Race: a START for an open id arrives while that sequence has a request running and one queued;
    the queued one must still see the old state, and the model must hear of the old sequence's end
    (reason restart) before it sees the fresh START."""
    model = await serve(inprocess)
    async with inprocess.client() as client:
        await step(client, 10, sequence_id="r", sequence_start=True)
        model.gate.clear()
        held = asyncio.create_task(step(client, 1, sequence_id="r", hold=True))
        await model.holding.wait()
        queued = asyncio.create_task(step(client, 2, sequence_id="r"))
        await until(lambda: scheduler(inprocess).sequences.queued == 1)
        fresh = asyncio.create_task(step(client, 100, sequence_id="r", sequence_start=True))
        await until(lambda: scheduler(inprocess).sequences.queued == 2)
        model.gate.set()
        assert total(await held) == 11 and total(await queued) == 13
        assert total(await fresh) == 100
        assert model.endings == [("r", "restart", (13, (10, 1, 2)))]
        assert total(await step(client, 1, sequence_id="r")) == 101


async def test_capacity_gives_503_on_start_and_frees_on_end(inprocess: InProcess) -> None:
    await serve(inprocess, max_sequences=2)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="a", sequence_start=True)
        await step(client, 1, sequence_id="b", sequence_start=True)
        full = await step(client, 1, sequence_id="c", sequence_start=True)
        assert full.status_code == 503 and "max_sequences" in full.json()["error"]
        await step(client, 1, sequence_id="a", sequence_end=True)
        assert total(await step(client, 1, sequence_id="c", sequence_start=True)) == 1
        stats = (await client.get("/v2/models/seq")).json()["parameters"]["stats"]
        assert stats["rejected"]["capacity"] == 1 and stats["open_sequences"] == 2


async def test_the_per_sequence_queue_is_bounded(inprocess: InProcess) -> None:
    model = await serve(inprocess, max_sequence_queue_size=2)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="q", sequence_start=True)
        model.gate.clear()
        held = asyncio.create_task(step(client, 1, sequence_id="q", hold=True))
        await model.holding.wait()
        waiting = [asyncio.create_task(step(client, 1, sequence_id="q")) for _ in range(2)]
        await until(lambda: scheduler(inprocess).sequences.queued == 2)
        over = await step(client, 1, sequence_id="q")
        assert over.status_code == 503 and "max_sequence_queue_size=2" in over.json()["error"]
        model.gate.set()
        assert [total(r) for r in await asyncio.gather(held, *waiting)] == [2, 3, 4]


async def test_idle_sequences_end_and_say_so(inprocess: InProcess) -> None:
    model = await serve(inprocess, max_sequence_idle_ms=200)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="i", sequence_start=True)
        assert await model.ending("i") == ("idle", (1, (1,)))
        late = await step(client, 1, sequence_id="i")
        assert late.status_code == 400 and "reason: idle" in late.json()["error"]
        assert (await step(client, 1, sequence_id="i", sequence_start=True)).status_code == 200


async def test_idle_time_does_not_count_while_a_request_runs_or_waits(inprocess: InProcess) -> None:
    """Race: a step that runs longer than max_sequence_idle_ms, with another queued behind it, must
    not let the idle timer end the sequence under them."""
    model = await serve(inprocess, max_sequence_idle_ms=150)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="busy", sequence_start=True)
        model.gate.clear()
        held = asyncio.create_task(step(client, 1, sequence_id="busy", hold=True))
        await model.holding.wait()
        queued = asyncio.create_task(step(client, 1, sequence_id="busy"))
        await asyncio.sleep(0.6)  # four idle periods pass while the sequence is busy
        assert model.endings == []
        model.gate.set()
        assert [total(r) for r in await asyncio.gather(held, queued)] == [2, 3]
        assert total(await step(client, 1, sequence_id="busy")) == 4


async def test_lifetime_timeout_lets_accepted_requests_finish(inprocess: InProcess) -> None:
    model = await serve(inprocess, sequence_timeout_ms=300)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="t", sequence_start=True)
        model.gate.clear()
        held = asyncio.create_task(step(client, 1, sequence_id="t", hold=True))
        await model.holding.wait()
        queued = asyncio.create_task(step(client, 1, sequence_id="t"))
        await until(lambda: scheduler(inprocess).sequences.queued == 1)
        await asyncio.sleep(0.5)  # the lifetime passes while two requests are accepted
        late = await step(client, 1, sequence_id="t")
        assert late.status_code == 400 and "reason: timeout" in late.json()["error"]
        model.gate.set()
        assert [total(r) for r in await asyncio.gather(held, queued)] == [2, 3]
        assert await model.ending("t") == ("timeout", (3, (1, 1, 1)))


async def test_cancelling_a_queued_request_cancels_the_sequence(inprocess: InProcess) -> None:
    """Race: the caller of a queued request goes away while an earlier request of the same sequence
    runs; the queued request must never reach the model, later ones are refused, and the model hears
    'cancel' only after the running step is done."""
    model = await serve(inprocess)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="c", sequence_start=True)
        model.gate.clear()
        held = asyncio.create_task(step(client, 1, sequence_id="c", hold=True))
        await model.holding.wait()
        doomed = asyncio.create_task(step(client, 50, sequence_id="c"))
        await until(lambda: scheduler(inprocess).sequences.queued == 1)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        refused = await step(client, 1, sequence_id="c")
        assert refused.status_code == 400 and "reason: cancel" in refused.json()["error"]
        assert model.endings == []
        model.gate.set()
        assert total(await held) == 2
        assert await model.ending("c") == ("cancel", (2, (1, 1)))
        assert total(await step(client, 5, sequence_id="c", sequence_start=True)) == 5


async def test_eviction_ends_the_sequence_visibly(inprocess: InProcess) -> None:
    model = await serve(inprocess, max_sequences=4, sequence_state_capacity=2)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="old", sequence_start=True)
        await step(client, 2, sequence_id="mid", sequence_start=True)
        await step(client, 3, sequence_id="new", sequence_start=True)  # no room for three states
        assert await model.ending("old") == ("eviction", (1, (1,)))
        gone = await step(client, 1, sequence_id="old")
        assert gone.status_code == 400 and "reason: eviction" in gone.json()["error"]
        assert total(await step(client, 1, sequence_id="mid")) == 3


async def test_unload_tells_the_model_about_every_open_sequence(inprocess: InProcess) -> None:
    model = await serve(inprocess)
    async with inprocess.client() as client:
        for key in ("u1", "u2"):
            await step(client, 1, sequence_id=key, sequence_start=True)
    await inprocess.registry.unload("seq")
    assert sorted(model.endings) == [("u1", "unload", (1, (1,))), ("u2", "unload", (1, (1,)))]


async def test_model_failures_fail_requests_but_keep_the_sequence(inprocess: InProcess) -> None:
    model = await serve(inprocess, max_batch_size=4)
    async with inprocess.client() as client:
        await step(client, 1, sequence_id="f", sequence_start=True)
        broken = await step(client, 5, sequence_id="f", fail="batch")
        assert broken.status_code == 500 and "the batch broke" in broken.json()["error"]
        refused = await step(client, 5, sequence_id="f", fail="step")
        assert refused.status_code == 400 and "refused" in refused.json()["error"]
        assert history(await step(client, 2, sequence_id="f")) == [1, 2]
        assert model.endings == []


async def test_metadata_shows_every_sequence_setting_and_the_extension(inprocess: InProcess) -> None:
    await serve(inprocess, max_batch_size=8, max_batch_time=0.01, max_sequence_idle_ms=5000)
    async with inprocess.client() as client:
        assert "sequence" in (await client.get("/v2")).json()["extensions"]
        await client.post("/v2/models/seq/infer", json=body(1, sequence_id=1, sequence_start=True))
        scheduling = (await client.get("/v2/models/seq")).json()["parameters"]
        config = (await client.get("/v2/models/seq/config")).json()
    assert scheduling["scheduler"] == "sequence"
    batching = config["sequence_batching"]  # what perf_analyzer looks for before sending sequences
    assert batching["max_sequence_idle_microseconds"] == 5_000_000 and "stats" not in batching
    assert batching["oldest"] == {"max_candidate_sequences": 1000, "max_queue_delay_microseconds": 10_000}
    for name, value in {
        "max_batch_size": 8,
        "max_batch_time": 0.01,
        "max_sequences": 1000,
        "max_sequence_queue_size": 10,
        "max_sequence_idle_ms": 5000,
        "sequence_timeout_ms": 0,
        "sequence_state_capacity": 1000,
        "stateless_requests": "refused",
    }.items():
        assert scheduling[name] == value, name
    stats = scheduling["stats"]
    assert stats["open_sequences"] == 1 and stats["steps"] == 1 and stats["states_held"] == 1


async def test_a_failing_state_store_fails_its_batch_and_the_batcher_serves_on(inprocess: InProcess) -> None:
    from runtime.sequences import LRUStateStore

    class Flaky(LRUStateStore):
        broken = True

        async def save(self, items: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
            if self.broken:
                self.broken = False
                raise OSError("state store unreachable")
            return await super().save(items)

    await serve(inprocess)
    scheduler(inprocess).store = Flaky(10)
    async with inprocess.client() as client:
        failed = await step(client, 1, sequence_id="s", sequence_start=True)
        assert failed.status_code == 500 and "state store unreachable" in failed.json()["error"]
        assert (
            total(await step(client, 2, sequence_id="s")) == 2
        )  # the failed step kept no state: none, as before START
        assert total(await step(client, 2, sequence_id="s")) == 4
