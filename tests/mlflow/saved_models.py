"""MLflow models saved with real mlflow at test time, from generated data (nothing downloaded).

- ``columns`` (skops, mlflow's default for scikit-learn): a LogisticRegression on a DataFrame of
  columns ``a``, ``b`` (doubles) and ``c`` (long), its signature with a ``k`` param (unused by it);
- ``tensor`` (cloudpickle): the same regression on a ``[N, 3]`` float64 array;
- ``scaled``: a pyfunc model (``ScaledSum``) answering ``(a + b) * scale`` as a DataFrame column
  ``y`` and the text column ``label``; ``scale`` is a signature param (default 1.0; a negative one makes the model raise);
- ``nosig``: the ``tensor`` regression saved without a signature;
- ``broken``: an MLmodel file whose pickle is not one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "mlflow", reason="the MLflow runtime's tests need mlflow: pip install 'mlserver-like[mlflow]'"
)
pytest.importorskip("sklearn", reason="the MLflow runtime's tests save scikit-learn models")

import mlflow.pyfunc
import mlflow.sklearn
import pandas as pd
from mlflow.models import infer_signature
from mlflow.pyfunc.model import PythonModel
from sklearn.linear_model import LogisticRegression

IMPLEMENTATION = "runtime.mlflow.MLflowModel"
REQUIREMENTS = ["mlflow", "scikit-learn"]
"""Written as they are: mlflow would otherwise infer them by loading each model in a subprocess."""


class ScaledSum(PythonModel):
    """``y = (a + b) * scale`` and ``label`` ("big" when y > 1), one row per row."""

    def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        scale = float((params or {}).get("scale", 1.0))
        if scale < 0:
            raise RuntimeError("scale must not be negative")
        y = (model_input["a"] + model_input["b"]) * scale
        return pd.DataFrame({"y": y, "label": np.where(y > 1, "big", "small")})


def features(rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "a": rng.normal(size=rows),
            "b": rng.normal(size=rows),
            "c": rng.integers(0, 5, rows).astype(np.int64),
        }
    )


def _settings(folder: Path, name: str, **extra: Any) -> None:
    (folder / "model-settings.json").write_text(
        json.dumps({"name": name, "implementation": IMPLEMENTATION, **extra})
    )


def save_models(root: Path) -> dict[str, Any]:
    """Save the five models under ``root`` (one folder each, with its model-settings.json); return
    the fitted scikit-learn estimators by name."""
    frame = features(200)
    labels = (frame.a + frame.b > 0).astype(np.int64)
    columns = LogisticRegression().fit(frame, labels)
    mlflow.sklearn.save_model(
        columns,
        str(root / "columns"),
        signature=infer_signature(frame, columns.predict(frame), params={"k": 1.0}),
        pip_requirements=REQUIREMENTS,
    )
    _settings(root / "columns", "columns")
    array = frame.to_numpy(dtype=np.float64)
    tensor = LogisticRegression().fit(array, labels)
    mlflow.sklearn.save_model(
        tensor,
        str(root / "tensor"),
        signature=infer_signature(array, tensor.predict(array)),
        serialization_format="cloudpickle",
        pip_requirements=REQUIREMENTS,
    )
    _settings(root / "tensor", "tensor")
    sample = frame[["a", "b"]]
    mlflow.pyfunc.save_model(
        str(root / "scaled"),
        python_model=ScaledSum(),
        signature=infer_signature(sample, ScaledSum().predict(None, sample), params={"scale": 1.0}),
        pip_requirements=REQUIREMENTS,
    )
    _settings(root / "scaled", "scaled")
    mlflow.sklearn.save_model(
        tensor, str(root / "nosig"), serialization_format="cloudpickle", pip_requirements=REQUIREMENTS
    )
    _settings(root / "nosig", "nosig")
    broken = root / "broken"
    mlflow.sklearn.save_model(
        tensor, str(broken), serialization_format="cloudpickle", pip_requirements=REQUIREMENTS
    )
    (broken / "model.pkl").write_bytes(b"not a pickle")
    _settings(broken, "broken")
    return {"columns": columns, "tensor": tensor}
