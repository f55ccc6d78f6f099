"""The REST routes of the model repository extension (``runtime.frontends.rest.repository_routes``),
through the real app in process: the index (all models, or the ready ones), load and unload by
name (behind the management key unless ``repository_token_auth`` is off), and the refusals a
client gets as ``{"error": ...}`` with the right status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime.settings import ModelSettings, Settings
from tests.conftest import InProcess
from tests.models import zoo

pytestmark = pytest.mark.anyio


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[InProcess]:
    folder = tmp_path / "summer"
    folder.mkdir()
    (folder / "model-settings.json").write_text(
        json.dumps({"name": "summer", "implementation": "tests.models.zoo.Summer"})
    )
    made = InProcess(Settings(model_repository_root=str(tmp_path), repository_token_auth=False))
    await made.load(ModelSettings(name="echo", implementation=zoo.Echo))
    yield made
    await made.registry.unload_all()


async def test_the_index_lists_loaded_and_unloaded_models(server: InProcess) -> None:
    async with server.client() as client:
        everything = await client.post("/v2/repository/index")
        assert everything.status_code == 200
        states = {item["name"]: item["state"] for item in everything.json()}
        assert states == {"echo": "READY", "summer": "UNAVAILABLE"}
        ready = await client.post("/v2/repository/index", json={"ready": True})
        assert [item["name"] for item in ready.json()] == ["echo"]
        empty_body = await client.post("/v2/repository/index", content=b"  ")
        assert {item["name"] for item in empty_body.json()} == {"echo", "summer"}


async def test_load_then_unload_a_model_by_name(server: InProcess) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    async with server.client() as client:
        assert (await client.post("/v2/models/summer/infer", json=body)).status_code == 404
        loaded = await client.post("/v2/repository/models/summer/load")
        assert loaded.status_code == 200 and loaded.content == b""
        answer = await client.post("/v2/models/summer/infer", json=body)
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [6.0]
        unloaded = await client.post("/v2/repository/models/summer/unload")
        assert unloaded.status_code == 200
        assert (await client.post("/v2/models/summer/infer", json=body)).status_code == 404


async def test_refusals_are_json_errors(server: InProcess) -> None:
    async with server.client() as client:
        absent = await client.post("/v2/repository/models/absent/load")
        assert absent.status_code == 404 and "absent" in absent.json()["error"]
        not_loaded = await client.post("/v2/repository/models/summer/unload")
        assert not_loaded.status_code == 404 and "summer" in not_loaded.json()["error"]
        bad = await client.post("/v2/repository/index", content=b'{"ready": "maybe"}')
        assert bad.status_code == 400 and "ready" in bad.json()["error"]
        huge = await client.post("/v2/repository/index", content=b" " * (64 * 1024 + 1))
        assert huge.status_code == 413 and "65536 bytes" in huge.json()["error"]
        wrong_method = await client.get("/v2/repository/index")
        assert wrong_method.status_code == 405


async def test_load_and_unload_need_the_key_by_default(tmp_path: Path) -> None:
    guarded = InProcess(Settings(model_repository_root=str(tmp_path)))
    await guarded.load(ModelSettings(name="echo", implementation=zoo.Echo))
    try:
        async with guarded.client() as client:
            for action in ("load", "unload"):
                refused = await client.post(f"/v2/repository/models/echo/{action}")
                assert refused.status_code == 401 and "management key" in refused.json()["error"]
            assert (await client.post("/v2/repository/index")).status_code == 200
    finally:
        await guarded.registry.unload_all()
