"""Double: y = 2 * x, for a model whose settings declare its inputs (requests are checked)."""

from runtime import MLModel
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


class Double(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = payload.inputs[0]
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name="y", shape=x.shape, datatype=x.datatype, data=x.data * 2)],
        )
