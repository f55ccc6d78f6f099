"""TorchServe's gRPC inference API on the server's gRPC port, driven by clients made from
TorchServe's .proto files: the command-line client (stubs generated as TorchServe's documents
say, in a tmp dir) and the stubs checked in under runtime/frontends/grpc/generated."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2
from google.rpc import error_details_pb2

pytest.importorskip("ts", reason="the torchserve extra (pip install -e '.[torchserve]') is not installed")

from runtime.frontends.grpc.generated import ts_inference_pb2 as pb
from runtime.frontends.grpc.generated import ts_inference_pb2_grpc as pb_grpc
from runtime.frontends.grpc.generated import ts_management_pb2 as mpb
from runtime.frontends.grpc.generated import ts_management_pb2_grpc as mpb_grpc
from tests.servers import RunningServer, start_server
from tests.torchserve.archiver import run_model_archiver

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "torchserve"
HANDLERS = Path(__file__).resolve().parents[2] / "models" / "torchserve"
SAMPLES = [EXAMPLES / "stateful" / "sample" / f"sample{i}.txt" for i in (1, 2, 3)]


def archiver(store: Path, name: str, handler: Path, *extra: str) -> None:
    run_model_archiver(
        "--model-name", name, "--version", "1.0", "--handler", str(handler), "--export-path", str(store), *extra
    )  # fmt: skip


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("private") / "key_file.json"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, key_file: Path) -> Iterator[RunningServer]:
    store = tmp_path_factory.mktemp("model_store")
    example = EXAMPLES / "stateful-sequence"
    archiver(
        store,
        "stateful",
        example / "stateful_handler.py",
        "-r", str(example / "requirements.txt"), "--config-file", str(example / "model-config.yaml"),
    )  # fmt: skip
    archiver(store, "streamer", HANDLERS / "stream_handler.py")
    archiver(store, "echo", HANDLERS / "echo_handler.py")
    running = start_server(store, "--grpc-management-port", "0", "--management-key-file", str(key_file))
    yield running
    running.stop()


@pytest.fixture
def management_key(server: RunningServer, key_file: Path) -> str:
    """The key the server wrote (TorchServe's ``key_file.json`` shape)."""
    return str(json.loads(key_file.read_text())["management"]["key"])


def bearer(key: str) -> list[tuple[str, str]]:
    """The gRPC metadata TorchServe's clients send the management key in."""
    return [("authorization", f"Bearer {key}")]


@pytest.fixture(scope="module")
def client_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TorchServe's client beside stubs generated from the protos with grpc_tools.protoc."""
    folder = tmp_path_factory.mktemp("ts_scripts")
    import google.rpc.status_pb2

    googleapis = Path(google.rpc.status_pb2.__file__).parent.parent.parent
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{googleapis}", f"--proto_path={ROOT / 'proto' / 'torchserve'}",
         f"--python_out={folder}", f"--grpc_python_out={folder}",
         str(ROOT / "proto" / "torchserve" / "inference.proto"), str(ROOT / "proto" / "torchserve" / "management.proto")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    shutil.copy(EXAMPLES / "torchserve_grpc_client.py", folder)
    return folder


def run_client(
    client_dir: Path, server: RunningServer, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    host, port = server.grpc_address.rsplit(":", 1)
    management = server.endpoints["grpc_management"].rsplit(":", 1)[1]
    auth = ["--auth-token", token] if token else []
    return subprocess.run(
        [sys.executable, str(client_dir / "torchserve_grpc_client.py"), "--host", host, "--inference-port", port,
         "--management-port", management, *auth, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


@pytest.fixture
def stub(server: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_address) as channel:
        yield pb_grpc.InferenceAPIsServiceStub(channel)


def test_client_infer_stream2_runs_the_stateful_example(client_dir: Path, server: RunningServer) -> None:
    """``torchserve_grpc_client.py infer_stream2 stateful seq_0 sample1,sample2,sample3``."""
    done = run_client(client_dir, server, "infer_stream2", "stateful", "seq_0", ",".join(map(str, SAMPLES)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == [
        'prediction: "1"',
        "",
        'prediction: "3"',
        "",
        'prediction: "6"',
        "",
        "Sequence completed!",
        "",
    ]
    # the same id on a new stream continues the sequence
    again = run_client(client_dir, server, "infer_stream2", "stateful", "seq_0", str(SAMPLES[0]))
    assert 'prediction: "7"' in again.stdout


def test_client_infer_and_infer_stream(client_dir: Path, server: RunningServer, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("tok")
    unary = run_client(client_dir, server, "infer", "streamer", str(text))
    assert unary.returncode == 0, unary.stderr
    assert unary.stdout == "tok-0 tok-1 tok-2 tok-done\n"
    streamed = run_client(client_dir, server, "infer_stream", "streamer", str(text))
    assert streamed.stdout.split("\n") == ["tok-0 ", "tok-1 ", "tok-2 ", "tok-done", ""]
    missing = run_client(client_dir, server, "infer", "nope", str(text))
    assert missing.returncode == 1


def test_ping_and_predictions(stub: Any) -> None:
    assert stub.Ping(empty_pb2.Empty()).health == '{\n  "status": "Healthy"\n}\n'
    answer = stub.Predictions(pb.PredictionsRequest(model_name="echo", input={"data": b"x", "k": b"v"}))
    seen = json.loads(answer.prediction)
    assert seen["data"] == {"data": {"bytes": "x"}, "k": {"bytes": "v"}}  # bytes, never decoded
    assert seen["headers"] == {}  # gRPC metadata does not reach the handler


def test_errors_carry_torchserve_codes(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        stub.Predictions(pb.PredictionsRequest(model_name="nope", input={"data": b"x"}))
    assert missing.value.code() == grpc.StatusCode.INTERNAL
    assert missing.value.details() == "Model not found: nope"
    with pytest.raises(grpc.RpcError) as unnamed:
        stub.Predictions(pb.PredictionsRequest(input={"data": b"x"}))
    assert unnamed.value.details() == "Parameter model_name is required."
    with pytest.raises(grpc.RpcError) as failed:
        stub.Predictions(pb.PredictionsRequest(model_name="streamer", input={"data": b"fail"}))
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE  # 503 "Prediction failed"
    with pytest.raises(grpc.RpcError) as teapot:
        stub.Predictions(pb.PredictionsRequest(model_name="streamer", input={"data": b"teapot"}))
    assert teapot.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # 418, another 4xx


def test_stream_predictions2_answers_errors_in_stream(stub: Any) -> None:
    requests = [
        pb.PredictionsRequest(model_name="stateful", input={"data": b"5"}),  # no sequence_id
        pb.PredictionsRequest(model_name="stateful", sequence_id="s-1", input={"data": b"5"}),
        pb.PredictionsRequest(model_name="nope", sequence_id="s-1", input={"data": b"1"}),
        pb.PredictionsRequest(
            model_name="stateful", sequence_id="s-1", input={"data": b"2", "ts_request_sequence_end": b"true"}
        ),
        pb.PredictionsRequest(model_name="stateful", sequence_id="s-1", input={"data": b"1"}),
    ]
    answers = list(stub.StreamPredictions2(iter(requests)))
    assert len(answers) == 5
    assert answers[0].status.code == 13 and answers[0].status.message == "Parameter sequenceId is required."
    info = error_details_pb2.ErrorInfo()
    assert answers[0].status.details[0].Unpack(info) and info.reason == "BadRequestException.()"
    assert answers[1].prediction == b"5" and not answers[1].HasField("sequence_id")
    assert answers[2].status.message == "Model not found: nope"
    assert answers[3].prediction == b"7"  # the end key ends the sequence after this request
    assert answers[4].status.code == 13 and "ended" in answers[4].status.message


def test_management_list_describe_register_unregister(
    client_dir: Path, server: RunningServer, management_key: str
) -> None:
    with grpc.insecure_channel(server.endpoints["grpc_management"]) as channel:
        stub = mpb_grpc.ManagementAPIsServiceStub(channel)
        key = bearer(management_key)
        assert json.loads(stub.ListModels(mpb.ListModelsRequest(), metadata=key).msg) == {
            "models": []
        }  # limit 0
        page = json.loads(stub.ListModels(mpb.ListModelsRequest(limit=2), metadata=key).msg)
        assert page["nextPageToken"] == "2"
        assert page["models"] == [
            {"modelName": "echo", "modelUrl": "echo.mar"},
            {"modelName": "stateful", "modelUrl": "stateful.mar"},
        ]
        described = json.loads(
            stub.DescribeModel(mpb.DescribeModelRequest(model_name="stateful"), metadata=key).msg
        )
        assert described[0]["modelVersion"] == "1.0" and described[0]["batchSize"] == 4
        assert described[0]["stateful"] is True and described[0]["maxNumSequence"] == 4
        assert described[0]["workers"][0]["status"] == "READY"
        with pytest.raises(grpc.RpcError) as missing:
            stub.DescribeModel(mpb.DescribeModelRequest(model_name="nope"), metadata=key)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        # ScaleWorker and SetDefault are the management core operations; their refusals:
        with pytest.raises(grpc.RpcError) as scale:
            stub.ScaleWorker(
                mpb.ScaleWorkerRequest(model_name="echo", min_worker=3, max_worker=2), metadata=key
            )
        assert scale.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as unknown:
            stub.ScaleWorker(mpb.ScaleWorkerRequest(model_name="nope", min_worker=1), metadata=key)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as no_version:
            stub.SetDefault(mpb.SetDefaultRequest(model_name="echo", model_version="9.9"), metadata=key)
        assert no_version.value.code() == grpc.StatusCode.NOT_FOUND
        done = stub.SetDefault(mpb.SetDefaultRequest(model_name="echo", model_version="1.0"), metadata=key)
        assert done.msg == 'Default version successfully updated for model "echo" to "1.0"'
    # the client's register/unregister: a model store entry by name, then unregistered
    unregistered = run_client(client_dir, server, "unregister", "echo", token=management_key)
    assert unregistered.returncode == 0, unregistered.stderr
    assert 'Model "echo" unregistered' in unregistered.stdout
    registered = run_client(client_dir, server, "register", "echo", "echo,other", token=management_key)
    assert registered.returncode == 0, registered.stderr
    assert 'Model "echo" Version: 1.0 registered with 1 initial workers' in registered.stdout
    again = run_client(client_dir, server, "register", "echo", "echo", token=management_key)
    assert again.returncode == 1  # already registered
    remote = run_client(client_dir, server, "register", "densenet161", token=management_key)
    assert remote.returncode == 1  # nothing is downloaded


def test_management_calls_need_the_management_key(
    client_dir: Path, server: RunningServer, management_key: str
) -> None:
    """As TorchServe 0.11.1+: metadata ``authorization: Bearer <key>`` with the management key
    (the key file's, the one the management REST API takes), else PERMISSION_DENIED."""
    with grpc.insecure_channel(server.endpoints["grpc_management"]) as channel:
        stub = mpb_grpc.ManagementAPIsServiceStub(channel)
        for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", "wrong")]):
            with pytest.raises(grpc.RpcError) as refused:
                stub.RegisterModel(
                    mpb.RegisterModelRequest(url="echo.mar", model_name="intruder"), metadata=metadata
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "Token Authorization failed" in (refused.value.details() or "")
        with pytest.raises(grpc.RpcError) as listed:
            stub.ListModels(mpb.ListModelsRequest(limit=10))
        assert listed.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert json.loads(
            stub.ListModels(mpb.ListModelsRequest(limit=10), metadata=bearer(management_key)).msg
        )["models"]
    # the service is on the main gRPC port too, guarded the same
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = mpb_grpc.ManagementAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.UnregisterModel(mpb.UnregisterModelRequest(model_name="echo"))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # TorchServe's client without --auth-token fails; nothing was registered or removed meanwhile
    assert run_client(client_dir, server, "unregister", "echo").returncode == 1
    with grpc.insecure_channel(server.grpc_address) as channel:
        assert (
            pb_grpc.InferenceAPIsServiceStub(channel)
            .Predictions(pb.PredictionsRequest(model_name="echo", input={"data": b"still here"}))
            .prediction
        )


def test_sequence_batching_over_rest_headers(server: RunningServer) -> None:
    """The documentation's curl, three times: ``-H "ts_request_sequence_id: rest_0" -T sampleN.txt``;
    sequences of different ids share batches and keep their own sums."""
    import httpx

    url = f"{server.http_url}/predictions/stateful"
    with httpx.Client(timeout=30) as client:
        sums = [
            client.put(url, content=path.read_bytes(), headers={"ts_request_sequence_id": seq}).text
            for path in SAMPLES
            for seq in ("rest_0", "rest_1")
        ]
        assert sums == ["1", "1", "3", "3", "6", "6"]
        fresh = client.put(url, content=b"5")  # no id: a new sequence, its id sent back
        assert fresh.text == "5" and fresh.headers["ts_request_sequence_id"].startswith("seq-")
