"""Sequences over replicas (``runtime.sequences.replicated``): exactly-once steps (``sequence_step``),
both stores answering alike, and two replicas sharing a real redis-server (a sequence goes on at
another replica, unloading hands sequences over, Redis out of reach is a 503)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import InProcess
from tests.sequencing import scheduler, serve, step, total

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------------- sequence_step, one replica


def _answer(response: Any) -> dict[str, Any]:
    """A response's body but its id (each request without an id gets a fresh one)."""
    document: dict[str, Any] = response.json()
    document.pop("id", None)
    return document


async def test_a_retried_step_gets_its_answer_and_applies_nothing(inprocess: InProcess) -> None:
    model = await serve(inprocess)
    async with inprocess.client() as client:
        first = await step(client, 5, sequence_id="s", sequence_start=True, sequence_step=1)
        assert total(first) == 5
        again = await step(client, 5, sequence_id="s", sequence_start=True, sequence_step=1)
        assert total(again) == 5 and _answer(again) == _answer(first)
        second = await step(client, 3, headers={"sequence_step": "2"}, sequence_id="s")
        assert total(second) == 8
        retried = await step(client, 3, headers={"sequence_step": "2"}, sequence_id="s")
        assert total(retried) == 8
        assert len(model.batches) == 2  # the retries ran nothing
        ahead = await step(client, 1, sequence_id="s", sequence_step=4)
        assert ahead.status_code == 409 and "sequence_step=3" in ahead.json()["error"]
        older = await step(client, 1, sequence_id="s", sequence_step=1)
        assert older.status_code == 409
        assert total(await step(client, 1, sequence_id="s")) == 9  # without numbers: as before
        assert total(await step(client, 1, sequence_id="s", sequence_step=4)) == 10
    stats = scheduler(inprocess).describe()["stats"]
    assert stats["replayed_steps"] == 2 and stats["steps"] == 4


async def test_malformed_step_numbers_are_refused(inprocess: InProcess) -> None:
    await serve(inprocess)
    async with inprocess.client() as client:
        for params, headers in (
            ({"sequence_step": 0}, None),
            ({"sequence_step": "2"}, None),
            ({"sequence_step": 2, "sequence_start": True}, None),
            ({}, {"sequence_step": "two"}),
            ({"sequence_step": 2}, {"sequence_step": "3"}),
        ):
            bad = await step(client, 1, headers=headers, sequence_id="m", **params)
            assert bad.status_code == 400 and "sequence_step" in bad.json()["error"], (params, bad.text)


# ---------------------------------------------------------------------- a real redis-server


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    from tests.external import redis_server

    with redis_server() as url:
        yield url


