"""Mirror: every input comes back as an output, with its parameters, and the request's
parameters come back as the response's. The request parameter ``fail`` makes it fail:
``input`` raises InvalidInput (the client's fault), ``model`` raises RuntimeError (the model's).
``hold_ms`` makes it wait that long before answering, logging a line when it starts waiting and
one if it is cancelled. ``reply_header`` asks it to answer with that value in the header x-mirror."""

import asyncio
import logging

from runtime import MLModel
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput

logger = logging.getLogger("tests.mirror")


class Mirror(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        params = (payload.parameters.model_extra or {}) if payload.parameters is not None else {}
        fail = params.get("fail")
        if fail == "input":
            raise InvalidInput("mirror was told the input is bad")
        if fail == "model":
            raise RuntimeError("mirror was told to break")
        hold = params.get("hold_ms")
        if hold:
            logger.warning("mirror holds request %s", payload.id)
            try:
                await asyncio.sleep(hold / 1000)
            except asyncio.CancelledError:
                logger.warning("mirror request %s was cancelled", payload.id)
                raise
        parameters = payload.parameters
        if "reply_header" in params:
            parameters = Parameters(**params, headers={"x-mirror": params["reply_header"]})
        return InferenceResponse(
            model_name=self.name,
            parameters=parameters,
            outputs=[
                ResponseOutput(
                    name=inp.name,
                    shape=inp.shape,
                    datatype=inp.datatype,
                    parameters=inp.parameters,
                    data=inp.data,
                )
                for inp in payload.inputs
            ],
        )
