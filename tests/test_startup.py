"""Start-up cost: what ``import runtime`` and the command line import, what an echo-only server
has imported once it is ready, and the cyclic collector around start-up.

Checked in fresh interpreters, since this test session has imported everything already.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

import runtime
from runtime.cli import main
from runtime.scheduling import gc_threshold
from runtime.server.serving import Server, fewer_collections
from runtime.settings import ModelSettings, Settings
from tests.conftest import EXAMPLES, ROOT

LOADING_GC_THRESHOLD = gc_threshold.YOUNG

HEAVY = ["numpy", "pydantic", "pydantic_settings", "grpc", "uvicorn", "starlette", "runtime.settings"]

# what an echo model served over REST and gRPC never needs
NOT_FOR_ECHO = [
    "torch",
    "transformers",
    "runtime.torch.torch_model",
    "runtime.huggingface",
    "mlflow",
    "pandas",
    "runtime.mlflow.mlflow_model",
    "sklearn",
    "joblib",
    "xgboost",
    "lightgbm",
    "onnxruntime",
    "runtime.tabular",
    "grpc_reflection.v1alpha.reflection",
    "sse_starlette",
    "tarfile",
    "email.policy",
    "google.rpc.error_details_pb2",
    "runtime.workers",
    "runtime.scheduling.adaptive",
    "runtime.scheduling.continuous_batching",
    "runtime.scheduling.sequence_batching",
    "runtime.scheduling.forwarding",
]

ECHO_SERVER = textwrap.dedent(
    """
    import asyncio, json, sys

    from runtime.server.serving import Server
    from runtime.settings import Settings
    from runtime.types import InferenceRequest, RequestInput

    async def serve():
        server = Server(Settings(model_repository_root=sys.argv[1], http_port=0, grpc_port=0,
                                 metrics_port=0, management_port=0))
        await server.start()
        loaded = sorted(name for name in json.loads(sys.argv[2]) if name in sys.modules)
        request = InferenceRequest(inputs=[RequestInput(name="x", shape=[1, 2], datatype="FP32", data=[1.0, 2.0])])
        response = await server.dataplane.infer(request, "echo")
        await server.stop()
        return loaded, response.outputs[0].data.tolist()

    print(json.dumps(asyncio.run(serve())))
    """
)


def _python(code: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_import_runtime_and_the_command_line_import_nothing_heavy() -> None:
    """``python -m runtime`` runs the command line before numpy, pydantic or grpc are imported, so
    that ``main`` imports them with the cyclic collector off."""
    code = f"import sys, runtime, runtime.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    assert _python(code) == "[]"


def test_the_public_names_are_imported_on_first_use() -> None:
    code = textwrap.dedent(
        """
        import json, sys, runtime
        found = {name: getattr(runtime, name).__module__ for name in runtime.__all__
                 if hasattr(getattr(runtime, name), "__module__")}
        print(json.dumps(found))
        """
    )
    found = json.loads(_python(code))
    assert found["MLModel"] == "runtime.model"
    assert found["Settings"] == "runtime.settings"
    assert found["ModelSettings"] == found["ModelParameters"] == "runtime.model_settings"
    assert found["SequenceStep"] == "runtime.sequences.sequence_model"
    assert found["decode_args"] == "runtime.codecs.decorator"
    for name in runtime.__all__:  # the same objects as their modules'
        assert getattr(runtime, name) is not None
    assert runtime.MLModel is runtime.model.MLModel
    assert runtime.codecs.NumpyCodec.__name__ == "NumpyCodec"
    assert set(runtime.__all__) <= set(dir(runtime))


def test_submodules_are_attributes_and_unknown_names_are_not() -> None:
    assert runtime.ids.__name__ == "runtime.ids"
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        _ = runtime.nothing_here
    with pytest.raises(AttributeError):
        _ = runtime._private
    assert getattr(runtime, "nothing_here.sub", None) is None  # not an import error
    assert not hasattr(runtime, "not a name")


def test_an_echo_server_imports_what_only_other_models_or_calls_need_on_first_use() -> None:
    loaded, echoed = json.loads(_python(ECHO_SERVER, str(EXAMPLES / "echo"), json.dumps(NOT_FOR_ECHO)))
    assert loaded == []
    assert echoed == [[1.0, 2.0]]


LATER_MODELS = [
    "runtime.types.MetadataModelResponse",
    "runtime.types.MetadataServerResponse",
    "runtime.types.MetadataServerErrorResponse",
    "runtime.types.MetadataModelErrorResponse",
    "runtime.types.InferenceErrorResponse",
    "runtime.types.RepositoryIndexRequest",
    "runtime.types.RepositoryIndexResponseItem",
    "runtime.core.generate.GenerateParameters",
    "runtime.core.generate.GenerateRequest",
]


def test_models_that_start_up_and_infer_do_not_use_are_built_by_their_first_use() -> None:
    code = ECHO_SERVER.replace(  # looked at after the server started and answered a request
        "    await server.stop()\n",
        "    import importlib\n"
        "    loaded = [p for p in json.loads(sys.argv[2]) if getattr(importlib.import_module("
        "p.rsplit('.', 1)[0]), p.rsplit('.', 1)[1]).__pydantic_complete__]\n"
        "    await server.stop()\n",
    )
    assert "importlib" in code
    built, echoed = json.loads(_python(code, str(EXAMPLES / "echo"), json.dumps(LATER_MODELS)))
    assert built == []  # neither the start nor an infer request built them
    assert echoed == [[1.0, 2.0]]
    from runtime.core.generate import GenerateRequest
    from runtime.types import MetadataServerResponse, RepositoryIndexRequest

    assert RepositoryIndexRequest.model_validate_json(b'{"ready": true}').ready is True
    assert MetadataServerResponse(name="n", version="1", extensions=[]).model_dump()["name"] == "n"
    assert GenerateRequest.model_validate({"text_input": "t", "parameters": {"x": 1}}).parameters is not None
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate({"parameters": {"max_tokens": 0}})


def _main(argv: list[str]) -> object:
    try:
        return main(argv)
    except SystemExit as exc:
        return f"exit {exc.code}"


@pytest.mark.parametrize(
    ("argv", "outcome"),
    [([], 2), (["--version"], "exit 0"), (["start", "/no/such/folder"], "exit 2")],
)
def test_main_gives_the_collector_back_as_it_found_it(
    argv: list[str], outcome: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gc.isenabled()
    assert _main(argv) == outcome
    assert gc.isenabled()
    gc.disable()
    try:
        assert _main(argv) == outcome
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_fewer_collections_raises_the_first_threshold_and_puts_it_back() -> None:
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold() == (LOADING_GC_THRESHOLD, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("a load failed")
    assert gc.get_threshold() == before


def test_a_batcher_loaded_at_start_keeps_its_threshold_when_loading_ends() -> None:
    """Loading and a running batcher share one hold on the threshold: the end of loading does not
    put back 700 under a batcher that started meanwhile."""
    before = gc.get_threshold()
    with fewer_collections():
        gc_threshold.hold()  # a batching scheduler starts with its model
    try:
        assert gc.get_threshold() == (gc_threshold.YOUNG, *before[1:])
    finally:
        gc_threshold.release()
    assert gc.get_threshold() == before


@pytest.mark.parametrize("first", [0, LOADING_GC_THRESHOLD * 2])
def test_fewer_collections_keeps_a_threshold_of_0_or_a_higher_one(first: int) -> None:
    before = gc.get_threshold()
    gc.set_threshold(first, *before[1:])
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == first
        assert gc.get_threshold()[0] == first
    finally:
        gc.set_threshold(*before)


def test_the_models_load_at_start_with_fewer_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, int, int]] = []
    load_models = Server.load_models

    async def recording(self: Server, models: list[ModelSettings] | None = None) -> None:
        seen.append(gc.get_threshold())
        await load_models(self, models)

    monkeypatch.setattr(Server, "load_models", recording)
    before = gc.get_threshold()

    async def start_and_stop() -> None:
        server = Server(
            Settings(
                model_repository_root=str(tmp_path),
                http_port=0,
                grpc_port=0,
                metrics_port=0,
                management_port=0,
                management_key_file=str(tmp_path / "key"),
            )
        )
        await server.start()
        assert gc.get_threshold() == before
        await server.stop()

    asyncio.run(start_and_stop())
    assert seen == [(LOADING_GC_THRESHOLD, *before[1:])]
