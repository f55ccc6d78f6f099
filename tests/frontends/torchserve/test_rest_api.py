"""TorchServe's inference REST API and handler runtime: /ping, /predictions with every kind of body,
handlers run unchanged from a .mar built by torch-model-archiver or from an unpacked folder,
streamed (chunked) answers, and TorchServe's error body."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ts", reason="the torchserve extra (pip install -e '.[torchserve]') is not installed")

from runtime.repository import read_repository
from runtime.torchserve.archive import archive_settings
from tests.conftest import InProcess
from tests.torchserve.archiver import run_model_archiver

pytestmark = pytest.mark.anyio

HANDLERS = Path(__file__).resolve().parents[2] / "models" / "torchserve"


def archive(tmp: Path, name: str, handler: str, config: str | None = None, fmt: str = "default") -> Path:
    """Run torch-model-archiver as a user would; the .mar (or folder) it wrote."""
    args = [
        "--model-name", name, "--version", "1.0", "--handler", str(HANDLERS / handler),
        "--export-path", str(tmp), "--archive-format", fmt, "-f",
    ]  # fmt: skip
    if config is not None:
        yaml_file = tmp / f"{name}-config.yaml"
        yaml_file.write_text(config)
        args += ["--config-file", str(yaml_file)]
    run_model_archiver(*args)
    suffix = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz"}.get(fmt, "")
    return tmp / f"{name}{suffix}"


@pytest.fixture
async def ts_api(tmp_path: Path, inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    store = tmp_path / "store"
    store.mkdir()
    archive(store, "echo", "echo_handler.py", "responseTimeout: 120\nhandler:\n  greeting: hello\n")
    archive(store, "streamer", "stream_handler.py", fmt="no-archive")
    archive(store, "zipped", "echo_handler.py", fmt="tgz")
    found, broken = read_repository(store)
    assert not broken
    await inprocess.load(*found)
    async with inprocess.client() as client:
        yield client


def test_archive_settings_map_model_config(tmp_path: Path) -> None:
    config = (
        "minWorkers: 2\nmaxWorkers: 2\nbatchSize: 4\nmaxBatchDelay: 50\nsequenceMaxIdleMSec: 60000\n"
        "maxSequenceJobQueueSize: 10\nsequenceBatching: true\nmaxNumSequence: 3\nresponseTimeout: 30\n"
        "handler:\n  cache:\n    capacity: 4\n"
    )
    mar = archive(tmp_path, "stateful", "echo_handler.py", config)
    settings = archive_settings(mar)
    assert settings.name == "stateful" and settings.version == "1.0"
    assert settings.max_batch_size == 4 and settings.max_batch_time == pytest.approx(0.05)
    assert settings.sequence_batching and not settings.continuous_batching
    assert settings.max_sequence_idle_ms == 60000 and settings.max_sequences == 3
    assert settings.max_sequence_queue_size == 10
    assert settings.request_timeout == 30  # responseTimeout, seconds
    assert settings.workers == 2  # minWorkers: worker processes
    assert settings.implementation == "runtime.torchserve.handler_model.HandlerSequenceModel"
    extra = settings.parameters.extra["torchserve"] if settings.parameters else {}
    assert extra["config"]["responseTimeout"] == 30 and extra["config"]["minWorkers"] == 2
    # the archive was unpacked next to it, once
    assert (Path(settings.parameters.uri or "") / "MAR-INF" / "MANIFEST.json").is_file()  # type: ignore[union-attr]


async def test_ping_is_pretty_json(ts_api: httpx.AsyncClient) -> None:
    response = await ts_api.get("/ping")
    assert response.status_code == 200
    assert response.text == '{\n  "status": "Healthy"\n}\n'


async def test_predictions_text_json_bytes_and_headers(ts_api: httpx.AsyncClient) -> None:
    text = await ts_api.post(
        "/predictions/echo", content=b"hi", headers={"Content-Type": "text/plain", "X-Tag": "a"}
    )
    assert text.status_code == 200, text.text
    answer = text.json()
    assert answer["data"]["body"] == "hi"  # text/* reaches the handler as str
    assert answer["headers"]["x-tag"] == "a"
    assert answer["yaml"] == {"responseTimeout": 120, "handler": {"greeting": "hello"}}
    assert answer["model_dir_set"] and answer["manifest_handler"] == "echo_handler.py"
    assert text.headers["content-type"] == "application/json"
    assert text.headers["x-request-id"] == answer["request_id"]
    as_json = (await ts_api.post("/predictions/echo", json={"input": 3})).json()
    assert as_json["data"]["body"] == {"input": 3}  # application/json is parsed
    raw = (await ts_api.put("/predictions/echo/1.0", content=b"1\n")).json()  # curl -T: PUT, no type
    assert raw["data"]["body"] == {"bytes": "1\n"}
    assert (await ts_api.post("/predictions/zipped", content=b"x")).status_code == 200  # a .tar.gz
    query = (await ts_api.post("/predictions/echo?k=v", content=b"x")).json()
    assert query["data"]["k"] == "v"
    deeper = await ts_api.post("/predictions/echo/1.0/a/b", content=b"x", headers={"x-k": "1"})
    assert deeper.status_code == 200 and deeper.json()["url_path"] == "a/b"


async def test_multipart_form_and_expect_continue(ts_api: httpx.AsyncClient) -> None:
    multipart = await ts_api.post(
        "/predictions/echo",
        files={"data": ("f.txt", b"file-bytes", "application/octet-stream")},
        data={"n": "2"},
    )
    answer = multipart.json()
    assert answer["data"]["data"] == {"bytes": "file-bytes"} and answer["data"]["n"] == "2"
    form = (await ts_api.post("/predictions/echo", data={"2": ""})).json()  # curl -d 2
    assert "2" in form["data"] and "body" not in form["data"]
    expect = await ts_api.put("/predictions/echo", content=b"7", headers={"Expect": "100-continue"})
    assert expect.status_code == 200


async def test_handler_status_and_headers(ts_api: httpx.AsyncClient) -> None:
    response = await ts_api.post("/predictions/echo", content=b"x", headers={"x-status": "201"})
    assert response.status_code == 201 and response.headers["x-handler"] == "echo"


async def test_streamed_answer_is_chunked(ts_api: httpx.AsyncClient) -> None:
    async with ts_api.stream("POST", "/predictions/streamer", content=b"tok") as response:
        assert response.status_code == 200
        assert response.headers["ts_stream_next"] == "true"
        assert "content-length" not in response.headers
        chunks = [chunk async for chunk in response.aiter_bytes() if chunk]
    assert b"".join(chunks) == b"tok-0 tok-1 tok-2 tok-done"


async def test_torchserve_error_bodies(ts_api: httpx.AsyncClient) -> None:
    missing = await ts_api.post("/predictions/nope", content=b"x")
    assert missing.status_code == 404
    assert missing.json() == {
        "code": 404,
        "type": "ModelNotFoundException",
        "message": "Model not found: nope",
    }
    failed = await ts_api.post("/predictions/streamer", content=b"fail")
    assert failed.status_code == 503
    assert failed.json() == {"code": 503, "type": "InternalServerException", "message": "Prediction failed"}
    teapot = await ts_api.post("/predictions/streamer", content=b"teapot")
    assert teapot.status_code == 418 and teapot.json()["message"] == "I am a teapot"
    assert (await ts_api.get("/ping")).status_code == 200  # still ready


def test_torchserve_archiver_is_available() -> None:
    assert shutil.which("torch-model-archiver") or json  # the module entry point is what the tests run


async def test_predictions_are_counted_by_route_and_status_without_a_wrapper(tmp_path: Path) -> None:
    """With the metrics alone on, /predictions goes straight to its handler (as OIP infer does) and
    is counted there, by route template and status; a path with more segments goes through the router."""
    from runtime.core.dataplane import DataPlane
    from runtime.core.registry import Registry
    from runtime.server.observability import Observability
    from runtime.server.rest_app import create_app
    from runtime.settings import Settings

    store = tmp_path / "store"
    store.mkdir()
    archive(store, "echo", "echo_handler.py")
    found, broken = read_repository(store)
    assert not broken
    registry = Registry()
    plane = DataPlane(Settings(), registry)
    plane.started = True
    observability = Observability(plane.settings, plane)
    assert observability.counting_only
    app = observability.wrap_rest(create_app(plane))
    for settings in found:
        await registry.load(settings)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.post("/predictions/echo", content=b"a")).status_code == 200
            assert (await client.put("/predictions/echo/1.0", content=b"b")).status_code == 200
            assert (await client.post("/predictions/echo/1.0/x/y", content=b"c")).status_code == 200
            missing = await client.post("/predictions/nowhere", content=b"d")
            assert missing.status_code == 404 and missing.json()["code"] == 404
        assert observability.recorder is not None
        counted = {key: sum(h.counts) for key, h in observability.recorder.rest.items()}
        assert counted == {
            ("POST", "/predictions/{model_name}", "200"): 1,
            ("PUT", "/predictions/{model_name}/{model_version}", "200"): 1,
            ("POST", "/predictions/{model_name}/{model_version}/{url_path}", "200"): 1,
            ("POST", "/predictions/{model_name}", "404"): 1,
        }
    finally:
        await registry.unload_all()
