"""A model's code comes from its own folder only, and errors name files relative to the repository."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.servers import RunningServer, start_server

GOOD = """
from runtime.model import MLModel
from runtime.types import InferenceResponse, ResponseOutput


class Good(MLModel):
    async def predict(self, payload):
        return InferenceResponse(
            model_name=self.name, outputs=[ResponseOutput(name="ok", shape=[1], datatype="INT64", data=[1])]
        )
"""

EVIL = """
from pathlib import Path

Path({marker!r}).write_text("imported")

from runtime.model import MLModel


class Model(MLModel):
    pass
"""

MISSING_WEIGHTS = """
from runtime.model import MLModel


class Model(MLModel):
    async def load(self):
        open(self.settings.folder / "weights.bin", "rb")
        return True
"""

MISSING_AT_INFERENCE = """
from runtime.model import MLModel


class Model(MLModel):
    async def predict(self, payload):
        open(self.settings.folder / "table.bin", "rb")

    async def predict_stream(self, payloads):
        async for payload in payloads:
            open(self.settings.folder / "table.bin", "rb")
            yield payload
"""


def _model(folder: Path, implementation: str, code: dict[str, str] | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / "model-settings.json").write_text(json.dumps({"implementation": implementation}))
    for name, text in (code or {}).items():
        (folder / name).write_text(text)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("folders")
    repo = base / "repo"
    outside = base / "outside"
    outside.mkdir()
    marker = base / "imported-from-outside"
    (outside / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (repo).mkdir()
    (repo / "evil.py").write_text(EVIL.format(marker=str(marker)))  # beside the model folders
    _model(repo / "good", ".model.Good", {"model.py": GOOD})
    _model(repo / "plain", "model.Good", {"model.py": GOOD})
    _model(repo / "dotdot", "..evil.Model")
    # a leading dot used to make an absolute path of the rest: /…/outside/evil.py
    absolute = "." + ".".join((outside / "evil").parts[1:]) + ".Model"
    _model(repo / "absolute", absolute)
    _model(repo / "weights", "model.Model", {"model.py": MISSING_WEIGHTS})
    _model(repo / "lookup", "model.Model", {"model.py": MISSING_AT_INFERENCE})
    (repo / "badjson").mkdir()
    (repo / "badjson" / "model-settings.json").write_text("{not json")
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[RunningServer]:
    running = start_server(repository, "--no-strict-readiness")
    yield running
    running.stop()


def _infer(server: RunningServer, model: str) -> httpx.Response:
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]}
    return httpx.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def test_implementations_from_the_model_folder_load(server: RunningServer) -> None:
    for model in ("good", "plain"):
        response = _infer(server, model)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [1]


@pytest.mark.parametrize("model", ["dotdot", "absolute"])
def test_an_implementation_outside_the_model_folder_is_refused(
    server: RunningServer, repository: Path, model: str
) -> None:
    ready = httpx.get(f"{server.http_url}/v2/models/{model}/ready")
    assert ready.status_code == 503
    error = ready.json()["error"]
    assert "failed to load: RepositoryError: implementation" in error
    assert any(why in error for why in ("outside the model's folder", "no file", "must be a dotted path"))
    assert not (repository.parent / "imported-from-outside").exists()


def test_error_bodies_name_files_relative_to_the_repository(server: RunningServer, repository: Path) -> None:
    ready = httpx.get(f"{server.http_url}/v2/models/weights/ready")
    assert ready.status_code == 503
    error = ready.json()["error"]
    assert "weights/weights.bin" in error and str(repository) not in error
    index = httpx.post(f"{server.http_url}/v2/repository/index", json={}).json()
    reasons = " ".join(item.get("reason", "") for item in index)
    assert "weights/weights.bin" in reasons and str(repository.parent) not in reasons
    key = server.authorization()
    load = httpx.post(f"{server.http_url}/v2/repository/models/weights/load", headers=key, timeout=30)
    assert load.status_code >= 400 and "weights/weights.bin" in load.json()["error"]
    assert str(repository) not in load.text
    unreadable = httpx.post(f"{server.http_url}/v2/repository/models/badjson/load", headers=key, timeout=30)
    assert unreadable.status_code >= 400 and "badjson/model-settings.json" in unreadable.json()["error"]
    assert str(repository) not in unreadable.text


def test_a_model_failing_at_inference_names_files_relative_to_the_repository(
    server: RunningServer, repository: Path
) -> None:
    from runtime.frontends.grpc.generated import dataplane_pb2 as pb
    from tests.grpc_support import inference_stub

    answer = _infer(server, "lookup")
    assert answer.status_code == 500 and "lookup/table.bin" in answer.json()["error"]
    assert str(repository) not in answer.text
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]}
    with httpx.stream(
        "POST", f"{server.http_url}/v2/models/lookup/infer_stream", json=body, timeout=30
    ) as sse:
        text = sse.read().decode()
    assert "lookup/table.bin" in text and str(repository) not in text
    request = pb.ModelInferRequest(model_name="lookup", id="r1")
    request.inputs.add(name="x", datatype="INT64", shape=[1]).contents.int64_contents.append(1)
    with inference_stub(server.grpc_address) as stub:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
        assert "lookup/table.bin" in caught.value.details() and str(repository) not in caught.value.details()
        replies = list(stub.ModelStreamInfer(iter([request]), timeout=30))
    error = replies[0].parameters["error"].string_param
    assert "lookup/table.bin" in error and str(repository) not in error
