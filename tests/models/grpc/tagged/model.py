"""Tagged: answers with the ``tag`` of its model-settings.json, read when it loads."""

import numpy as np

from runtime import MLModel
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput


class Tagged(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self.tag = extra["tag"]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            parameters=Parameters(tag=self.tag),
            outputs=[
                ResponseOutput(
                    name="tag", shape=[1], datatype="BYTES", data=np.array([self.tag.encode()], dtype=object)
                )
            ],
        )
