"""Residency limits through a real server in the test's loop: a busy model is never unloaded, a
pinned one stays, concurrent requests wait for one load, every model busy gives 503 +
Retry-After, the server is ready once its pinned models are."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.core.model_table import NOT_LOADED
from runtime.core.residency import Residency, resident_bytes
from runtime.server.serving import Server
from runtime.settings import ModelSettings, parse_size
from runtime.types import State
from tests.many_models import MIB, answer, body, serving_repository, write_model
from tests.models.ballast import Ballast


@asynccontextmanager
async def repository(
    tmp_path: Path, models: dict[str, dict[str, Any]], **settings: Any
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    """A server on a repository of Ballast models of 1 MiB (``models``: name -> settings)."""
    for i, (name, own) in enumerate(models.items()):
        write_model(tmp_path, name, k=100 * (i + 1), extra={"mib": 1, **own.pop("extra", {})}, **own)
    settings.setdefault("load_models_at_startup", False)
    # these tests load and unload through the repository extension: opened (its key is tested apart)
    settings.setdefault("repository_token_auth", False)
    async with serving_repository(tmp_path, **settings) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as http:
            yield server, http


def model(server: Server, name: str) -> Ballast:
    instance = server.registry.find(name).model
    assert isinstance(instance, Ballast), f"{name} is not loaded"
    return instance


def loads(server: Server, name: str) -> int:
    return server.registry.residency.of(name, None).loads


async def test_a_model_with_a_request_in_flight_is_never_unloaded(tmp_path: Path) -> None:
    """The race: the least recently used model is the slow one, whose request is still running
    when a third model needs room; the idle one must go instead."""
    async with repository(
        tmp_path, {"slow": {"extra": {"gate": True}}, "b": {}, "c": {}}, max_loaded_models=2
    ) as (
        server,
        http,
    ):
        await server.dataplane.repository_load("slow")
        held = asyncio.ensure_future(http.post("/v2/models/slow/infer", json=body(1)))
        await asyncio.wait_for(_entered(server, "slow"), 10)
        assert answer(await http.post("/v2/models/b/infer", json=body(2))) == 202
        assert answer(await http.post("/v2/models/c/infer", json=body(3))) == 303
        assert server.registry.find("slow").ready  # least recently used, but busy: kept
        assert server.registry.find("b").reason == NOT_LOADED
        model(server, "slow").gate.set()  # type: ignore[union-attr]
        assert answer(await held) == 101
        counts = server.registry.residency.of("b", None)
        assert counts.unloads == {"evicted": 1}


async def _entered(server: Server, name: str) -> None:
    await model(server, name).entered.wait()


async def test_every_model_busy_answers_503_with_retry_after(tmp_path: Path) -> None:
    async with repository(
        tmp_path, {"slow": {"extra": {"gate": True}}, "b": {}}, max_loaded_models=1, model_load_wait=0.2
    ) as (server, http):
        await server.dataplane.repository_load("slow")
        held = asyncio.ensure_future(http.post("/v2/models/slow/infer", json=body(1)))
        await asyncio.wait_for(_entered(server, "slow"), 10)
        refused = await http.post("/v2/models/b/infer", json=body(2))
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert "busy" in refused.json()["error"] or "not loaded yet" in refused.json()["error"]
        model(server, "slow").gate.set()  # type: ignore[union-attr]
        assert answer(await held) == 101
        assert answer(await http.post("/v2/models/b/infer", json=body(2))) == 202  # room now


async def test_a_pinned_model_stays_and_makes_the_server_ready(tmp_path: Path) -> None:
    async with repository(
        tmp_path, {"p": {"pinned": True}, "a": {}, "b": {}, "c": {}}, max_loaded_models=2
    ) as (
        server,
        http,
    ):
        assert server.registry.find("p").ready  # loaded at start
        assert (await http.get("/v2/health/ready")).status_code == 200  # the others not loaded yet
        assert (await http.get("/v2/models/a/ready")).status_code != 200
        for name, k in (("a", 200), ("b", 300), ("c", 400), ("a", 200)):
            assert answer(await http.post(f"/v2/models/{name}/infer", json=body(1))) == 1 + k
            assert server.registry.find("p").ready
        assert answer(await http.post("/v2/models/p/infer", json=body(1))) == 101
        assert loads(server, "p") == 1
        assert server.registry.residency.of("p", None).unloads == {}
        index = {item.name: item for item in await server.dataplane.repository_index()}
        assert index["p"].state is State.READY and index["b"].reason == NOT_LOADED


async def test_concurrent_requests_for_a_model_wait_for_one_load(tmp_path: Path) -> None:
    async with repository(tmp_path, {"a": {}, "b": {}}, max_loaded_models=1) as (server, http):
        got = await asyncio.gather(*(http.post("/v2/models/a/infer", json=body(x)) for x in range(8)))
        assert [answer(r) for r in got] == [100 + x for x in range(8)]
        assert loads(server, "a") == 1


async def test_a_model_that_fails_to_load_on_demand_answers_503_with_the_reason(tmp_path: Path) -> None:
    async with repository(
        tmp_path, {"a": {"implementation": "tests.models.zoo.FailingLoad"}}, max_loaded_models=1
    ) as (
        server,
        http,
    ):
        refused = await http.post("/v2/models/a/infer", json=body(1))
        assert refused.status_code == 503
        assert "weights file is corrupt" in refused.json()["error"]
        assert server.registry.find("a").on_demand  # a later request tries again


async def test_an_unknown_model_is_still_404(tmp_path: Path) -> None:
    async with repository(tmp_path, {"a": {}}, max_loaded_models=1) as (_server, http):
        missing = await http.post("/v2/models/nope/infer", json=body(1))
        assert missing.status_code == 404
        assert "error" in missing.json()


async def test_metadata_and_streams_load_on_demand(tmp_path: Path) -> None:
    async with repository(tmp_path, {"a": {}, "b": {}}, max_loaded_models=1) as (server, http):
        meta = await http.get("/v2/models/a")
        assert meta.status_code == 200 and meta.json()["name"] == "a"
        events = []
        async with http.stream("POST", "/v2/models/b/infer_stream", json=body(5)) as streamed:
            assert streamed.status_code == 200
            async for line in streamed.aiter_lines():
                if line.startswith("data:"):
                    events.append(line)
        assert len(events) == 1 and '"data":[205.0]' in events[0].replace(" ", "")
        assert server.registry.find("a").reason == NOT_LOADED  # b took its room
        assert server.registry.find("b").busy == 0


async def test_unloading_through_the_repository_api_keeps_the_model_listed(tmp_path: Path) -> None:
    async with repository(tmp_path, {"a": {}}, max_loaded_models=1) as (server, http):
        assert answer(await http.post("/v2/models/a/infer", json=body(1))) == 101
        assert (await http.post("/v2/repository/models/a/unload")).status_code == 200
        assert server.registry.find("a").reason == NOT_LOADED
        assert server.registry.residency.of("a", None).unloads == {"requested": 1}
        assert answer(await http.post("/v2/models/a/infer", json=body(1))) == 101  # loaded again


def test_the_limits_and_the_choice_of_the_model_to_unload() -> None:
    class Held:
        def __init__(self, used: int, memory: int, pinned: bool = False, idle: bool = True) -> None:
            self.name, self.version, self.loaded = f"m{used}", None, True
            self.used, self.memory, self.pinned, self.idle = used, memory, pinned, idle

    a, b, c = Held(1, 50), Held(2, 50, pinned=True), Held(3, 50, idle=False)
    assert Residency.victim([a, b, c]) is a
    assert Residency.victim([b, c]) is None
    assert Residency.victim([a, b, c], keep=a) is None
    by_count = Residency(max_loaded=2)
    assert by_count.on_demand and by_count.fits([a, b]) and not by_count.fits([a, b], Held(4, 0))
    by_memory = Residency(memory_limit=120)
    assert by_memory.fits([a, b]) and not by_memory.fits([a, b, c])
    assert by_memory.fits([], Held(5, 500))  # one model alone may pass it: it could never load else
    assert not Residency().on_demand and Residency().fits([a, b, c])
    by_memory.loaded("m", None, 0.3)
    by_memory.unloaded("m", None, "evicted")
    counts = by_memory.of("m", None)
    assert counts.loads == 1 and counts.unloads == {"evicted": 1} and counts.load_seconds.sum == 0.3
    assert resident_bytes() > 0


@pytest.mark.parametrize(
    ("text", "size"),
    [("512MiB", 512 * MIB), ("4GiB", 4 * 1024 * MIB), ("800MB", 800_000_000), ("1.5k", 1500), ("1024", 1024)],
)
def test_memory_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_a_bad_memory_size_is_refused() -> None:
    from runtime.settings import Settings

    with pytest.raises(ValueError, match="not a size"):
        Settings(models_memory_limit="lots")
    assert ModelSettings(pinned=True).pinned


@pytest.mark.server  # the model's worker process
async def test_a_model_in_a_worker_process_is_measured_by_its_worker_and_evicted(tmp_path: Path) -> None:
    """In worker processes the model's memory is its workers' resident memory; evicting it stops them."""
    async with repository(tmp_path, {"w": {"workers": 1}, "b": {}}, max_loaded_models=1) as (server, http):
        assert answer(await http.post("/v2/models/w/infer", json=body(1))) == 101
        entry = server.registry.find("w")
        assert entry.workers is not None and entry.memory > 1024 * 1024  # a whole Python process
        workers = entry.workers
        assert answer(await http.post("/v2/models/b/infer", json=body(1))) == 201
        assert entry.workers is None and entry.reason == NOT_LOADED
        assert all(w["status"] in ("STOPPED", "DEAD") for w in workers.describe()) or not workers.ready


async def test_at_start_the_models_load_in_order_while_they_fit(tmp_path: Path) -> None:
    models: dict[str, dict[str, Any]] = {name: {"extra": {"mib": 12}} for name in ("a", "b", "c", "d")}
    async with repository(
        tmp_path, {**models, "p": {"pinned": True}}, load_models_at_startup=True, models_memory_limit=30 * MIB
    ) as (server, _http):
        loaded = {e.name for e in server.registry.resident()}
        assert "p" in loaded and "d" not in loaded  # pinned first, then in order until the room is taken
        total_loads = sum(counts.loads for counts in server.registry.residency.counts.values())
        assert total_loads <= 4  # not every model loaded and evicted in turn
