"""Echo: returns every input as an output of the same name, shape and datatype."""

from runtime import MLModel
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


class EchoModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                ResponseOutput(name=inp.name, shape=inp.shape, datatype=inp.datatype, data=inp.data)
                for inp in payload.inputs
            ],
        )
