"""The public API is curated (``__all__``) and pinned; the settings' JSON Schemas match the code."""

from __future__ import annotations

import json
import subprocess
import sys

import runtime
from runtime import codecs, types
from runtime.settings import ModelSettings, Settings, json_schemas
from tests.conftest import ROOT


def test_top_level_api_is_pinned() -> None:
    assert sorted(runtime.__all__) == [
        "ContinuousModel",
        "MLModel",
        "ModelParameters",
        "ModelSettings",
        "SequenceModel",
        "SequenceStep",
        "Settings",
        "StepResult",
        "Stream",
        "__version__",
        "codecs",
        "decode_args",
        "errors",
        "types",
    ]
    for name in runtime.__all__:
        assert hasattr(runtime, name)


def test_mlserver_names_exist() -> None:
    for name in (
        "NumpyCodec",
        "NumpyRequestCodec",
        "StringCodec",
        "StringRequestCodec",
        "Base64Codec",
        "decode_args",
    ):
        assert name in codecs.__all__
    for name in (
        "InferenceRequest",
        "InferenceResponse",
        "RequestInput",
        "RequestOutput",
        "ResponseOutput",
        "Parameters",
        "MetadataTensor",
        "MetadataModelResponse",
        "MetadataServerResponse",
    ):
        assert name in types.__all__
    for method in (
        "load",
        "predict",
        "predict_stream",
        "unload",
        "metadata",
        "decode",
        "decode_request",
        "encode",
        "encode_response",
    ):
        assert callable(getattr(runtime.MLModel, method))


def test_schemas_match_the_settings_models() -> None:
    for name, schema in json_schemas().items():
        on_disk = json.loads((ROOT / "schemas" / name).read_text())
        assert on_disk == schema, f"schemas/{name} is stale: run python3 scripts/gen_schemas.py"


def test_every_settings_field_is_documented() -> None:
    for model in (Settings, ModelSettings):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def test_importing_runtime_does_not_import_torch() -> None:
    code = (
        "import sys, runtime, runtime.server.serving, runtime.core.dataplane; print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_server_imports_what_only_some_models_or_calls_need_on_first_use() -> None:
    """Start-up cost: batching schedulers, worker processes, archive readers, gRPC reflection and
    TorchServe's error details are imported when a model or call first needs them."""
    lazy = [
        "runtime.scheduling.adaptive",
        "runtime.scheduling.continuous_batching",
        "runtime.scheduling.sequence_batching",
        "runtime.scheduling.forwarding",
        "runtime.workers",
        "tarfile",
        "email.policy",
        "grpc_reflection.v1alpha.reflection",
        "google.rpc.error_details_pb2",
    ]
    code = (
        "import sys, runtime.cli, runtime.server.serving, runtime.logs\n"
        f"print([name for name in {lazy!r} if name in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    # and each is still there for whoever needs it
    from runtime.scheduling import AdaptiveScheduler, SequenceScheduler, WorkerExecutor

    assert AdaptiveScheduler.__name__ == "AdaptiveScheduler"
    assert SequenceScheduler.__name__ == "SequenceScheduler"
    assert WorkerExecutor.__name__ == "WorkerExecutor"
