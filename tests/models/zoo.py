"""Small models the tests serve."""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from runtime import MLModel
from runtime.codecs import NumpyCodec, StringCodec
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput


class Echo(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            parameters=payload.parameters,
            outputs=[
                ResponseOutput(name=i.name, shape=i.shape, datatype=i.datatype, data=i.data)
                for i in payload.inputs
            ],
        )


class VersionTag(MLModel):
    """Answers with its own version, so tests can see which version served them."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name, outputs=[StringCodec.encode_output("version", [self.version or ""])]
        )


class FailingLoad(MLModel):
    async def load(self) -> bool:
        raise RuntimeError("weights file is corrupt")


class Raising(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        raise ValueError("the model broke")


class Slow(MLModel):
    """Sleeps for the seconds given in its input, then answers them."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        seconds = float(NumpyCodec.decode_input(payload.inputs[0]).reshape(-1)[0])
        logging.getLogger("runtime.tests.slow").warning("slow model holds a request for %s s", seconds)
        await asyncio.sleep(seconds)
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("slept", np.array([seconds]))]
        )


class Summer(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("sum", x.sum(axis=-1, keepdims=True))]
        )


class WrongOutput(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name, outputs=[ResponseOutput(name="y", shape=[3], datatype="FP32", data=[1.0])]
        )
