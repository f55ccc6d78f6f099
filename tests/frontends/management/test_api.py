"""The management API (TorchServe's REST shape) in process: auth, list, describe, register, set-default, delete."""

from __future__ import annotations

import json
import os
import stat
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.core.management import Management
from runtime.core.management_key import ManagementKey
from runtime.core.registry import Registry
from runtime.frontends.management.api import create_management_app
from runtime.settings import Settings

pytestmark = pytest.mark.anyio


def model_folder(root: Path, name: str, version: str | None = None, **extra: Any) -> Path:
    folder = root / name / (version or "")
    folder.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {"name": name, "implementation": "tests.worker_models.Echo", **extra}
    if version:
        document["parameters"] = {"version": version}
    (folder / "model-settings.json").write_text(json.dumps(document))
    return folder


class Admin:
    def __init__(self, root: Path, key: ManagementKey | None, **settings: Any) -> None:
        self.settings = Settings(model_repository_root=str(root), **settings)
        self.registry = Registry()
        self.management = Management(self.settings, self.registry)
        self.key = key
        self.app = create_management_app(self.management, key)

    def client(self, token: str | None = "") -> httpx.AsyncClient:
        headers = {}
        if token == "" and self.key is not None:
            token = self.key.key
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://mgmt", headers=headers
        )


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    key = ManagementKey(str(tmp_path / "keys" / "key_file.json"))
    key.write()
    server = Admin(tmp_path / "repo", key)
    (tmp_path / "repo").mkdir(exist_ok=True)
    yield server
    await server.management.close()
    await server.registry.unload_all()
    key.remove()


async def test_the_key_file_is_private_and_every_call_needs_the_key(admin: Admin) -> None:
    assert admin.key is not None
    mode = stat.S_IMODE(os.stat(admin.key.path).st_mode)
    assert mode == 0o600
    assert json.loads(admin.key.path.read_text()) == {"management": {"key": admin.key.key}}
    for token in (None, "wrong"):
        async with admin.client(token) as client:
            answer = await client.get("/models")
        assert answer.status_code == 400
        assert answer.json()["type"] == "InvalidKeyException"
    async with admin.client() as client:
        assert (await client.get("/models")).json() == {"models": []}


async def test_register_describe_list_and_unregister(admin: Admin, tmp_path: Path) -> None:
    model_folder(tmp_path / "repo", "echo")
    async with admin.client() as client:
        answer = await client.post("/models", params={"url": "echo", "synchronous": "true"})
        assert answer.status_code == 200, answer.text
        assert (
            answer.json()["status"]
            == 'Model "echo" Version: None registered with in the server process (0 workers)'
        )
        again = await client.post("/models", params={"url": "echo", "synchronous": "true"})
        assert again.status_code == 409 and again.json()["type"] == "ConflictStatusException"
        described = (await client.get("/models/echo")).json()
        assert len(described) == 1
        echo = described[0]
        assert echo["modelName"] == "echo" and echo["parallelType"] == "in_process"
        assert echo["workers"][0]["pid"] == os.getpid() and echo["workers"][0]["status"] == "READY"
        listed = (await client.get("/models")).json()
        assert listed == {
            "models": [{"modelName": "echo", "modelUrl": str((tmp_path / "repo" / "echo").resolve())}]
        }
        gone = await client.delete("/models/echo")
        assert gone.status_code == 200 and gone.json()["status"] == 'Model "echo" unregistered'
        missing = await client.get("/models/echo")
        assert missing.status_code == 404
        assert missing.json() == {
            "code": 404,
            "type": "ModelNotFoundException",
            "message": "Model not found: echo",  # TorchServe's sentence
        }


async def test_pages_of_models(admin: Admin, tmp_path: Path) -> None:
    async with admin.client() as client:
        for i in range(5):
            model_folder(tmp_path / "repo", f"m{i}")
            assert (
                await client.post("/models", params={"url": f"m{i}", "synchronous": "true"})
            ).status_code == 200
        first = (await client.get("/models", params={"limit": 2})).json()
        assert [m["modelName"] for m in first["models"]] == ["m0", "m1"] and first["nextPageToken"] == "2"
        last = (await client.get("/models", params={"limit": 2, "next_page_token": 4})).json()
        assert [m["modelName"] for m in last["models"]] == ["m4"] and "nextPageToken" not in last
        bad = await client.get("/models", params={"limit": "many"})
        assert bad.status_code == 400 and bad.json()["type"] == "BadRequestException"


