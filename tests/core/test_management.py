"""The management operations called directly, in process, on a real registry: register, list,
describe, scale, set-default and unregister, and the errors each refuses with (TorchServe's
status and exception type through the one table both management front ends answer with)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.codecs import NumpyCodec
from runtime.core.management import Management, Registered
from runtime.errors import Conflict, Forbidden, InvalidInput, ModelFailed, ModelNotFound, ServerError
from runtime.frontends.torchserve.error_body import describe as torchserve_error
from runtime.settings import Settings
from runtime.types import InferenceRequest, State
from tests.conftest import EXAMPLES, InProcess
from tests.frontends.management.test_api import model_folder
from tests.many_models import body, write_model
from tests.models.ballast import LOADED

pytestmark = pytest.mark.anyio


class Managed(InProcess):
    """A registry and its DataPlane in this process, with the management operations on them."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.management = Management(self.settings, self.registry)

    async def ask(self, name: str, x: float, version: str | None = None) -> tuple[list[float], str | None]:
        """What the model answers for x, and which version answered."""
        request = InferenceRequest.model_validate(body(x))
        response = await self.dataplane.infer(request, name, version)
        return NumpyCodec.decode_output(response.outputs[0]).tolist(), response.model_version

    def names(self) -> list[str]:
        return [m["modelName"] for m in self.management.list_models()["models"]]


@asynccontextmanager
async def managed(root: Path, **settings: Any) -> AsyncIterator[Managed]:
    server = Managed(Settings(model_repository_root=str(root), **settings))
    try:
        yield server
    finally:
        await server.management.close()
        await server.registry.unload_all()


def refusal(error: ServerError) -> tuple[int, str]:
    """The status and TorchServe exception type a management front end answers ``error`` with."""
    status, kind, _ = torchserve_error(error)
    return status, kind


async def test_a_folder_of_the_repository_is_registered_listed_described_and_answers() -> None:
    async with managed(EXAMPLES) as server:
        registered = await server.management.register("echo", synchronous=True)
        assert registered == Registered("echo", "1", 0, True)
        assert (
            registered.status() == 'Model "echo" Version: 1 registered with in the server process (0 workers)'
        )
        assert server.management.list_models() == {
            "models": [{"modelName": "echo", "modelUrl": str(EXAMPLES / "echo")}]
        }
        [described] = server.management.describe("echo")
        assert {k: described[k] for k in ("modelName", "modelVersion", "implementation", "state")} == {
            "modelName": "echo",
            "modelVersion": "1",
            "implementation": "model.EchoModel",
            "state": "READY",
        }
        assert described["isDefault"] is True and described["parallelType"] == "in_process"
        assert [w["status"] for w in described["workers"]] == ["READY"]
        assert await server.ask("echo", 2.5) == ([2.5], "1")


async def test_a_registration_without_synchronous_loads_in_the_background(tmp_path: Path) -> None:
    write_model(tmp_path, "late", 3.0, extra={"mib": 1})
    async with managed(tmp_path) as server:
        registered = await server.management.register("late", workers=0)
        assert registered.status() == 'Model "late" Version: None registration started'
        # the load the call started is the one pending task of the management operations
        for task in list(server.management._tasks):
            await task
        assert server.registry.find("late").state is State.READY
        assert await server.ask("late", 1.0) == ([4.0], None)


async def test_the_same_model_twice_is_a_conflict_and_the_first_keeps_serving(tmp_path: Path) -> None:
    write_model(tmp_path, "once", 10.0, extra={"mib": 1})
    async with managed(tmp_path) as server:
        await server.management.register("once", synchronous=True)
        first = LOADED["once"]
        with pytest.raises(Conflict) as refused:
            await server.management.register("once", synchronous=True)
        assert refusal(refused.value) == (409, "ConflictStatusException")
        assert LOADED["once"] is first and first.weights is not None
        assert await server.ask("once", 1.0) == ([11.0], None)
        # under another name the same folder is a second model
        renamed = await server.management.register("once", name="twice", synchronous=True)
        assert renamed.name == "twice"
        assert server.names() == ["once", "twice"]
        assert await server.ask("twice", 1.0) == ([11.0], None)


