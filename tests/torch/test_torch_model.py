"""The PyTorch runtime in process: binary tensors, FP16/BF16, exported-program shapes, input order,
and forward calls kept off the event loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import anyio
import numpy as np
import pytest
import torch

from runtime.errors import ModelNotReady
from runtime.settings import ModelSettings
from runtime.torch import TorchModel
from runtime.types import Datatype, InferenceRequest, RequestInput
from tests.conftest import InProcess
from tests.torch_helpers import (
    binary_body,
    build_repository,
    inputs_for,
    own_forward,
    own_module,
    parse_binary,
    settings_of,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="session")
def torch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.getbasetemp())


def _model(inprocess: InProcess, name: str) -> TorchModel:
    return cast(TorchModel, inprocess.registry.get(name).model)


def _bf16_bits(array: np.ndarray) -> np.ndarray:
    return torch.from_numpy(array).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


async def _infer_binary(
    inprocess: InProcess, name: str, inputs: dict[str, tuple[np.ndarray, str]]
) -> dict[str, tuple[np.ndarray, str]]:
    body, headers = binary_body(inputs)
    async with inprocess.client() as client:
        response = await client.post(f"/v2/models/{name}/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    return parse_binary(response.content, int(response.headers["inference-header-content-length"]))


@pytest.mark.parametrize("folder", ["lstm-export", "mlp-torchscript", "mlp-state-dict"])
async def test_binary_inputs_are_served_exactly(
    inprocess: InProcess, torch_repository: Path, folder: str
) -> None:
    """Binary inputs arrive as read-only views of the body; torch shares them through DLPack."""
    await inprocess.load(settings_of(torch_repository, folder))
    inputs = inputs_for(folder, 6, seed=3)
    outputs = await _infer_binary(inprocess, folder, {k: (v, "FP32") for k, v in inputs.items()})
    expected = own_forward(own_module(torch_repository, folder), folder, inputs)
    assert list(outputs) == list(expected)
    for name, array in expected.items():
        assert outputs[name][1] == "FP32"
        assert np.array_equal(outputs[name][0], array), name


async def test_bf16_model_with_bf16_tensors(inprocess: InProcess, torch_repository: Path) -> None:
    settings = settings_of(torch_repository, "mlp-torchscript")
    _retype(settings, "BF16", dtype="bfloat16")
    await inprocess.load(settings)
    x = inputs_for("mlp", 5)["x"]
    outputs = await _infer_binary(inprocess, settings.name, {"x": (_bf16_bits(x), "BF16")})
    module = own_module(torch_repository, "mlp-torchscript").to(torch.bfloat16)
    with torch.no_grad():
        expected = module(torch.from_numpy(x).to(torch.bfloat16))
    for name in ("logits", "probabilities"):
        array, datatype = outputs[name]
        assert datatype == "BF16"
        assert np.array_equal(array, expected[name].view(torch.int16).numpy().view(np.uint16))


async def test_fp16_model_with_fp16_tensors(inprocess: InProcess, torch_repository: Path) -> None:
    settings = settings_of(torch_repository, "mlp-state-dict")
    _retype(settings, "FP16", dtype="float16")
    await inprocess.load(settings)
    x = inputs_for("mlp", 3)["x"].astype(np.float16)
    outputs = await _infer_binary(inprocess, settings.name, {"x": (x, "FP16")})
    module = own_module(torch_repository, "mlp-state-dict").to(torch.float16)
    with torch.no_grad():
        expected = module(torch.from_numpy(x))
    for name in ("logits", "probabilities"):
        assert outputs[name][1] == "FP16"
        assert np.array_equal(outputs[name][0], expected[name].numpy())


async def test_fp32_tensors_on_a_bf16_exported_program(inprocess: InProcess, torch_repository: Path) -> None:
    """dtype converts the weights and the inputs; outputs come back in their declared FP32."""
    settings = settings_of(torch_repository, "mlp-export")
    _retype(settings, "FP32", dtype="bfloat16")
    await inprocess.load(settings)
    x = inputs_for("mlp", 4)["x"]
    outputs = await _infer_binary(inprocess, settings.name, {"x": (x, "FP32")})
    module = own_module(torch_repository, "mlp-export").to(torch.bfloat16)
    with torch.no_grad():
        expected = module(torch.from_numpy(x).to(torch.bfloat16))
    for name in ("logits", "probabilities"):
        assert outputs[name][1] == "FP32"
        assert np.array_equal(outputs[name][0], expected[name].float().numpy())


def _retype(settings: ModelSettings, datatype: str, dtype: str) -> None:
    settings.inputs = [t.model_copy(update={"datatype": Datatype(datatype)}) for t in settings.inputs]
    settings.outputs = [t.model_copy(update={"datatype": Datatype(datatype)}) for t in settings.outputs]
    assert settings.parameters is not None
    settings.parameters.extra = {**settings.parameters.extra, "dtype": dtype}
    settings.name = f"{settings.name}-{dtype}"


async def test_exported_program_shape_is_checked_by_name(
    inprocess: InProcess, torch_repository: Path
) -> None:
    """Settings looser than the program: the program's own shapes give the 400, naming the input."""
    settings = settings_of(torch_repository, "lstm-export")
    settings.inputs[0].shape = [-1, -1, 8]
    await inprocess.load(settings)
    inputs = inputs_for("lstm", 2)
    inputs["x"] = np.zeros((2, 7, 8), dtype=np.float32)
    body, headers = binary_body({k: (v, "FP32") for k, v in inputs.items()})
    async with inprocess.client() as client:
        response = await client.post("/v2/models/lstm-export/infer", content=body, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "Input 'x' has shape [2, 7, 8] but the exported program takes [1..65536, 5, 8]" in error
    assert "dimension 1 is fixed at 5" in error


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"shape": [-1, 6, 8]}, "input 'x' is declared with shape [-1, 6, 8] but the exported program takes"),
        (
            {"datatype": Datatype.FP64},
            "input 'x' is declared FP64 but the exported program takes torch.float32",
        ),
    ],
)
async def test_settings_that_disagree_with_the_program_fail_the_load(
    inprocess: InProcess, torch_repository: Path, change: dict[str, Any], expected: str
) -> None:
    settings = settings_of(torch_repository, "lstm-export")
    settings.inputs[0] = settings.inputs[0].model_copy(update=change)
    entry = await inprocess.registry.load(settings)
    assert not entry.ready
    assert expected in entry.reason
    async with inprocess.client() as client:
        response = await client.get("/v2/models/lstm-export/ready")
    assert response.status_code == 503
    assert expected in response.json()["error"]