async def test_versions_default_and_removal(admin: Admin, tmp_path: Path) -> None:
    async with admin.client() as client:
        for version in ("1", "2"):
            folder = model_folder(tmp_path / "repo", "v", version)
            answer = await client.post("/models", params={"url": str(folder), "synchronous": "true"})
            assert answer.status_code == 200, answer.text
        every = (await client.get("/models/v/all")).json()
        assert sorted(d["modelVersion"] for d in every) == ["1", "2"]
        assert [d["isDefault"] for d in sorted(every, key=lambda d: d["modelVersion"])] == [False, True]
        answer = await client.put("/models/v/1/set-default")
        assert answer.json()["status"] == 'Default version successfully updated for model "v" to "1"'
        assert (await client.get("/models/v")).json()[0]["modelVersion"] == "1"
        refused = await client.delete("/models/v/1")
        assert (
            refused.status_code == 403
            and refused.json()["message"] == "Cannot remove default version for model v"
        )
        assert (await client.delete("/models/v/2")).status_code == 200
        assert (await client.delete("/models/v/1")).status_code == 200
        unknown = await client.put("/models/v/9/set-default")
        assert unknown.status_code == 404


async def test_registration_only_from_allowed_places(admin: Admin, tmp_path: Path) -> None:
    outside = model_folder(tmp_path / "elsewhere", "x")
    async with admin.client() as client:
        for url in (str(outside), "../elsewhere/x", "https://example.com/x.mar"):
            answer = await client.post("/models", params={"url": url, "synchronous": "true"})
            assert answer.status_code in (400, 403), (url, answer.text)
            assert answer.json()["code"] == answer.status_code
        assert (await client.post("/models")).json()["message"] == "Parameter url is required."
    # allowed_urls opens other places (full, case-insensitive match)
    other = Admin(tmp_path / "repo", None, allowed_urls=[f"{tmp_path}/elsewhere/.*"])
    async with other.client() as client:
        answer = await client.post("/models", params={"url": str(outside), "synchronous": "true"})
        assert answer.status_code == 200, answer.text
    await other.registry.unload_all()


async def test_register_an_archive_with_a_name(admin: Admin, tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "build", "packed")
    archive = tmp_path / "repo" / "packed.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(folder / "model-settings.json", arcname="model-settings.json")
    async with admin.client() as client:
        answer = await client.post(
            "/models", json={"url": "packed.tar.gz", "model_name": "renamed", "synchronous": True}
        )
        assert answer.status_code == 200, answer.text
        assert (await client.get("/models/renamed")).json()[0]["state"] == "READY"
        bad = await client.put("/models/renamed", params={"min_worker": 2, "max_worker": 1})
        assert bad.status_code == 400 and "max_worker" in bad.json()["message"]


async def test_unknown_paths_and_methods(admin: Admin) -> None:
    async with admin.client() as client:
        assert (await client.get("/nothing")).json()["type"] == "ResourceNotFoundException"
        assert (await client.patch("/models")).status_code == 405


def test_a_real_server_serves_management_on_its_own_port_with_a_key(tmp_path: Path) -> None:
    from tests.servers import start_server

    repo = tmp_path / "repo"
    model_folder(repo, "echo")
    key_file = tmp_path / "private" / "key_file.json"
    server = start_server(repo, "--management-key-file", str(key_file))
    try:
        address = server.endpoints["management"]
        assert address.startswith("127.0.0.1:")
        key = json.loads(key_file.read_text())["management"]["key"]
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        refused = httpx.get(f"http://{address}/models")
        assert refused.status_code == 400 and refused.json()["type"] == "InvalidKeyException"
        listed = httpx.get(f"http://{address}/models", headers={"Authorization": f"Bearer {key}"})
        assert [m["modelName"] for m in listed.json()["models"]] == ["echo"]
    finally:
        assert server.stop() == 0
    assert not key_file.exists()


def test_generated_keys_are_letters_and_digits_so_a_command_line_takes_them(tmp_path: Path) -> None:
    keys = {ManagementKey(str(tmp_path / f"key{i}.json")).key for i in range(200)}
    assert len(keys) == 200  # random
    assert all(len(key) == 32 and key.isascii() and key.isalnum() for key in keys)