async def test_places_outside_the_repository_are_forbidden(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    outside = model_folder(tmp_path / "elsewhere", "stray")
    (repo / "link").symlink_to(outside, target_is_directory=True)
    async with managed(repo) as server:
        for url in (str(outside), f"file://{outside}", "../elsewhere/stray", "link"):
            with pytest.raises(Forbidden) as refused:
                await server.management.register(url, synchronous=True)
            assert refusal(refused.value) == (403, "ForbiddenException")
            assert refused.value.message == f"Given URL {url} does not match any allowed URL(s)"
        with pytest.raises(InvalidInput) as remote:
            await server.management.register("https://example.com/stray.mar", synchronous=True)
        assert refusal(remote.value) == (400, "BadRequestException")
        with pytest.raises(ModelNotFound) as missing:
            await server.management.register("absent", synchronous=True)
        assert refusal(missing.value)[0] == 404
        assert server.names() == []


async def test_allowed_urls_open_the_places_they_match(tmp_path: Path) -> None:
    allowed = model_folder(tmp_path / "allowed", "opened")
    other = model_folder(tmp_path / "other", "closed")
    async with managed(tmp_path / "repo", allowed_urls=[re.escape(f"{tmp_path}/") + "ALLOWED/.*"]) as server:
        assert (await server.management.register(str(allowed), synchronous=True)).name == "opened"
        with pytest.raises(Forbidden):
            await server.management.register(str(other), synchronous=True)
        assert server.names() == ["opened"]


async def test_what_register_refuses_before_reading_a_model(tmp_path: Path) -> None:
    model_folder(tmp_path / "two", "a")
    model_folder(tmp_path / "two", "b")
    (tmp_path / "notes.txt").write_text("not a model")
    write_model(tmp_path, "fine", 0.0, extra={"mib": 1})
    async with managed(tmp_path) as server:
        cases = {
            "": "Parameter url is required.",
            "notes.txt": "'notes.txt' is neither a folder nor an archive (.tar.gz, .tgz, .tar, .zip, .mar)",
            "two": "two holds 2 model-settings.json files; it must hold one",
        }
        for url, message in cases.items():
            with pytest.raises(InvalidInput) as refused:
                await server.management.register(url, synchronous=True)
            assert refused.value.message == message
        with pytest.raises(InvalidInput, match="initial_workers must not be negative"):
            await server.management.register("fine", workers=-1, synchronous=True)
        assert server.names() == []


async def test_a_model_that_fails_to_load_is_not_left_registered(tmp_path: Path) -> None:
    model_folder(tmp_path, "broken", implementation="tests.worker_models.NoSuchModel")
    async with managed(tmp_path) as server:
        with pytest.raises(ModelFailed, match="Model 'broken' could not be loaded: failed to load") as failed:
            await server.management.register("broken", synchronous=True)
        assert refusal(failed.value) == (500, "InternalServerException")
        assert server.names() == []
        # fixed in place, it registers
        settings = tmp_path / "broken" / "model-settings.json"
        settings.write_text(json.dumps({"name": "broken", "implementation": "tests.worker_models.Echo"}))
        assert (await server.management.register("broken", synchronous=True)).loaded
        assert server.names() == ["broken"]


async def test_the_default_version_among_two_takes_the_requests_naming_none(tmp_path: Path) -> None:
    for version in ("1", "2"):
        model_folder(tmp_path, "v", version)
    async with managed(tmp_path) as server:
        for version in ("1", "2"):
            registered = await server.management.register(f"v/{version}", synchronous=True)
            assert (registered.name, registered.version) == ("v", version)
        assert server.names() == ["v"]  # one model, listed once
        assert (await server.ask("v", 1.0))[1] == "2"  # the highest version, until one is chosen
        server.management.set_default("v", "1")
        assert [d["modelVersion"] for d in server.management.describe("v")] == ["1"]
        flags = {d["modelVersion"]: d["isDefault"] for d in server.management.describe("v", every=True)}
        assert flags == {"1": True, "2": False}
        assert (await server.ask("v", 1.0))[1] == "1"
        assert (await server.ask("v", 1.0, version="2"))[1] == "2"
        with pytest.raises(ModelNotFound) as unknown:
            server.management.set_default("v", "9")
        assert refusal(unknown.value) == (404, "ModelVersionNotFoundException")
        assert (await server.ask("v", 1.0))[1] == "1"


async def test_scaling_to_zero_keeps_the_model_in_the_server_process(tmp_path: Path) -> None:
    write_model(tmp_path, "scaled", 1.0, extra={"mib": 1})
    async with managed(tmp_path) as server:
        await server.management.register("scaled", synchronous=True)
        assert await server.management.scale("scaled", None, 0, 0, True) == 0
        [described] = server.management.describe("scaled")
        assert (described["state"], described["parallelType"], described["minWorkers"]) == (
            "READY",
            "in_process",
            0,
        )
        assert await server.ask("scaled", 2.0) == ([3.0], None)
        for low, high, message in (
            (-1, None, "min_worker must not be negative"),
            (2, 1, "max_worker cannot"),
        ):
            with pytest.raises(InvalidInput, match=message):
                await server.management.scale("scaled", None, low, high, True)
        with pytest.raises(ModelNotFound):
            await server.management.scale("absent", None, 0, None, True)
        with pytest.raises(ModelNotFound):
            await server.management.scale("scaled", "7", 0, None, True)


async def test_unregistering_unloads_the_model_and_forgets_it(tmp_path: Path) -> None:
    write_model(tmp_path, "gone", 1.0, extra={"mib": 1})
    write_model(tmp_path, "kept", 2.0, extra={"mib": 1})
    async with managed(tmp_path) as server:
        for name in ("gone", "kept"):
            await server.management.register(name, synchronous=True)
        instance = LOADED["gone"]
        await server.management.unregister("gone")
        assert "gone" not in LOADED and instance.weights is None
        assert server.names() == ["kept"]
        with pytest.raises(ModelNotFound):
            await server.ask("gone", 1.0)
        with pytest.raises(ModelNotFound):
            await server.management.unregister("gone")
        assert await server.ask("kept", 1.0) == ([3.0], None)


async def test_one_version_is_unregistered_but_never_the_default_while_others_remain(tmp_path: Path) -> None:
    for version in ("1", "2"):
        model_folder(tmp_path, "v", version)
    async with managed(tmp_path) as server:
        for version in ("1", "2"):
            await server.management.register(f"v/{version}", synchronous=True)
        with pytest.raises(Forbidden, match="Cannot remove default version for model v") as refused:
            await server.management.unregister("v", "2")
        assert refusal(refused.value) == (403, "ForbiddenException")
        await server.management.unregister("v", "1")
        assert [d["modelVersion"] for d in server.management.describe("v", every=True)] == ["2"]
        await server.management.unregister("v", "2")  # the last one may go
        assert server.names() == []


async def test_describing_an_unknown_model_or_version_is_not_found(tmp_path: Path) -> None:
    model_folder(tmp_path, "known")
    async with managed(tmp_path) as server:
        await server.management.register("known", synchronous=True)
        for every in (False, True):
            with pytest.raises(ModelNotFound) as unknown:
                server.management.describe("unknown", every=every)
            assert torchserve_error(unknown.value) == (
                404,
                "ModelNotFoundException",
                "Model not found: unknown",
            )
        with pytest.raises(ModelNotFound) as version:
            server.management.describe("known", "3")
        assert torchserve_error(version.value) == (
            404,
            "ModelVersionNotFoundException",
            "Model version: 3 does not exist for model: known",
        )


async def test_a_page_of_no_models_and_negative_pages_are_refused(tmp_path: Path) -> None:
    model_folder(tmp_path, "only")
    async with managed(tmp_path) as server:
        await server.management.register("only", synchronous=True)
        assert server.management.list_models(limit=0) == {"models": []}
        assert server.management.list_models(next_page_token=1) == {"models": []}
        for limit, token in ((-1, 0), (1, -1)):
            with pytest.raises(InvalidInput, match="must not be negative"):
                server.management.list_models(limit, token)


async def test_a_failure_in_the_background_is_logged_and_the_model_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No caller waits for a call answered before its work (``synchronous=false``): its failure is
    logged, naming the operation and why."""
    write_model(tmp_path, "m", 1.0, extra={"mib": 1})
    async with managed(tmp_path) as server:
        await server.management.register("m", synchronous=True)
        parameters = server.registry.find("m").settings.parameters
        assert parameters is not None
        parameters.extra["mib"] = "none"  # the instance that scaling loads fails to load
        assert await server.management.scale("m", None, 0, None, synchronous=False) == 0
        with caplog.at_level(logging.ERROR, logger="runtime.core.management"):
            await asyncio.gather(*server.management._tasks, return_exceptions=True)
        assert "Scaling model 'm' to 0 worker(s) failed: Model 'm' could not be reloaded" in caplog.text
        assert await server.ask("m", 1.0) == ([2.0], None)  # the instance before still serves
