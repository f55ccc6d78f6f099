"""Following the model repository (``repository_poll_interval``): a folder added, changed and
removed while the server runs, with requests in flight through the change and the removal."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx

from runtime.core.repository_poll import RepositoryPoll, fingerprint
from runtime.server.serving import Server
from tests.many_models import answer, body, serving_repository, write_model
from tests.models.ballast import Ballast


async def seen(server: Server) -> None:
    """Until a look that began after now has been taken (the one under way may predate a change)."""
    poll = server.poll
    assert isinstance(poll, RepositoryPoll)
    await poll.next_look()
    await poll.next_look()


def model(server: Server, name: str) -> Ballast:
    instance = server.registry.find(name).model
    assert isinstance(instance, Ballast)
    return instance


async def test_a_folder_added_changed_and_removed_while_serving(tmp_path: Path) -> None:
    write_model(tmp_path, "a", k=100, extra={"mib": 1})
    async with serving_repository(tmp_path, repository_poll_interval=0.02) as server:
        poll = server.poll
        assert isinstance(poll, RepositoryPoll)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as http:
            assert (await http.post("/v2/models/b/infer", json=body(1))).status_code == 404

            # added: registered and loaded
            write_model(tmp_path, "b", k=7, extra={"mib": 1, "gate": True})
            await seen(server)
            await poll.settled()
            assert server.registry.find("b").ready

            # changed while a request is in flight: the old copy answers it, the new one the next
            held = asyncio.ensure_future(http.post("/v2/models/b/infer", json=body(1)))
            await model(server, "b").entered.wait()
            old = model(server, "b")
            write_model(tmp_path, "b", k=70, extra={"mib": 1})
            await seen(server)
            assert not held.done()
            assert old.gate is not None
            old.gate.set()
            assert answer(await held) == 8  # served by the old copy, not failed
            await poll.settled()
            assert model(server, "b") is not old
            assert answer(await http.post("/v2/models/b/infer", json=body(1))) == 71
            assert server.registry.residency.of("b", None).unloads == {"replaced": 1}

            # a changed model file (not the settings) reloads too
            (tmp_path / "b" / "weights.txt").write_text("new weights")
            await seen(server)
            await poll.settled()
            assert server.registry.residency.of("b", None).loads == 3

            # removed while a request is in flight: unloaded after it, then gone
            write_model(tmp_path, "c", k=5, extra={"mib": 1, "gate": True})
            await seen(server)
            await poll.settled()
            held = asyncio.ensure_future(http.post("/v2/models/c/infer", json=body(1)))
            await model(server, "c").entered.wait()
            gate = model(server, "c").gate
            shutil.rmtree(tmp_path / "c")
            await seen(server)
            refused = await http.post("/v2/models/c/infer", json=body(1))
            assert refused.status_code == 404  # gone from the repository: no new work
            assert not held.done()  # the work in flight goes on
            assert gate is not None
            gate.set()
            assert answer(await held) == 6
            await poll.settled()
            assert (await http.post("/v2/models/c/infer", json=body(1))).status_code == 404
            assert server.registry.residency.of("c", None).unloads == {"removed": 1}
            assert (await http.get("/v2/health/ready")).status_code == 200
            assert answer(await http.post("/v2/models/a/infer", json=body(1))) == 101


async def test_on_demand_a_new_folder_is_listed_and_loaded_by_its_first_request(tmp_path: Path) -> None:
    write_model(tmp_path, "a", k=100, extra={"mib": 1})
    async with serving_repository(
        tmp_path, repository_poll_interval=0.02, max_loaded_models=1, load_models_at_startup=False
    ) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as http:
            write_model(tmp_path, "b", k=7, extra={"mib": 1})
            await seen(server)
            index = {item["name"]: item for item in (await http.post("/v2/repository/index")).json()}
            assert index["b"]["state"] == "UNAVAILABLE" and index["b"]["reason"] == "not loaded"
            assert answer(await http.post("/v2/models/b/infer", json=body(1))) == 8
            # a model not loaded takes its changed settings at its next load
            write_model(tmp_path, "a", k=300, extra={"mib": 1})
            await seen(server)
            assert answer(await http.post("/v2/models/a/infer", json=body(1))) == 301


def test_the_fingerprint_leaves_nested_models_and_caches_out(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "a", k=1)
    before = fingerprint(folder)
    write_model(folder, "nested", k=2)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "x.pyc").write_bytes(b"x")
    assert fingerprint(folder) == before
    (folder / "model-settings.json").write_text(json.dumps({"name": "a", "implementation": "x.Y", "more": 1}))
    assert fingerprint(folder) != before
