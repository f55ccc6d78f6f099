"""Spell: answers its text back; streamed, one character per response. Its details are the
generate extension's (finish_reason, and a token per character); generate parameters are ignored."""

from collections.abc import AsyncIterator
from typing import Any

from runtime import MLModel
from runtime.codecs import StringCodec
from runtime.types import InferenceRequest, InferenceResponse, Parameters


def _token(char: str) -> dict[str, Any]:
    return {"id": ord(char), "text": char, "logprob": 0.0, "special": False}


class Spell(MLModel):
    def _response(self, text: str, details: dict[str, Any] | None) -> InferenceResponse:
        return InferenceResponse(
            model_name=self.name,
            parameters=(
                Parameters.model_validate({"finish_reason": "length", "details": details})
                if details is not None
                else None
            ),
            outputs=[StringCodec.encode_output("text_output", [text])],
        )

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        text = StringCodec.decode_input(payload.inputs[0])[0]
        return self._response(text, {"logprobs": [_token(char) for char in text]})

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            text = StringCodec.decode_input(payload.inputs[0])[0]
            for i, char in enumerate(text):
                yield self._response(char, {"token": _token(char)} if i == len(text) - 1 else None)
            if not text:
                yield self._response("", {"token": _token(" ")})
