"""``XGBoostModel``: an XGBoost model saved with ``save_model`` (``model.bst``, ``.json``, ``.ubj``).

Served as MLServer 1.7's ``mlserver_xgboost.XGBoostModel`` serves it (that name resolves here):
the file is loaded into XGBoost's scikit-learn interface (a regressor, or a classifier when it
is one), and the request's ``outputs`` choose between ``predict`` (labels for a classifier,
values for a regressor) and ``predict_proba`` (a classifier's class probabilities); none asked
for: ``predict``. Answers are the arrays those methods give, tagged ``content_type: np``.

The call: ``Booster.inplace_predict`` on the request's array, with the scikit-learn interface's
own turning of probabilities into labels: the same values as ``XGBClassifier.predict`` without
its per-call configuration and checks (checked at load on a probe row: a model for which the two
disagree is served through the scikit-learn interface's methods). The booster uses
``parameters.extra.threads`` threads (default 1). XGBoost is imported when a model loads
(``pip install 'mlserver-like[xgboost]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import InvalidInput
from runtime.tabular import Outputs, TabularModel, require, thread_count
from runtime.types import InferenceRequest

PREDICT = "predict"
PREDICT_PROBA = "predict_proba"
VALID_OUTPUTS = (PREDICT, PREDICT_PROBA)


class XGBoostModel(TabularModel):
    """An XGBoost booster behind XGBoost's scikit-learn interface; see the module docstring."""

    framework = "xgboost"
    extra = "xgboost"
    filenames = ("model.bst", "model.json", "model.ubj")

    _model: Any = None
    _classifier: bool = False
    _fast: bool = False

    def load_file(self, path: Path) -> None:
        xgb = require("xgboost", self.extra)
        self.input_errors = (ValueError, TypeError, xgb.core.XGBoostError)
        with xgb.config_context(verbosity=0):  # (thread-local) not a warning per guessed format of .bst
            model = _load_sklearn_interface(xgb, str(path))
        threads = thread_count(self)
        model.set_params(n_jobs=threads)
        booster = model.get_booster()
        booster.set_param({"nthread": threads})
        self._model, self._booster = model, booster
        self._classifier = isinstance(model, xgb.XGBClassifier)
        features = booster.num_features()
        self.features = int(features) if features else None
        self._range = model._get_iteration_range(None)
        self._missing = model.missing
        probe = np.zeros((2, self.features or 1), dtype=np.float32)
        self._fast = self._agrees(probe)

    @property
    def model(self) -> Any:
        """The loaded model (``XGBClassifier`` or ``XGBRegressor``)."""
        return self._model

    def _agrees(self, probe: np.ndarray) -> bool:
        """Whether the fast call gives the scikit-learn interface's own answers on ``probe``."""
        try:
            names = [PREDICT, PREDICT_PROBA] if self._classifier else [PREDICT]
            fast = self._fast_outputs(probe, names)
            slow = self._sklearn_outputs(probe, names)
        except Exception:
            return False
        return all(
            a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
            for (_, a), (_, b) in zip(fast, slow, strict=True)
        )

    def output_names(self, payload: InferenceRequest) -> list[str]:
        if not payload.outputs:
            return [PREDICT]
        names: list[str] = []
        for out in payload.outputs:
            if out.name not in VALID_OUTPUTS:
                raise InvalidInput(
                    f"XGBoostModel only supports '{PREDICT}' and '{PREDICT_PROBA}' as outputs "
                    f"({out.name!r} was requested)"
                )
            if out.name == PREDICT_PROBA and not self._classifier:
                raise InvalidInput(
                    f"Model {self.name!r} is an XGBRegressor: it has no '{PREDICT_PROBA}' output"
                )
            if out.name not in names:
                names.append(out.name)
        return names

    def compute(self, features: Any, names: list[str]) -> Outputs:
        if self._fast and isinstance(features, np.ndarray):
            return self._fast_outputs(features, names)
        return self._sklearn_outputs(features, names)

    def _sklearn_outputs(self, features: Any, names: list[str]) -> Outputs:
        model = self._model
        return [(name, getattr(model, name)(features)) for name in names]

    def _fast_outputs(self, features: np.ndarray, names: list[str]) -> Outputs:
        values = self._booster.inplace_predict(
            features, iteration_range=self._range, missing=self._missing, validate_features=False
        )
        if not self._classifier:
            return [(PREDICT, values)]
        outputs: Outputs = []
        for name in names:
            outputs.append(
                (
                    name,
                    _labels(values, self._model) if name == PREDICT else _probabilities(values, self._model),
                )
            )
        return outputs


def _labels(probabilities: np.ndarray, model: Any) -> np.ndarray:
    """``XGBClassifier.predict``'s labels from the booster's probabilities."""
    labels: np.ndarray
    if probabilities.ndim > 1 and model.n_classes_ != 2:
        labels = np.argmax(probabilities, axis=1)
    elif probabilities.ndim > 1 and probabilities.shape[1] != 1:
        labels = np.zeros(probabilities.shape)
        labels[probabilities > 0.5] = 1
    elif model.objective == "multi:softmax":
        labels = probabilities.astype(np.int32)
    else:
        labels = np.repeat(0, probabilities.shape[0])
        labels[probabilities > 0.5] = 1
    return labels


def _probabilities(prediction: np.ndarray, model: Any) -> np.ndarray:
    """``XGBClassifier.predict_proba`` from the booster's answer (not for ``multi:softmax``,
    whose probabilities need the margins: the load-time probe sends it the slow way)."""
    if model.objective == "multi:softmax":
        raise ValueError("multi:softmax needs margins")
    n_classes = model.n_classes_
    if prediction.ndim == 2 and prediction.shape[1] == n_classes:
        return prediction
    if prediction.ndim == 2 and n_classes == 2 and prediction.shape[1] >= n_classes:
        return prediction
    return np.vstack((1.0 - prediction, prediction)).transpose()


def _load_sklearn_interface(xgb: Any, path: str) -> Any:
    """The model as MLServer loads it: a regressor, unless the file is a classifier's."""
    try:
        regressor = xgb.XGBRegressor()
        regressor.load_model(path)
        return regressor
    except TypeError:
        classifier = xgb.XGBClassifier()
        classifier.load_model(path)
        return classifier
