"""Mirror: every input comes back as an output, with its parameters, and the request's
parameters come back as the response's. The request parameter ``fail`` makes it fail:
``input`` raises InvalidInput (the client's fault), ``model`` raises RuntimeError (the model's).
``hold_ms`` makes it wait that long before answering, logging a line when it starts waiting."""

import asyncio
import logging

from runtime import MLModel
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput

logger = logging.getLogger("tests.mirror")


class Mirror(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        params = payload.parameters.model_extra if payload.parameters is not None else {}
        fail = params.get("fail")
        if fail == "input":
            raise InvalidInput("mirror was told the input is bad")
        if fail == "model":
            raise RuntimeError("mirror was told to break")
        hold = params.get("hold_ms")
        if hold:
            logger.warning("mirror holds request %s", payload.id)
            await asyncio.sleep(hold / 1000)
        return InferenceResponse(
            model_name=self.name,
            parameters=payload.parameters,
            outputs=[
                ResponseOutput(
                    name=inp.name, shape=inp.shape, datatype=inp.datatype, parameters=inp.parameters, data=inp.data
                )
                for inp in payload.inputs
            ],
        )