async def test_inputs_are_passed_in_the_forwards_order(inprocess: InProcess, torch_repository: Path) -> None:
    """Declared in another order than forward(x, h0, c0): matched by name."""
    settings = settings_of(torch_repository, "lstm-state-dict")
    settings.inputs = list(reversed(settings.inputs))
    await inprocess.load(settings)
    inputs = inputs_for("lstm", 2)
    response = await _model(inprocess, "lstm-state-dict").predict(_request(inputs))
    expected = own_forward(own_module(torch_repository, "lstm-state-dict"), "lstm-state-dict", inputs)
    for out in response.outputs:
        assert np.array_equal(out.data, expected[out.name])


async def test_inputs_with_other_names_go_in_declared_order(
    inprocess: InProcess, torch_repository: Path
) -> None:
    settings = settings_of(torch_repository, "lstm-torchscript")
    for tensor, name in zip(settings.inputs, ("features", "hidden", "cell"), strict=True):
        tensor.name = name
    await inprocess.load(settings)
    inputs = inputs_for("lstm", 2)
    renamed = dict(zip(("features", "hidden", "cell"), inputs.values(), strict=True))
    response = await _model(inprocess, "lstm-torchscript").predict(_request(renamed))
    expected = own_forward(own_module(torch_repository, "lstm-torchscript"), "lstm-torchscript", inputs)
    for out in response.outputs:
        assert np.array_equal(out.data, expected[out.name])


