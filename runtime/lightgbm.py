"""``LightGBMModel``: a LightGBM booster saved with ``save_model`` (``model.bst``, or any file via ``uri``).

Served as MLServer 1.7's ``mlserver_lightgbm.LightGBMModel`` serves it (that name resolves here):
the file is ``parameters.uri`` (a ``model.txt`` needs ``"uri": "./model.txt"``), else
``model.bst``; the answer is always one output named ``predict``, whatever ``outputs`` asks:
``Booster.predict``'s own array (``FP64``; class probabilities ``[N, classes]`` for a multiclass
booster), tagged ``content_type: np``. The booster predicts with ``parameters.extra.threads``
threads (default 1). LightGBM is imported when a model loads
(``pip install 'mlserver-like[lightgbm]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.tabular import Outputs, TabularModel, require, thread_count
from runtime.types import InferenceRequest

PREDICT = "predict"


class LightGBMModel(TabularModel):
    """A LightGBM booster; see the module docstring."""

    framework = "lightgbm"
    extra = "lightgbm"
    filenames = ("model.bst",)
    default_outputs_all = True

    _booster: Any = None

    def load_file(self, path: Path) -> None:
        lgb = require("lightgbm", self.extra)
        self.input_errors = (ValueError, TypeError, lgb.basic.LightGBMError)
        self._booster = lgb.Booster(model_file=str(path))
        self._threads = thread_count(self)
        features = self._booster.num_feature()
        self.features = int(features) if features else None

    @property
    def model(self) -> Any:
        """The loaded ``lightgbm.Booster``."""
        return self._booster

    def output_names(self, payload: InferenceRequest) -> list[str]:
        return [PREDICT]  # as MLServer: one output, whatever the request asks

    def compute(self, features: Any, names: list[str]) -> Outputs:
        return [(PREDICT, self._booster.predict(features, num_threads=self._threads))]
