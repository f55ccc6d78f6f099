"""OnnxModel: the graph's inputs and outputs as metadata, several of each, threads as settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.onnx import OnnxModel
from runtime.settings import ModelSettings
from runtime.types import State
from tests.conftest import InProcess
from tests.tabular_models import data, onnx_graph, outputs_of, write_settings

pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")


def body(x: np.ndarray, counts: np.ndarray, **extra: object) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()},
            {
                "name": "counts",
                "shape": list(counts.shape),
                "datatype": "INT64",
                "data": counts.ravel().tolist(),
            },
        ],
        **extra,
    }


async def load(inprocess: InProcess, folder: Path) -> None:
    await inprocess.load(ModelSettings.from_file(folder / "model-settings.json"))


async def test_metadata_comes_from_the_graph(inprocess: InProcess, tmp_path: Path) -> None:
    onnx_graph(tmp_path / "heads")
    await load(inprocess, tmp_path / "heads")
    async with inprocess.client() as client:
        metadata = (await client.get("/v2/models/heads")).json()
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "counts", "datatype": "INT64", "shape": [-1, 2]},
    ]
    assert metadata["outputs"] == [
        {"name": "scores", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "total", "datatype": "INT64", "shape": [-1, 1]},
    ]


async def test_several_inputs_and_outputs(inprocess: InProcess, tmp_path: Path) -> None:
    weights, bias = onnx_graph(tmp_path / "heads", parameters={"extra": {"intra_op_threads": 2}})
    await load(inprocess, tmp_path / "heads")
    x = data(rows=3)[0].astype(np.float32)
    counts = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int64)
    async with inprocess.client() as client:
        everything = await client.post("/v2/models/heads/infer", json=body(x, counts))
        one = await client.post("/v2/models/heads/infer", json=body(x, counts, outputs=[{"name": "total"}]))
    outputs = outputs_of(everything.json())
    assert (outputs["scores"]["datatype"], outputs["scores"]["shape"]) == ("FP32", [3, 3])
    np.testing.assert_allclose(
        np.array(outputs["scores"]["data"]).reshape(3, 3), x @ weights + bias, rtol=1e-5
    )
    assert (outputs["total"]["datatype"], outputs["total"]["shape"], outputs["total"]["data"]) == (
        "INT64",
        [3, 1],
        [3, 7, 11],
    )
    assert [out["name"] for out in one.json()["outputs"]] == ["total"]
    model = inprocess.registry.get("heads").model
    assert isinstance(model, OnnxModel)
    assert model.session.get_session_options().intra_op_num_threads == 2


async def test_requests_are_checked_against_the_graph(inprocess: InProcess, tmp_path: Path) -> None:
    onnx_graph(tmp_path / "heads")
    await load(inprocess, tmp_path / "heads")
    x = data(rows=1)[0].astype(np.float32)
    counts = np.array([[1, 2]], dtype=np.int64)
    missing = body(x, counts)
    missing["inputs"] = missing["inputs"][:1]  # type: ignore[index]
    wrong_type = body(x, counts)
    wrong_type["inputs"][0]["datatype"] = "FP64"  # type: ignore[index]
    async with inprocess.client() as client:
        lacking = await client.post("/v2/models/heads/infer", json=missing)
        typed = await client.post("/v2/models/heads/infer", json=wrong_type)
        unknown = await client.post(
            "/v2/models/heads/infer", json=body(x, counts, outputs=[{"name": "nope"}])
        )
        short = await client.post("/v2/models/heads/infer", json=body(x[:, :3], counts))
    assert lacking.status_code == 400 and "'counts'" in lacking.json()["error"]
    assert typed.status_code == 400 and "'x'" in typed.json()["error"]
    assert unknown.status_code == 400 and "'nope'" in unknown.json()["error"]
    assert short.status_code == 400 and "'x'" in short.json()["error"]


async def test_a_file_that_is_not_a_graph_is_unavailable(inprocess: InProcess, tmp_path: Path) -> None:
    write_settings(tmp_path / "bad", "runtime.onnx.OnnxModel")
    (tmp_path / "bad" / "model.onnx").write_bytes(b"\x00 not onnx")
    await load(inprocess, tmp_path / "bad")
    entry = inprocess.registry.find("bad")
    assert entry.state is State.UNAVAILABLE and "failed to load" in entry.reason


async def test_thread_settings_are_checked(inprocess: InProcess, tmp_path: Path) -> None:
    onnx_graph(tmp_path / "bad", parameters={"extra": {"inter_op_threads": "many"}})
    await load(inprocess, tmp_path / "bad")
    entry = inprocess.registry.find("bad")
    assert entry.state is State.UNAVAILABLE and "inter_op_threads" in entry.reason


async def test_bytes_inputs_and_outputs_are_text(inprocess: InProcess, tmp_path: Path) -> None:
    """onnxruntime takes and gives ``str``; the server's BYTES tensors hold ``bytes``."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (the test extra brings it)")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "echo-text",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["N"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = write_settings(tmp_path / "text", "runtime.onnx.OnnxModel")
    onnx.save(model, str(folder / "model.onnx"))
    await load(inprocess, folder)
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["héllo", "wörld"]}]}
    async with inprocess.client() as client:
        response = await client.post("/v2/models/text/infer", json=body)
    [out] = response.json()["outputs"]
    assert (out["name"], out["datatype"], out["shape"], out["data"]) == (
        "same",
        "BYTES",
        [2],
        ["héllo", "wörld"],
    )
