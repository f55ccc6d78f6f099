"""Small tabular models trained at test time on generated data, saved into model folders.

Each builder imports its framework through ``pytest.importorskip`` (a test that cannot get it
skips, saying why) and writes ``FOLDER/model-settings.json`` beside the model's file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

FEATURES = 4


def data(rows: int = 300, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features [rows, FEATURES] and integer labels 0..classes-1 that depend on them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES))
    score = x[:, 0] + 0.5 * x[:, 1] - x[:, 2]
    edges = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    return x, np.digitize(score, edges).astype(np.int64)


def write_settings(folder: Path, implementation: str, **settings: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    document = {"name": folder.name, "implementation": implementation, **settings}
    (folder / "model-settings.json").write_text(json.dumps(document))
    return folder


def sklearn_classifier(folder: Path, filename: str = "model.joblib", **settings: Any) -> Any:
    """A LogisticRegression of 3 classes, saved with joblib under ``filename``."""
    joblib = pytest.importorskip("joblib", reason="the [sklearn] extra is not installed")
    linear = pytest.importorskip("sklearn.linear_model", reason="the [sklearn] extra is not installed")
    x, y = data()
    model = linear.LogisticRegression(max_iter=500).fit(x, y)
    write_settings(folder, settings.pop("implementation", "runtime.sklearn.SKLearnModel"), **settings)
    joblib.dump(model, folder / filename)
    return model


def sklearn_regressor(folder: Path, **settings: Any) -> Any:
    joblib = pytest.importorskip("joblib", reason="the [sklearn] extra is not installed")
    linear = pytest.importorskip("sklearn.linear_model", reason="the [sklearn] extra is not installed")
    x, y = data()
    model = linear.LinearRegression().fit(x, y.astype(float))
    write_settings(folder, "runtime.sklearn.SKLearnModel", **settings)
    joblib.dump(model, folder / "model.joblib")
    return model


def sklearn_pipeline(folder: Path, **settings: Any) -> Any:
    """StandardScaler + PCA(2): a pipeline whose answer is ``transform``."""
    joblib = pytest.importorskip("joblib", reason="the [sklearn] extra is not installed")
    pytest.importorskip("sklearn", reason="the [sklearn] extra is not installed")
    from sklearn.decomposition import PCA
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, _ = data()
    model = make_pipeline(StandardScaler(), PCA(n_components=2)).fit(x)
    write_settings(folder, "runtime.sklearn.SKLearnModel", **settings)
    joblib.dump(model, folder / "model.joblib")
    return model


def xgboost_classifier(folder: Path, filename: str = "model.json", classes: int = 3, **settings: Any) -> Any:
    xgb = pytest.importorskip("xgboost", reason="the [xgboost] extra is not installed")
    x, y = data(classes=classes)
    model = xgb.XGBClassifier(n_estimators=10, max_depth=3, n_jobs=1).fit(x, y)
    write_settings(folder, settings.pop("implementation", "runtime.xgboost.XGBoostModel"), **settings)
    with xgb.config_context(verbosity=0):  # .bst: XGBoost warns that it chose UBJSON
        model.save_model(folder / filename)
    return model


def xgboost_regressor(folder: Path, **settings: Any) -> Any:
    xgb = pytest.importorskip("xgboost", reason="the [xgboost] extra is not installed")
    x, y = data()
    model = xgb.XGBRegressor(n_estimators=10, max_depth=3, n_jobs=1).fit(x, y.astype(float))
    write_settings(folder, "runtime.xgboost.XGBoostModel", **settings)
    model.save_model(folder / "model.ubj")
    return model


def lightgbm_booster(folder: Path, filename: str = "model.bst", classes: int = 3, **settings: Any) -> Any:
    lgb = pytest.importorskip("lightgbm", reason="the [lightgbm] extra is not installed")
    x, y = data(classes=classes)
    params: dict[str, Any] = {"verbose": -1, "num_threads": 1}
    if classes > 2:
        params.update(objective="multiclass", num_class=classes)
    else:
        params.update(objective="binary")
    booster = lgb.train(params, lgb.Dataset(x, y), num_boost_round=10)
    write_settings(folder, settings.pop("implementation", "runtime.lightgbm.LightGBMModel"), **settings)
    booster.save_model(str(folder / filename))
    return booster


def onnx_graph(folder: Path, **settings: Any) -> tuple[np.ndarray, np.ndarray]:
    """A graph of two inputs and two outputs: ``scores = x @ W + b`` (FP32 [N, 3]) and
    ``total = sum(counts, axis=1)`` (INT64 [N, 1]); returns (W, b)."""
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (the test extra brings it)")
    pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weights = rng.normal(size=(FEATURES, 3)).astype(np.float32)
    bias = rng.normal(size=(3,)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["scores"]),
            helper.make_node("ReduceSum", ["counts", "axes"], ["total"], keepdims=1),
        ],
        "two-heads",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES]),
            helper.make_tensor_value_info("counts", TensorProto.INT64, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("total", TensorProto.INT64, ["N", 1]),
        ],
        initializer=[
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(bias, "b"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    write_settings(folder, settings.pop("implementation", "runtime.onnx.OnnxModel"), **settings)
    onnx.save(model, str(folder / "model.onnx"))
    return weights, bias


def rows_body(rows: np.ndarray, name: str = "input-0", **extra: Any) -> dict[str, Any]:
    """An OIP JSON request of one FP64 input holding ``rows``."""
    return {
        "inputs": [{"name": name, "shape": list(rows.shape), "datatype": "FP64", "data": rows.tolist()}],
        **extra,
    }


def outputs_of(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {out["name"]: out for out in document["outputs"]}
