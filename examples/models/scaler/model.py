"""A standard scaler: (x - mean) / scale per feature, with the statistics from model-settings.json."""

import numpy as np

from runtime import MLModel
from runtime.codecs import NumpyCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse


class Scaler(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self.mean = np.asarray(extra["mean"], dtype=np.float32)
        self.scale = np.asarray(extra["scale"], dtype=np.float32)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = self.decode(payload.inputs[0], default_codec=NumpyCodec)
        if x.shape[-1] != self.mean.shape[0]:
            raise InvalidInput(f"input must have {self.mean.shape[0]} features, got {x.shape[-1]}")
        scaled = (x.astype(np.float32) - self.mean) / self.scale
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("scaled", scaled)])