def _request(inputs: dict[str, np.ndarray]) -> InferenceRequest:
    return InferenceRequest(
        inputs=[
            RequestInput(name=name, shape=list(array.shape), datatype="FP32", data=array)
            for name, array in inputs.items()
        ]
    )


# ---------------------------------------------------------------------- off the event loop

GATE = '''
import threading

import torch
from torch import nn


class Gate(nn.Module):
    """Doubles its input once released; tells when a forward call has started."""

    def __init__(self, parties: int = 1) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.together = threading.Barrier(parties)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        self.together.wait(timeout=30)
        if not self.release.wait(timeout=30):
            raise TimeoutError("never released")
        return x * 2
'''


def _gate(folder: Path, workers: int, parties: int) -> ModelSettings:
    folder.mkdir()
    (folder / "gate.py").write_text(GATE)
    torch.save({}, folder / "gate.pth")
    path = folder / "model-settings.json"
    path.write_text(
        '{"name": "gate", "implementation": "runtime.torch.TorchModel",'
        ' "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],'
        ' "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],'
        ' "parameters": {"uri": "gate.pth", "extra": {"module_class": "gate.Gate",'
        f' "module_kwargs": {{"parties": {parties}}}, "workers": {workers}}}}}}}'
    )
    return ModelSettings.from_file(path)


X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}


async def test_health_answers_while_the_model_computes(inprocess: InProcess, tmp_path: Path) -> None:
    """The race: a forward call that ran on the event loop would hold back every other request."""
    await inprocess.load(_gate(tmp_path / "gate", workers=1, parties=1))
    gate: Any = _model(inprocess, "gate").module
    async with inprocess.client() as client:
        infer = asyncio.create_task(client.post("/v2/models/gate/infer", json=X))
        assert await anyio.to_thread.run_sync(gate.entered.wait, 30)
        assert (await client.get("/v2/health/live")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.get("/v2/models/gate/ready")).status_code == 200
        assert not infer.done()
        gate.release.set()
        response = await infer
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0]


async def test_workers_run_forward_calls_at_once(inprocess: InProcess, tmp_path: Path) -> None:
    """Two workers: both calls are inside forward together (a barrier of two lets them through)."""
    await inprocess.load(_gate(tmp_path / "gate", workers=2, parties=2))
    gate: Any = _model(inprocess, "gate").module
    gate.release.set()
    async with inprocess.client() as client:
        first, second = await asyncio.gather(
            client.post("/v2/models/gate/infer", json=X), client.post("/v2/models/gate/infer", json=X)
        )
    assert first.status_code == second.status_code == 200


async def test_unload_frees_the_runner(inprocess: InProcess, torch_repository: Path) -> None:
    await inprocess.load(settings_of(torch_repository, "mlp-torchscript"))
    model = _model(inprocess, "mlp-torchscript")
    await inprocess.registry.unload("mlp-torchscript")
    with pytest.raises(ModelNotReady):
        model.runner  # noqa: B018


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("folder", ["mlp-torchscript", "mlp-export", "mlp-state-dict", "lstm-export"])
async def test_cuda_device_serves_like_the_cpu(
    inprocess: InProcess, torch_repository: Path, folder: str
) -> None:
    """On a GPU the kernels differ from the CPU's, so the comparison has a tolerance."""
    settings = settings_of(torch_repository, folder)
    assert settings.parameters is not None
    settings.parameters.extra = {**settings.parameters.extra, "device": "cuda"}
    await inprocess.load(settings)
    assert _model(inprocess, folder).runner.device.type == "cuda"
    inputs = inputs_for(folder, 8)
    outputs = await _infer_binary(inprocess, folder, {k: (v, "FP32") for k, v in inputs.items()})
    expected = own_forward(own_module(torch_repository, folder), folder, inputs)
    for name, array in expected.items():
        np.testing.assert_allclose(outputs[name][0], array, rtol=1e-4, atol=1e-5)
