"""``MLflowModel``: an MLflow model folder, loaded with ``mlflow.pyfunc.load_model``.

- Where: ``parameters.uri`` in model-settings.json (relative to the model's folder) when given,
  else the model's folder; either must hold the ``MLmodel`` file. Every flavour pyfunc loads is
  served, scikit-learn's skops and cloudpickle files among them.
- Metadata and content type come from the signature (``runtime.mlflow.signature``), read from the
  MLmodel file without mlflow, so the server process of a model that worker processes run
  describes it too. Inputs and outputs declared in model-settings.json win over the signature's,
  and so does ``parameters.content_type``.
- ``predict`` checks the request against the signature (a 400 naming the input), decodes it (a
  DataFrame for a column signature), passes the signature's ``params`` found in the request's
  parameters, calls the model and encodes its answer as mlserver-mlflow does
  (``runtime.mlflow.payloads``). It is a plain function: the model's ``predict_threads`` run it off
  the event loop.
- mlflow's own schema errors (``MlflowException``) and the ValueError/TypeError a model raises
  for input it cannot take are the client's (400); anything else is the model's failure (500).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from runtime.errors import InvalidInput, shown
from runtime.mlflow.payloads import declared_tensors, decoded, encoded, params_of
from runtime.mlflow.signature import Signature, model_folder, read_signature
from runtime.model import MLModel
from runtime.settings import ModelParameters, ModelSettings
from runtime.types import InferenceRequest, InferenceResponse, MetadataModelResponse, Parameters

MLFLOW_MISSING = "MLflow models need mlflow: pip install 'mlserver-like[mlflow]'"


def _mlflow_message(exc: Exception) -> str:
    """mlflow's message without the data it quotes (a whole DataFrame, for a schema error)."""
    message = str(getattr(exc, "message", exc))
    _, found, tail = message.rpartition("Error: ")
    return (tail if found else message).strip()


class MLflowModel(MLModel):
    """An MLflow model folder (``MLmodel``), served as mlserver-mlflow's ``MLflowRuntime``."""

    def __init__(self, settings: ModelSettings) -> None:
        super().__init__(settings)
        self._pyfunc: Any = None
        self._mlflow_error: type[Exception] | None = None
        self._signature: Signature | None = None

    @property
    def folder(self) -> Path:
        """The folder holding the model's ``MLmodel`` file."""
        uri = self._settings.parameters.uri if self._settings.parameters else None
        if uri and uri.startswith("file://"):
            uri = uri[len("file://") :]
        return model_folder(uri, str(self._settings.folder) if self._settings.folder else None)

    @property
    def signature(self) -> Signature:
        """The model's signature, read from its MLmodel file once."""
        if self._signature is None:
            self._signature = read_signature(self.folder)
        return self._signature

    @property
    def content_type(self) -> str | None:
        """The model's default content type: model-settings.json's, else its signature's."""
        own = self._settings.parameters.content_type if self._settings.parameters else None
        return own or self.signature.content_type

    async def load(self) -> bool:
        await asyncio.to_thread(lambda: self.signature)
        try:
            import mlflow.pyfunc
            from mlflow.exceptions import MlflowException
        except ImportError as exc:
            raise RuntimeError(MLFLOW_MISSING) from exc
        self._mlflow_error = MlflowException
        try:
            self._pyfunc = await asyncio.to_thread(mlflow.pyfunc.load_model, str(self.folder))
        except Exception as exc:
            raise RuntimeError(
                f"mlflow.pyfunc.load_model could not load the MLflow model in {self.folder}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if self._settings.parameters is None:
            self._settings.parameters = ModelParameters()
        if not self._settings.parameters.content_type:  # the default content type decoding reads
            self._settings.parameters.content_type = self.signature.content_type
        return True

    async def unload(self) -> bool:
        self._pyfunc = None
        return True

    async def metadata(self) -> MetadataModelResponse:
        signature = await asyncio.to_thread(lambda: self.signature)
        meta = await super().metadata()
        if not self._settings.inputs and signature.inputs:
            meta.inputs = declared_tensors(signature.inputs)
        if not self._settings.outputs and signature.outputs:
            meta.outputs = declared_tensors(signature.outputs)
        if meta.parameters is None and self.content_type:
            meta.parameters = Parameters(content_type=self.content_type)
        return meta

    def predict(self, payload: InferenceRequest) -> InferenceResponse:  # type: ignore[override]
        if self._pyfunc is None:
            raise RuntimeError(f"MLflow model {self.name!r} is not loaded")
        signature = self.signature
        data = decoded(payload, signature, self.content_type, self.name)
        params = params_of(payload, signature)
        try:
            if params is None:
                prediction = self._pyfunc.predict(data)
            else:
                prediction = self._pyfunc.predict(data, params=params)
        except Exception as exc:
            if self._mlflow_error is not None and isinstance(exc, self._mlflow_error):
                raise InvalidInput(
                    f"The request does not fit the signature of model {shown(self.name)}: {_mlflow_message(exc)}"
                ) from exc
            if isinstance(exc, (ValueError, TypeError)):
                names = [inp.name for inp in payload.inputs]
                raise InvalidInput(f"Model {shown(self.name)} cannot take input(s) {names}: {exc}") from exc
            raise
        return encoded(self.name, self.version, prediction)
