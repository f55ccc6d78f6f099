"""Warm-up requests: read from the settings or a file of the model's folder, served before the
model is READY on every load (on-demand loads too), and a failing one fails the load with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from runtime.core.warmup import WarmupError, warmup_requests
from runtime.settings import ModelSettings
from runtime.types import State
from tests.many_models import answer, body, serving_repository, write_model
from tests.models.ballast import Ballast


def settings_in(folder: Path, warmup: object) -> ModelSettings:
    path = folder / "model-settings.json"
    path.write_text(json.dumps({"name": "m", "warmup": warmup}))
    return ModelSettings.from_file(path)


def test_requests_from_the_settings_and_from_a_file(tmp_path: Path) -> None:
    assert warmup_requests(ModelSettings()) == []
    listed = warmup_requests(settings_in(tmp_path, [body(1), body(2)]))
    assert [r.inputs[0].data for r in listed] == [[1], [2]]
    (tmp_path / "warmup.jsonl").write_text(json.dumps(body(3)) + "\n\n" + json.dumps(body(4)) + "\n")
    from_file = warmup_requests(settings_in(tmp_path, "warmup.jsonl"))
    assert [r.inputs[0].data for r in from_file] == [[3], [4]]


@pytest.mark.parametrize(
    ("warmup", "file", "reason"),
    [
        ([{"inputs": "no"}], None, "warm-up request 1 is not an inference request: inputs"),
        ("missing.jsonl", None, "cannot read the warm-up file 'missing.jsonl'"),
        ("bad.jsonl", "{not json", "bad.jsonl line 1 is not an inference request"),
        ("../outside.jsonl", None, "lies outside the model's folder"),
    ],
)
def test_unreadable_warm_up_requests_say_why(
    tmp_path: Path, warmup: object, file: str | None, reason: str
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    if file is not None:
        (folder / "bad.jsonl").write_text(file)
    with pytest.raises(WarmupError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        warmup_requests(settings_in(folder, warmup))
    with pytest.raises(WarmupError, match="no folder"):
        warmup_requests(ModelSettings(warmup="w.jsonl"))


def model(server: object, name: str) -> Ballast:
    instance = server.registry.find(name).model  # type: ignore[attr-defined]
    assert isinstance(instance, Ballast)
    return instance


async def test_the_warm_up_runs_before_the_first_client_request(tmp_path: Path) -> None:
    write_model(tmp_path, "at-start", k=1, extra={"mib": 1}, warmup=[body(-1), body(-2)])
    folder = write_model(tmp_path, "on-demand", k=2, extra={"mib": 1}, warmup="warmup.jsonl")
    (folder / "warmup.jsonl").write_text(json.dumps(body(-3)) + "\n")
    write_model(tmp_path, "pinned", k=3, extra={"mib": 1}, pinned=True)
    async with serving_repository(tmp_path, max_loaded_models=2) as server:
        # with a limit and load_models_at_startup, models load at start while they fit
        assert model(server, "at-start").seen == [-1.0, -2.0]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
            assert answer(await http.post("/v2/models/at-start/infer", json=body(5))) == 6
            assert model(server, "at-start").seen == [-1.0, -2.0, 5.0]
            assert answer(await http.post("/v2/models/on-demand/infer", json=body(5))) == 7
            assert model(server, "on-demand").seen == [-3.0, 5.0]  # loaded on demand: warmed up first
            assert answer(await http.post("/v2/models/at-start/infer", json=body(6))) == 7
            assert model(server, "at-start").seen == [-1.0, -2.0, 6.0]  # loaded again: warmed up again


async def test_a_failing_warm_up_fails_the_load_with_its_reason(tmp_path: Path) -> None:
    write_model(tmp_path, "broken", k=1, extra={"mib": 1, "fail_on": -1}, warmup=[body(0), body(-1)])
    async with serving_repository(tmp_path, strict_readiness=False) as server:
        entry = server.registry.find("broken")
        assert entry.state is State.UNAVAILABLE and entry.model is None
        assert "warm-up request 2 of 2 failed" in entry.reason and "cannot serve -1" in entry.reason
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
            refused = await http.post("/v2/models/broken/infer", json=body(1))
            assert refused.status_code == 503
            assert "warm-up request 2 of 2 failed" in refused.json()["error"]