# ---------------------------------------------------------------------- both stores answer alike


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.server)])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each store in turn (Redis: the real redis-server of this module)."""
    if request.param == "memory":
        return "memory"
    url: str = request.getfixturevalue("redis_url")
    import redis

    redis.Redis.from_url(url).flushdb()
    return url


async def test_a_retried_end_gets_its_answer_with_either_store(inprocess: InProcess, store_url: str) -> None:
    model = await serve(inprocess, sequence_store=store_url)
    async with inprocess.client() as client:
        assert total(await step(client, 4, sequence_id="e", sequence_start=True, sequence_step=1)) == 4
        end = await step(client, 3, sequence_id="e", sequence_step=2, sequence_end=True)
        assert total(end) == 7 and end.json()["parameters"]["sequence_end"] is True
        for _ in range(2):
            again = await step(client, 3, sequence_id="e", sequence_step=2, sequence_end=True)
            assert again.status_code == 200 and _answer(again) == _answer(end)
        assert len(model.batches) == 2  # the retries ran nothing
        numbered: list[dict[str, Any]] = [{"sequence_step": 3}, {"sequence_step": 1}, {}]
        for params in numbered:  # the future, the past, unnumbered
            late = await step(client, 1, sequence_id="e", **params)
            assert late.status_code == 400 and "reason: end" in late.json()["error"], (params, late.text)
        # a one-step sequence: its retried START (numbered 1) is a retry, as while it was open
        one = await step(
            client, 5, sequence_id="one", sequence_start=True, sequence_end=True, sequence_step=1
        )
        again = await step(
            client, 5, sequence_id="one", sequence_start=True, sequence_end=True, sequence_step=1
        )
        assert total(one) == 5 and _answer(again) == _answer(one)
        # a new START without a number opens the id afresh: the old answers are gone with it
        assert total(await step(client, 2, sequence_id="e", sequence_start=True)) == 2
        stale = await step(client, 4, sequence_id="e", sequence_step=1)
        assert stale.status_code == 409 and "sequence_step=2" in stale.json()["error"]
    assert model.reasons("e") == ["end"] and len(model.batches) == 4
    assert scheduler(inprocess).describe()["stats"]["replayed_steps"] == 3


async def test_a_retried_step_after_an_idle_ending_gets_its_answer_with_either_store(
    inprocess: InProcess, store_url: str
) -> None:
    # Redis keeps an ended sequence's record for the idle timeout: long enough to retry in
    model = await serve(inprocess, sequence_store=store_url, max_sequence_idle_ms=1500)
    async with inprocess.client() as client:
        assert total(await step(client, 4, sequence_id="i", sequence_start=True, sequence_step=1)) == 4
        second = await step(client, 2, sequence_id="i", sequence_step=2)
        assert total(second) == 6
        assert (await model.ending("i"))[0] == "idle"
        again = await step(client, 2, sequence_id="i", sequence_step=2)
        assert again.status_code == 200 and _answer(again) == _answer(second)
        ahead = await step(client, 1, sequence_id="i", sequence_step=3)
        assert ahead.status_code == 400 and "reason: idle" in ahead.json()["error"]
    assert len(model.batches) == 2


# ---------------------------------------------------------------------- two replicas in process


async def _replicas(redis_url: str, **settings: Any) -> tuple[InProcess, InProcess]:
    a, b = InProcess(), InProcess()
    for server in (a, b):
        await serve(server, sequence_store=redis_url, sequence_lease_ms=300, **settings)
    return a, b


async def test_a_sequence_goes_on_at_another_replica(redis_url: str) -> None:
    a, b = await _replicas(redis_url)
    replica_a = scheduler(a).engine.replica
    try:
        async with a.client() as on_a, b.client() as on_b:
            first = await step(on_a, 5, sequence_id="moving", sequence_start=True, sequence_step=1)
            assert total(first) == 5 and first.headers["sequence_replica"] == replica_a
            assert total(await step(on_a, 2, sequence_id="moving", sequence_step=2)) == 7
            held = await step(on_b, 1, sequence_id="moving", sequence_step=3)
            assert held.status_code == 503 and held.headers["retry-after"] == "1"
            moved = held
            for _ in range(200):  # until a's lease (300 ms) has expired, as a client honouring Retry-After
                moved = await step(on_b, 1, sequence_id="moving", sequence_step=3)
                if moved.status_code != 503:
                    break
                await asyncio.sleep(0.05)
            assert total(moved) == 8 and moved.headers["sequence_replica"] != replica_a
            stale = await step(on_a, 1, sequence_id="moving", sequence_step=3)  # a retry sent to a
            assert total(stale) == 8
            end = await step(on_b, 2, sequence_id="moving", sequence_step=4, sequence_end=True)
            assert total(end) == 10
            for client in (on_a, on_b):
                late = await step(client, 1, sequence_id="moving")
                assert late.status_code == 400 and "reason: end" in late.json()["error"]
                again = await step(client, 2, sequence_id="moving", sequence_step=4, sequence_end=True)
                assert total(again) == 10
            missing = await step(on_a, 1, sequence_id="nobody")
            assert missing.status_code == 400 and "not open" in missing.json()["error"]
    finally:
        await a.registry.unload_all()
        await b.registry.unload_all()


async def test_unloading_hands_sequences_over(redis_url: str) -> None:
    a, b = await _replicas(redis_url, max_sequence_idle_ms=60000)
    try:
        async with a.client() as on_a, b.client() as on_b:
            assert total(await step(on_a, 4, sequence_id="h", sequence_start=True)) == 4
            await a.registry.unload_all()  # releases the lease, keeps the state
            assert total(await step(on_b, 1, sequence_id="h")) == 5  # at once: no lease to wait for
    finally:
        await b.registry.unload_all()


async def test_a_server_made_id_may_be_routed_anywhere_after_its_start(redis_url: str) -> None:
    a, b = await _replicas(redis_url)
    try:
        async with a.client() as on_a, b.client() as on_b:
            first = await step(on_a, 3, sequence_start=True)
            made = first.headers["ts_request_sequence_id"]
            assert made.startswith("seq-") and total(first) == 3
            # the next request carries the id, so a proxy hashing on it may pick the other replica:
            # the START freed its lease, so that replica goes on at once
            assert total(await step(on_b, 4, headers={"ts_request_sequence_id": made})) == 7
    finally:
        await a.registry.unload_all()
        await b.registry.unload_all()


async def test_redis_out_of_reach_is_a_503_and_the_model_serves_on() -> None:
    from tests.external import free_port

    server = InProcess()
    await serve(server, sequence_store=f"redis://127.0.0.1:{free_port()}/0")
    try:
        async with server.client() as client:
            for _ in range(2):
                down = await step(client, 1, sequence_id="r", sequence_start=True)
                assert down.status_code == 503 and "state store is unreachable" in down.json()["error"]
                assert down.headers["retry-after"] == "1"
    finally:
        await server.registry.unload_all()


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
async def test_worker_processes_refuse_a_shared_store(
    inprocess: InProcess, workers: int, continuous: bool
) -> None:
    from runtime.settings import ModelSettings

    await inprocess.load(
        ModelSettings(
            name="seq",
            implementation="tests.continuous_models.SequenceTicker"
            if continuous
            else "tests.models.seqzoo.Recorder",
            continuous_batching=continuous,
            sequence_batching=True,
            sequence_store="redis://127.0.0.1:1/0",
            workers=workers,
        )
    )
    entry = inprocess.registry.find("seq")
    assert not entry.ready and "cannot serve a model in worker processes" in entry.reason
    assert f"workers: {workers}" in entry.reason and entry.workers is None  # refused before any started


async def test_a_step_of_a_sequence_held_here_is_one_round_trip(redis_url: str) -> None:
    import redis.asyncio as aioredis

    server = InProcess()
    await serve(server, sequence_store=redis_url, sequence_lease_ms=60000)
    probe = aioredis.Redis.from_url(redis_url)
    try:
        async with server.client() as client:
            assert (
                total(await step(client, 1, sequence_id="warm", sequence_start=True)) == 1
            )  # scripts loaded
            await probe.config_resetstat()
            assert total(await step(client, 1, sequence_id="one-trip", sequence_start=True)) == 1
            for n in range(2, 11):
                assert total(await step(client, 1, sequence_id="one-trip", sequence_step=n)) == n
        stats = await probe.info("commandstats")
        # the START: a claim and a write; then each step: its fenced write alone
        assert stats["cmdstat_evalsha"]["calls"] == 2 + 9
    finally:
        await probe.aclose()
        await server.registry.unload_all()
