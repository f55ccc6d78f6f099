"""The default sequence state store (``runtime.sequences.store.LRUStateStore``): at most
``capacity`` states, the least recently used evicted first and handed back to the caller."""

from __future__ import annotations

import pytest

from runtime.sequences.store import LRUStateStore

pytestmark = pytest.mark.anyio


def test_a_store_holds_at_least_one_state() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        LRUStateStore(0)


async def test_load_gives_none_for_unknown_keys_and_save_evicts_nothing_within_capacity() -> None:
    store = LRUStateStore(2)
    assert await store.save([("a", 1), ("b", 2)]) == []
    assert await store.load(["b", "x", "a"]) == [2, None, 1]
    assert len(store) == 2


async def test_save_returns_the_least_recently_used_states_it_evicted() -> None:
    store = LRUStateStore(2)
    await store.save([("a", 1), ("b", 2)])
    await store.load(["a"])  # a is now the most recently used
    assert await store.save([("c", 3)]) == [("b", 2)]
    assert await store.load(["a", "b", "c"]) == [1, None, 3]
    assert await store.save([("d", 4), ("e", 5)]) == [("a", 1), ("c", 3)]
    assert await store.save([("e", 6)]) == []  # overwriting a held key evicts nothing


async def test_pop_and_clear_remove_and_return_states() -> None:
    store = LRUStateStore(3)
    await store.save([("a", 1), ("b", 2)])
    assert await store.pop("a") == 1 and await store.pop("a") is None
    assert await store.clear() == [("b", 2)]
    assert len(store) == 0 and await store.load(["b"]) == [None]
