"""``SKLearnModel``: a fitted scikit-learn estimator or pipeline, saved with joblib or pickle.

Served as MLServer 1.7's ``mlserver_sklearn.SKLearnModel`` serves it (that name resolves here):

- the file is ``parameters.uri``, else ``model.joblib``, ``model.pickle`` or ``model.pkl`` in the
  model's folder;
- the request's ``outputs`` choose among ``predict``, ``predict_proba`` and ``transform`` (several
  at once allowed); none asked for: ``parameters.extra.predict_fn`` if set, else ``predict``;
- each output is the estimator method's own array (labels ``INT64`` ``[N, 1]`` (1-D answers get MLServer's ``[N, 1]``), probabilities
  ``FP64`` ``[N, classes]``...), tagged ``content_type: np``; a method answering a DataFrame is
  encoded by the codec that encodes DataFrames, as MLServer does.

Unlike MLServer, an output the estimator cannot give and input it refuses (wrong feature count, a
string where a number belongs) are 400s naming them. scikit-learn is imported when a model loads
(``pip install 'mlserver-like[sklearn]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.errors import InvalidInput
from runtime.tabular import Outputs, TabularModel, require
from runtime.types import InferenceRequest

PREDICT = "predict"
PREDICT_PROBA = "predict_proba"
TRANSFORM = "transform"
VALID_OUTPUTS = (PREDICT, PREDICT_PROBA, TRANSFORM)
PREDICT_FN_KEY = "predict_fn"


class SKLearnModel(TabularModel):
    """A scikit-learn estimator (or pipeline) loaded with joblib; see the module docstring."""

    framework = "sklearn"
    extra = "sklearn"
    filenames = ("model.joblib", "model.pickle", "model.pkl")

    _model: Any = None
    _methods: dict[str, Any]

    def load_file(self, path: Path) -> None:
        joblib = require("joblib", self.extra)
        model = joblib.load(path)
        if not callable(getattr(model, PREDICT, None)) and not callable(getattr(model, TRANSFORM, None)):
            raise TypeError(f"{path.name} holds a {type(model).__name__}, which has no predict or transform")
        self._model = model
        self._methods = {name: getattr(model, name) for name in VALID_OUTPUTS if hasattr(model, name)}
        features = getattr(model, "n_features_in_", None)
        self.features = int(features) if isinstance(features, int) else None
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self._default = str(extra.get(PREDICT_FN_KEY, PREDICT))
        if self._default not in VALID_OUTPUTS:
            raise ValueError(
                f"parameters.extra.predict_fn must be one of {list(VALID_OUTPUTS)}, got {self._default!r}"
            )

    @property
    def model(self) -> Any:
        """The loaded estimator."""
        return self._model

    def output_names(self, payload: InferenceRequest) -> list[str]:
        requested = payload.outputs
        if not requested:
            names = [self._default]
        else:
            names = []
            for out in requested:
                if out.name not in VALID_OUTPUTS:
                    raise InvalidInput(
                        f"SKLearnModel only supports '{PREDICT}', '{PREDICT_PROBA}' and '{TRANSFORM}' "
                        f"as outputs ({out.name!r} was requested)"
                    )
                if out.name not in names:
                    names.append(out.name)
        for name in names:
            if name not in self._methods:
                raise InvalidInput(
                    f"Model {self.name!r} ({_estimator_name(self._model)}) has no {name!r} output"
                )
        return names

    def compute(self, features: Any, names: list[str]) -> Outputs:
        methods = self._methods
        return [(name, methods[name](features)) for name in names]


def _estimator_name(model: Any) -> str:
    """The name of the estimator answering (the last step of a pipeline)."""
    steps = getattr(model, "steps", None)
    if isinstance(steps, list) and steps:
        return f"a pipeline ending in {type(steps[-1][-1]).__name__}"
    return f"a {type(model).__name__}"
