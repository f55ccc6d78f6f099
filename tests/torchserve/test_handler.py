"""``runtime.torchserve.handler``: a TorchServe handler loaded as TorchServe's worker loads it and run
batch by batch through ``ts.service.Service``, its answers read back from TorchServe's own encoding.

The handlers are the suite's (``tests/models/torchserve``), packaged by torch-model-archiver as a
user would package them."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ts", reason="the torchserve extra (pip install -e '.[torchserve]') is not installed")

import ts
from ts.context import Context, RequestProcessor
from ts.handler_utils.utils import send_intermediate_predict_response
from ts.protocol.otf_message_handler import create_predict_response

from runtime.errors import ModelFailed
from runtime.torchserve.archive import read_manifest
from runtime.torchserve.handler import (
    HandlerFailed,
    HandlerRunner,
    _load_module,
    _plain,
    decode_predict_response,
)
from runtime.torchserve.payload import Answer, Row
from tests.frontends.torchserve.test_rest_api import HANDLERS, archive

CONFIG = "handler:\n  greeting: hello\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The handlers as unpacked archives (``--archive-format no-archive``), built once for the module."""
    store = tmp_path_factory.mktemp("handlers")
    archive(store, "echo", "echo_handler.py", CONFIG, fmt="no-archive")
    archive(store, "streamer", "stream_handler.py", fmt="no-archive")
    archive(store, "summer", "explain_handler.py", fmt="no-archive")
    return store


@pytest.fixture(autouse=True)
def own_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``load`` puts the model's folder on ``sys.path``; each test's folders leave with the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def runner(store: Path, name: str, batch_size: int = 4, handler: str | None = None) -> HandlerRunner:
    folder = store / name
    manifest = read_manifest(folder)
    if handler is not None:
        manifest["model"]["handler"] = handler
    loaded = HandlerRunner(name, folder, manifest, batch_size)
    loaded.load()
    return loaded


@pytest.fixture
def echo(store: Path) -> HandlerRunner:
    return runner(store, "echo")


@pytest.fixture
def streamer(store: Path) -> HandlerRunner:
    return runner(store, "streamer")


@pytest.fixture
def summer(store: Path) -> HandlerRunner:
    return runner(store, "summer")


def row(request_id: str, body: Any, content_type: str | None = None, **headers: str) -> Row:
    return Row(request_id, {"body": body}, {"body": content_type}, headers)


def seen(answer: Answer) -> Any:
    """What the echo handler saw, as it answered it."""
    return json.loads(answer.body)


# loading a handler


