"""The Redis state store (``runtime.sequences.redis_store``) with a real redis-server: leases with
fencing tokens, one winner when replicas race, endings recorded for every replica, the idle rule
when a replica is gone, and states stored as raw bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from runtime.sequences.redis_store import RedisStateStore
from runtime.sequences.store import Commit

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    from tests.external import redis_server

    with redis_server() as url:
        yield url


@pytest.fixture
async def stores(redis_url: str) -> AsyncIterator[list[RedisStateStore]]:
    made = [
        RedisStateStore(redis_url, "fence", None, capacity=10, ttl_ms=60000, lease_ms=lease, replica=name)
        for name, lease in (("a", 200), ("b", 200))
    ]
    await made[0].client.flushdb()
    yield made
    for store in made:
        await store.close()


async def _claimed(store: RedisStateStore, key: str, start: bool = False, step: int | None = None) -> str:
    """Claim until the other replica's lease has expired (or it is not busy); return the claim's kind."""
    for _ in range(500):
        (claim,) = await store.claim([(key, start, step)])
        if claim.kind != "busy":
            return claim.kind
        await asyncio.sleep(claim.retry_ms / 1000)
    raise TimeoutError("the lease never expired")


async def test_a_stale_owner_cannot_write(stores: list[RedisStateStore]) -> None:
    a, b = stores
    (claim,) = await a.claim([("k", True, 1)])
    assert claim.kind == "ok" and claim.state is None and claim.done == 0
    assert await a.commit([Commit("k", {"sum": 1}, 1, "answer 1")]) == [True]
    assert a.holding("k") == (True, {"sum": 1})  # its lease is fresh: its next step needs no claim
    (busy,) = await b.claim([("k", False, 2)])
    assert busy.kind == "busy" and 0 < busy.retry_ms <= 200
    assert await _claimed(b, "k", step=2) == "ok"  # a's lease expired: b takes over
    assert a.holding("k") == (False, None)  # a counts on its lease no longer
    assert await a.commit([Commit("k", {"sum": 99}, 2, None)]) == [False]  # a is stale now
    assert not await a.record_end("k", "idle")
    assert await b.load(["k"]) == [{"sum": 1}]
    assert await b.commit([Commit("k", {"sum": 3}, 2, "answer 2")]) == [True]
    (replay,) = await a.claim([("k", False, 2)])
    assert replay.kind == "replay" and replay.answer == "answer 2"
    ttl = await a.client.pttl(a.key("k"))
    assert 60000 < ttl <= 120000  # the idle timeout, then as long as an ending is remembered


async def test_two_replicas_racing_for_a_sequence_one_wins(stores: list[RedisStateStore]) -> None:
    a, b = stores
    for round_ in range(20):
        key = f"race{round_}"
        claims = await asyncio.gather(a.claim([(key, True, None)]), b.claim([(key, True, None)]))
        kinds = sorted(c[0].kind for c in claims)
        assert kinds == ["busy", "ok"]
        winner, loser = (a, b) if claims[0][0].kind == "ok" else (b, a)
        written = await asyncio.gather(
            winner.commit([Commit(key, round_, 1, None)]), loser.commit([Commit(key, -1, 1, None)])
        )
        assert list(written) == [[True], [False]]


async def test_an_ending_is_recorded_for_every_replica(stores: list[RedisStateStore]) -> None:
    a, b = stores
    await a.claim([("e", True, 1)])
    await a.commit([Commit("e", None, 1, "last answer", ended="end")])
    (ended,) = await b.claim([("e", False, None)])
    assert ended.kind == "ended" and ended.reason == "end" and ended.done == 1
    (replay,) = await b.claim([("e", False, 1)])  # a retried END gets its answer
    assert replay.kind == "replay" and replay.answer == "last answer"
    (none,) = await b.claim([("never", False, None)])
    assert none.kind == "none"
    ttl = await a.client.pttl(a.key("e"))
    assert 0 < ttl <= 60000


async def test_a_sequence_whose_replica_left_ends_idle_at_its_next_claim(redis_url: str) -> None:
    a, b = (
        RedisStateStore(redis_url, "idle", None, capacity=10, ttl_ms=300, lease_ms=100, replica=name)
        for name in ("a", "b")
    )
    try:
        await a.claim([("gone", True, 1)])
        assert await a.commit([Commit("gone", {"sum": 1}, 1, "answer 1")]) == [True]
        (claim,) = await b.claim([("gone", False, 2)])
        assert claim.kind == "busy"  # a's lease (100 ms) first
        await asyncio.sleep(0.4)  # a is gone: nobody ends the sequence but the idle rule
        (ended,) = await b.claim([("gone", False, 2)])
        assert ended.kind == "ended" and ended.reason == "idle" and ended.done == 1
        (replay,) = await b.claim([("gone", False, 1)])
        assert replay.kind == "replay" and replay.answer == "answer 1"
        assert 0 < await a.client.pttl(a.key("gone")) <= 300
    finally:
        await a.close()
        await b.close()


def test_states_are_stored_as_bytes_tensors_included() -> None:
    """A state's tensors and arrays travel as their raw bytes (not JSON, not torch.save), and come
    back as they were; a tensor numpy cannot hold (bfloat16) still round-trips."""
    import pickle

    import numpy as np
    import torch

    from runtime.sequences.state_pickle import dumps

    h = torch.arange(2 * 512, dtype=torch.float32).reshape(2, 512)
    state: dict[str, Any] = {"h": h, "c": h.numpy() * 2, "n": 3}
    stored = dumps(state)
    assert len(stored) < h.numel() * 4 * 2 + 1024  # the two arrays' bytes and a little framing
    assert h.numpy().tobytes() in stored
    back = pickle.loads(stored)
    assert isinstance(back["h"], torch.Tensor) and torch.equal(back["h"], h)
    assert isinstance(back["c"], np.ndarray) and np.array_equal(back["c"], state["c"]) and back["n"] == 3
    odd = torch.ones(4, dtype=torch.bfloat16)
    assert torch.equal(pickle.loads(dumps(odd)), odd)
