"""Continuous batching with a shared (Redis) sequence store, with a real redis-server: a sequence of a
running set is claimed when its first stream joins, its state written after each of its steps (one
round trip), and it goes on at another replica; a replica whose write is refused fails the stream."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from runtime.errors import SequenceElsewhere, SequenceError
from runtime.scheduling import ContinuousScheduler
from runtime.sequences.redis_store import RedisStateStore
from runtime.settings import ModelSettings
from tests.conftest import InProcess
from tests.continuous_helpers import Client, extra
from tests.continuous_models import SequenceTicker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    from tests.external import redis_server

    with redis_server() as url:
        yield url


class Replica:
    """One in-process server with the continuously batched sequence ticker on the shared store."""

    def __init__(self, server: InProcess) -> None:
        self.server = server
        entry = server.registry.get("seq")
        assert isinstance(entry.model, SequenceTicker) and isinstance(entry.scheduler, ContinuousScheduler)
        self.model: SequenceTicker = entry.model
        assert entry.scheduler.sequences is not None
        store = entry.scheduler.sequences.engine.store
        assert isinstance(store, RedisStateStore)
        self.store = store

    async def send(self, request_id: str, **parameters: Any) -> Client:
        return await Client(self.server.dataplane, request_id, model="seq", **parameters).finished()


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[tuple[Replica, Replica]]:
    import redis.asyncio as aioredis

    probe = aioredis.Redis.from_url(redis_url)
    await probe.flushdb()
    await probe.aclose()
    servers = [InProcess(), InProcess()]
    for server in servers:
        await server.load(
            ModelSettings(
                name="seq",
                implementation="tests.continuous_models.SequenceTicker",
                continuous_batching=True,
                sequence_batching=True,
                max_batch_size=4,
                sequence_store=redis_url,
                sequence_lease_ms=300,
            )
        )
    yield Replica(servers[0]), Replica(servers[1])
    for server in servers:
        await server.registry.unload_all()


async def _stored_state(replica: Replica, key: str) -> Any:
    raw = await replica.store.client.hget(replica.store.key(key), "state")
    assert raw is None or isinstance(raw, bytes)
    return pickle.loads(raw) if raw else None


async def test_a_running_set_sequence_goes_on_at_another_replica(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    first = await a.send("r1", sequence_id="c", sequence_start=True, length=2)
    assert first.error is None and len(first.chunks) == 2
    assert extra(first.chunks[-1])["sequence_replica"] == a.store.replica
    assert await _stored_state(a, "c") == ["r1"]
    second = await a.send("r2", sequence_id="c", length=1)
    assert second.error is None and a.model.joined_with["r2"] == ["r1"]
    held = await b.send("r3", sequence_id="c", length=1)
    assert isinstance(held.error, SequenceElsewhere)  # a's lease (300 ms) has not expired
    moved = held
    for _ in range(200):  # as a client honouring Retry-After, until a's lease has expired
        await asyncio.sleep(0.05)
        moved = await b.send("r3", sequence_id="c", length=1)
        if not isinstance(moved.error, SequenceElsewhere):
            break
    assert moved.error is None and extra(moved.chunks[-1])["sequence_replica"] == b.store.replica
    assert b.model.joined_with["r3"] == ["r1", "r2"]  # from the state a wrote
    stale = await a.send("r4", sequence_id="c", length=1)
    assert isinstance(stale.error, SequenceElsewhere)  # b holds it now
    end = await b.send("r5", sequence_id="c", length=1, sequence_end=True)
    assert end.error is None and extra(end.chunks[-1])["sequence_end"] is True
    for replica in (a, b):
        late = await replica.send("r6", sequence_id="c", length=1)
        assert isinstance(late.error, SequenceError) and "reason: end" in str(late.error)
    assert [reason for key, reason, _ in b.model.sequences_ended if key == "c"] == ["end"]


async def test_a_step_of_a_held_sequence_is_one_write(replicas: tuple[Replica, Replica]) -> None:
    a, _b = replicas
    assert (await a.send("w1", sequence_id="w", sequence_start=True, length=1)).error is None
    await a.store.client.config_resetstat()
    assert (await a.send("w2", sequence_id="w", length=3)).error is None
    stats = await a.store.client.info("commandstats")
    # held under a fresh lease: no claim; a write after each of its 3 steps, one as it leaves
    assert stats["cmdstat_evalsha"]["calls"] == 3 + 1
    assert await _stored_state(a, "w") == ["w1", "w2"]


async def test_a_stream_whose_sequence_was_taken_over_fails_and_writes_nothing(
    replicas: tuple[Replica, Replica],
) -> None:
    a, _b = replicas
    a.model.hold()
    long = Client(a.server.dataplane, "long", model="seq", sequence_id="f", sequence_start=True, length=5)
    await a.model.wait_stepping()
    a.model.advance()  # the first step runs and its state is written
    await a.model.wait_stepping()
    assert await _stored_state(a, "f") == ["long"]
    # meanwhile another replica took the sequence over (a paused past its lease, say)
    await a.store.client.hset(a.store.key("f"), mapping={"owner": "elsewhere", "token": 99, "state": b"x"})
    a.model.release()
    await long.finished()
    assert isinstance(long.error, SequenceElsewhere) and len(long.chunks) == 1
    assert await a.store.client.hget(a.store.key("f"), "state") == b"x"  # a's later steps kept nothing
    again = await a.send("again", sequence_id="f", length=1)
    assert isinstance(again.error, SequenceElsewhere)  # "elsewhere" holds it until its lease expires


async def test_sequence_step_is_refused_under_continuous_batching(replicas: tuple[Replica, Replica]) -> None:
    a, _b = replicas
    numbered = await a.send("n", sequence_id="n", sequence_start=True, sequence_step=1)
    assert isinstance(numbered.error, SequenceError) and "sequence_step" in str(numbered.error)