@pytest.fixture
def two_folders(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The echo handler's file in two model folders of its own."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        shutil.copy(HANDLERS / "echo_handler.py", folder)
    yield first, second
    for name in [name for name in sys.modules if name.startswith("_torchserve_handlers.")]:
        if str(tmp_path) in str(getattr(sys.modules[name], "__file__", "")):
            del sys.modules[name]


def test_a_handler_file_is_imported_once_per_folder_under_a_name_of_its_own(
    two_folders: tuple[Path, Path],
) -> None:
    first, second = two_folders
    module, function = _load_module("echo_handler.py", first)
    assert function is None
    assert module.__name__.startswith("_torchserve_handlers.h") and module.__name__.endswith(".echo_handler")
    assert Path(module.__file__ or "") == first / "echo_handler.py"
    # the file named with or without its suffix, with a function or without: the one module
    assert _load_module("echo_handler", first) == (module, None)
    assert _load_module("echo_handler.py:handle", first) == (module, "handle")
    other, _ = _load_module("echo_handler.py", second)
    assert other is not module and other.__name__ != module.__name__
    assert Path(other.__file__ or "") == second / "echo_handler.py"
    # registered under its own name alone: no plain "echo_handler" that two models would share
    assert [name for name, m in sys.modules.items() if m is module] == [module.__name__]


def test_a_handler_that_fails_to_import_is_imported_afresh_once_fixed(tmp_path: Path) -> None:
    source = (HANDLERS / "echo_handler.py").read_text()
    handler = tmp_path / "echo_handler.py"
    handler.write_text(source + "\nraise RuntimeError('broken at import')\n")
    with pytest.raises(RuntimeError, match="broken at import"):
        _load_module("echo_handler.py", tmp_path)
    assert not [m for m in sys.modules.values() if getattr(m, "__file__", None) == str(handler)]
    handler.write_text(source)
    module, _ = _load_module("echo_handler.py", tmp_path)
    assert callable(module.handle)
    del sys.modules[module.__name__]


@pytest.mark.parametrize(
    ("handler", "module_name", "function"),
    [
        ("base_handler", "ts.torch_handler.base_handler", None),  # a built-in, as the archiver names it
        ("ts.torch_handler.base_handler", "ts.torch_handler.base_handler", None),
        ("tests.models.torchserve.echo_handler:handle", "tests.models.torchserve.echo_handler", "handle"),
    ],
)
def test_a_handler_not_in_the_model_folder_is_a_built_in_or_a_module_path(
    tmp_path: Path, handler: str, module_name: str, function: str | None
) -> None:
    module, named = _load_module(handler, tmp_path)
    assert (module.__name__, named) == (module_name, function)


def test_a_built_in_handler_whose_dependency_is_missing_names_that_dependency(tmp_path: Path) -> None:
    """TorchServe's image_classifier imports torchvision: without it, the error says torchvision,
    not that no handler of that name exists."""
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: the built-in image_classifier imports")
    with pytest.raises(ModuleNotFoundError) as missing:
        _load_module("image_classifier", tmp_path)
    assert missing.value.name == "torchvision"


@pytest.mark.parametrize("handler", ["echo_handler", "echo_handler.py:handle"])
def test_load_gives_the_handler_torchserves_context(store: Path, handler: str) -> None:
    loaded = runner(store, "echo", batch_size=3, handler=handler)
    context = loaded.context
    folder = str((store / "echo").resolve())
    assert context.model_name == "echo"
    assert context.manifest["model"]["handler"] == handler
    assert context.model_yaml_config == {"handler": {"greeting": "hello"}}
    assert context.system_properties["model_dir"] == folder
    assert context.system_properties["batch_size"] == 3
    assert sys.path[0] == folder  # the handler imports the files beside it, as in a TorchServe worker
    (answer,) = loaded.run([row("r", b"x")])
    assert seen(answer)["manifest_handler"] == handler


# answers as TorchServe encodes them


def test_answers_are_read_back_as_torchserve_encodes_them() -> None:
    context = Context("m", "/models/m", {}, 3, None, ts.__version__)
    context.request_processor = [RequestProcessor({}) for _ in range(3)]
    context.set_response_status(201, "Made", 0)
    context.set_response_header(0, "x-a", "1")
    context.set_response_content_type(1, "text/plain; charset=utf-8")
    message = create_predict_response(
        ["text", b"\x00\xff", {"a": [1, 2]}], {0: "r0", 1: "r1", 2: "r2"}, "Prediction success", 200, context
    )
    assert decode_predict_response(bytes(message)) == (
        200,
        "Prediction success",
        [
            Answer(b"text", 201, "Made", {"x-a": "1"}),
            Answer(b"\x00\xff", 200, "", {"content-type": "text/plain; charset=utf-8"}),
            Answer(json.dumps({"a": [1, 2]}, indent=2).encode(), 200, "", {}),
        ],
    )


def test_a_batch_failure_is_read_back_with_its_code_and_message() -> None:
    message = create_predict_response(None, {0: "a", 1: "b"}, "Prediction failed", 503)
    code, text, answers = decode_predict_response(bytes(message))
    assert (code, text) == (503, "Prediction failed")
    assert answers == [Answer(b"error", 503, "", {}), Answer(b"error", 503, "", {})]


def test_plain_turns_arrays_and_bytes_into_json_and_refuses_anything_else() -> None:
    assert _plain(np.arange(4, dtype=np.float32).reshape(2, 2)) == [[0.0, 1.0], [2.0, 3.0]]
    assert _plain(np.int64(7)) == 7
    assert _plain("café".encode()) == "café"
    assert _plain(bytearray(b"\xffok")) == "\ufffdok"
    assert json.dumps({"scores": np.array([0.5])}, default=_plain) == '{"scores": [0.5]}'
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        _plain(object())


# one batch through the handler


def test_the_handler_gets_each_rows_data_id_and_headers(echo: HandlerRunner) -> None:
    rows = [
        Row(
            "r0",
            {"body": b"hi", "q": "v"},
            {"body": None, "q": "text/plain"},
            {"x-tag": "a", "Accept": "*/*"},
        ),
        row("r1", {"a": 1}, "application/json", **{"x-tag": "b"}),
    ]
    first, second = (seen(answer) for answer in echo.run(rows))
    assert first["data"] == {"body": {"bytes": "hi"}, "q": "v"}
    assert second["data"] == {"body": {"a": 1}}
    assert (first["request_id"], second["request_id"]) == ("r0", "r1")
    assert first["batch"] == second["batch"] == 2
    assert (first["headers"], second["headers"]) == ({"x-tag": "a"}, {"x-tag": "b"})
    assert first["yaml"] == {"handler": {"greeting": "hello"}} and first["model_dir_set"]
    # every entry is also a pseudo-header that carries its content type, beside the request's headers
    assert echo.context.get_all_request_header(0) == {
        "body": {"content-type": None},
        "q": {"content-type": "text/plain"},
        "x-tag": "a",
        "Accept": "*/*",
    }
    assert echo.context.request_ids == {0: "r0", 1: "r1"}


def test_the_sequence_engines_headers_replace_the_clients(echo: HandlerRunner) -> None:
    client = {"TS_Request_Sequence_Id": "forged", "ts_request_sequence_end": "true", "x-tag": "kept"}
    rows = [row("r0", b"x", **client), row("r1", b"y", **client)]
    echo.run(rows, extra_headers=[{"ts_request_sequence_id": "s1", "ts_request_sequence_start": "true"}, {}])
    assert echo.context.get_all_request_header(0) == {
        "body": {"content-type": None},
        "x-tag": "kept",
        "ts_request_sequence_id": "s1",
        "ts_request_sequence_start": "true",
    }
    assert echo.context.get_sequence_id(0) == "s1"
    assert echo.context.get_all_request_header(1) == {"body": {"content-type": None}, "x-tag": "kept"}
    echo.run([row("r2", b"z", **client)])  # without the engine's word, the client's headers go as sent
    assert echo.context.get_request_header(0, "TS_Request_Sequence_Id") == "forged"


def test_a_status_phrase_and_headers_set_for_one_row_are_that_rows(echo: HandlerRunner) -> None:
    answers = echo.run([row("r0", b"x", **{"x-status": "201"}), row("r1", b"y")])
    assert [(a.status, a.phrase, a.headers) for a in answers] == [
        (201, "Custom", {"x-handler": "echo", "content-type": "application/json"}),
        (200, "", {"content-type": "application/json"}),
    ]


def test_objects_a_handler_returns_are_torchserves_indented_json(summer: HandlerRunner) -> None:
    answers = summer.run([row("r0", b"[1, 2]"), row("r1", "[0.5]", "text/plain")])
    assert [a.body for a in answers] == [
        json.dumps({"sum": 3.0, "batch": 2}, indent=2).encode(),
        json.dumps({"sum": 0.5, "batch": 2}, indent=2).encode(),
    ]
    assert [a.headers for a in answers] == [{}, {}]


def test_kserve_instances_get_the_instance_itself_and_their_answer_as_json(summer: HandlerRunner) -> None:
    instance = Row("r0", {"body": [1, 2, 3]}, {"body": "application/json"}, {}, instance=True)
    answers = summer.run([instance, row("r1", b"[4]")])
    assert (answers[0].body, answers[0].headers) == (
        b'{"sum": 6.0, "batch": 2}',
        {"content-type": "application/json"},
    )
    assert (answers[1].body, answers[1].headers) == (
        json.dumps({"sum": 4.0, "batch": 2}, indent=2).encode(),
        {},
    )


def test_an_instances_answer_is_the_object_the_handler_returned_and_only_for_its_batch(
    echo: HandlerRunner,
) -> None:
    instance = Row("r0", {"body": {"a": 1}}, {"body": "application/json"}, {}, instance=True)
    (answer,) = echo.run([instance])
    returned = json.loads(answer.body)  # the handler returned a str: it reads back as that str
    assert isinstance(returned, str) and json.loads(returned)["data"] == {"a": 1}
    (plain,) = echo.run([row("r1", {"a": 1}, "application/json")])
    assert seen(plain)["data"] == {"body": {"a": 1}}


# streamed answers and failures


def late(loaded: HandlerRunner) -> None:
    """An intermediate answer sent on the handler's context after its batch has ended."""
    context = loaded.context
    send_intermediate_predict_response(["late"], context.request_ids, "Intermediate", 200, context)


def test_intermediate_answers_reach_the_sink_before_the_last_one(streamer: HandlerRunner) -> None:
    chunks: list[list[Answer]] = []
    (last,) = streamer.run([row("r0", b"tok")], sink=chunks.append)
    assert chunks == [[Answer(f"tok-{i} ".encode(), 200, "", {"ts_stream_next": "true"})] for i in range(3)]
    assert all(chunk[0].streams_on for chunk in chunks)
    assert last == Answer(b"tok-done", 200, "", {"ts_stream_next": "false"})
    assert not last.streams_on
    late(streamer)  # sent once the batch is over (from a thread the handler left running, say)
    assert len(chunks) == 3


def test_intermediate_answers_outside_a_streamed_request_are_dropped(
    streamer: HandlerRunner, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="runtime.torchserve.handler"):
        (last,) = streamer.run([row("r0", b"tok")])
    assert last.body == b"tok-done"
    dropped = [r for r in caplog.records if "outside a streamed request" in r.getMessage()]
    assert len(dropped) == 3


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [(b"fail", 503, "Prediction failed"), (b"teapot", 418, "I am a teapot")],
)
def test_a_handler_that_raises_fails_the_batch_with_torchserves_code(
    streamer: HandlerRunner, body: bytes, status: int, message: str
) -> None:
    chunks: list[list[Answer]] = []
    with pytest.raises(HandlerFailed) as failed:
        streamer.run([row("r0", body)], sink=chunks.append)
    assert isinstance(failed.value, ModelFailed)
    assert (failed.value.status, str(failed.value)) == (status, message)
    late(streamer)
    assert chunks == []


def first_row_only(data: list[dict[str, Any]] | None, context: Any) -> list[str] | None:
    """A function handler (named by its module path) that answers only the first row of a batch."""
    return None if data is None else ["first"]


def test_a_batch_answered_with_too_few_answers_fails(tmp_path: Path) -> None:
    manifest = {"model": {"modelName": "short", "handler": f"{__name__}:first_row_only"}}
    short = HandlerRunner("short", tmp_path, manifest, 2)
    short.load()
    assert short.run([row("r0", b"a")]) == [Answer(b"first")]
    with pytest.raises(HandlerFailed) as failed:
        short.run([row("r0", b"a"), row("r1", b"b")])
    assert (failed.value.status, str(failed.value)) == (503, "number of batch response mismatched")
