"""Helpers for the PyTorch runtime's tests: the example builder, the models' own forward, binary bodies."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import torch

from runtime.settings import ModelSettings

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "examples" / "torch" / "build.py"

KINDS = ("torchscript", "export", "state-dict")
MODELS = tuple(f"{net}-{kind}" for net in ("mlp", "lstm") for kind in KINDS)
OUTPUTS = {"mlp": ("logits", "probabilities"), "lstm": ("y", "h", "c")}


def load_builder() -> ModuleType:
    """examples/torch/build.py, imported from its file."""
    spec = importlib.util.spec_from_file_location("_torch_examples_build", BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def build_repository(base: Path) -> Path:
    """The example model folders with their artefacts, built once per session under ``base``
    (pytest's session temporary folder), plus ``broken``, whose model file is missing."""
    builder = load_builder()
    root: Path = builder.copy_folders(base / "torch-models")
    builder.build(root)
    broken = root / "broken"
    broken.mkdir()
    settings = json.loads((root / "mlp-export" / "model-settings.json").read_text())
    settings.update(name="broken", parameters={"uri": "missing.pt2"})
    (broken / "model-settings.json").write_text(json.dumps(settings))
    return root


def settings_of(root: Path, folder: str) -> ModelSettings:
    return ModelSettings.from_file(root / folder / "model-settings.json")


def inputs_for(folder: str, batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Random inputs (fixed seed) that fit a model of the examples."""
    rng = np.random.default_rng(seed)
    if folder.startswith("mlp"):
        return {"x": rng.standard_normal((batch, 4), dtype=np.float32)}
    return {
        "x": rng.standard_normal((batch, 5, 8), dtype=np.float32),
        "h0": rng.standard_normal((batch, 1, 16), dtype=np.float32),
        "c0": rng.standard_normal((batch, 1, 16), dtype=np.float32),
    }


def own_module(root: Path, folder: str) -> Any:
    """The model loaded the way its author would, without the server."""
    settings = settings_of(root, folder)
    assert settings.parameters is not None and settings.parameters.uri is not None
    path = root / folder / settings.parameters.uri
    if folder.endswith("torchscript"):
        return torch.jit.load(str(path))
    if folder.endswith("export"):
        return torch.export.load(str(path)).module()
    net = folder.split("-")[0]
    class_name = "MLP" if net == "mlp" else "LSTMModel"
    spec = importlib.util.spec_from_file_location(f"_own_{net}", root / folder / f"{net}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kwargs = settings.parameters.extra.get("module_kwargs", {})
    model = getattr(module, class_name)(**kwargs)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def own_forward(module: Any, folder: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's own forward pass on ``inputs``, as named numpy arrays."""
    net = folder.split("-")[0]
    args = [torch.from_numpy(inputs[name].copy()) for name in (("x",) if net == "mlp" else ("x", "h0", "c0"))]
    with torch.no_grad():
        result = module(*args)
    if isinstance(result, dict):
        return {name: result[name].numpy() for name in OUTPUTS[net]}
    return {name: tensor.numpy() for name, tensor in zip(OUTPUTS[net], result, strict=True)}


def binary_body(
    inputs: dict[str, tuple[np.ndarray, str]], outputs: list[str] | None = None
) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor request: a JSON header, then each input's raw bytes (BF16: uint16 bits)."""
    header: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
    raw = []
    for name, (array, datatype) in inputs.items():
        data = np.ascontiguousarray(array).tobytes()
        header["inputs"].append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(data)},
            }
        )
        raw.append(data)
    if outputs is not None:
        header["outputs"] = [{"name": name, "parameters": {"binary_data": True}} for name in outputs]
    head = orjson.dumps(header)
    return head + b"".join(raw), {"Inference-Header-Content-Length": str(len(head))}


NUMPY = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "BF16": np.uint16, "INT64": np.int64}


def parse_binary(body: bytes, header_length: int) -> dict[str, tuple[np.ndarray, str]]:
    """Outputs of a binary-tensor response by name, as arrays (BF16: uint16 bits) and datatypes."""
    header = json.loads(body[:header_length])
    offset = header_length
    found = {}
    for out in header["outputs"]:
        size = out["parameters"]["binary_data_size"]
        array = np.frombuffer(body[offset : offset + size], dtype=NUMPY[out["datatype"]])
        found[out["name"]] = (array.reshape(out["shape"]), out["datatype"])
        offset += size
    return found


TORCH_IO = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
}


def torch_settings_file(folder: Path, parameters: dict[str, Any], **fields: Any) -> ModelSettings:
    """A TorchModel's model-settings.json written in ``folder`` (input x, output y), read back."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {"name": "m", "implementation": "runtime.torch.TorchModel", **TORCH_IO, **fields}
    document["parameters"] = parameters
    path = folder / "model-settings.json"
    path.write_text(json.dumps(document))
    return ModelSettings.from_file(path)
