"""Models for the streaming tests: token streams, failures, and an instrumented endless stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from runtime import MLModel
from runtime.codecs import StringCodec
from runtime.errors import InvalidInput
from runtime.types import InferenceRequest, InferenceResponse, Parameters, ResponseOutput


def _int_param(request: InferenceRequest, key: str, default: int | None = None) -> int | None:
    extra = request.parameters.model_extra if request.parameters else None
    value = (extra or {}).get(key, default)
    return None if value is None else int(value)


class Words(MLModel):
    """Streams the words of its text input back, one response per word, in order.

    Its tensors are ``text_input`` and ``text_output`` unless ``parameters.extra`` names others
    (``input``, ``output``). Request parameters: ``repeat`` (say the text this many times),
    ``fail_after`` (raise after that many words), ``reject`` (raise InvalidInput before the first word).
    """

    async def load(self) -> bool:
        extra = self.settings.parameters.extra if self.settings.parameters else {}
        self.input_name = extra.get("input", "text_input")
        self.output_name = extra.get("output", "text_output")
        return True

    def _words(self, request: InferenceRequest) -> list[str]:
        if _int_param(request, "reject"):
            raise InvalidInput("rejected as asked")
        inp = next((inp for inp in request.inputs if inp.name == self.input_name), None)
        if inp is None:
            raise InvalidInput(f"this model needs a BYTES input named {self.input_name}")
        text = StringCodec.decode_input(inp)[0]
        return text.split() * (_int_param(request, "repeat", 1) or 1)

    def _response(self, text: str, finish: str | None = None) -> InferenceResponse:
        parameters = Parameters(finish_reason=finish, details={"tokens": 1}) if finish else None
        return InferenceResponse(
            model_name=self.name,
            parameters=parameters,
            outputs=[StringCodec.encode_output(self.output_name, [text])],
        )

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        words = self._words(payload)
        return self._response(" ".join(words), "length")

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            words = self._words(payload)
            fail_after = _int_param(payload, "fail_after")
            for i, word in enumerate(words):
                if fail_after is not None and i == fail_after:
                    raise RuntimeError(f"broke after {i} words")
                await asyncio.sleep(0)
                yield self._response(word, "length" if i == len(words) - 1 else None)


class Counter(MLModel):
    """Answers ``n`` (INT32) with the responses 0, 1, ..., n-1 (output ``i``), each its own event."""

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            n = int(np.asarray(payload.inputs[0].data).reshape(-1)[0])
            for i in range(n):
                await asyncio.sleep(0)
                yield InferenceResponse(
                    model_name=self.name,
                    outputs=[
                        ResponseOutput(name="i", shape=[1], datatype="INT32", data=np.array([i], np.int32))
                    ],
                )


class Endless(MLModel):
    """Streams forever (payloads of ``size`` bytes) and counts what happens to its generators.

    ``started``/``yielded``/``cancelled``/``active`` are read by in-process tests; ``all_closed`` is
    set whenever no generator is running. Its stream ends only when the consumer closes it. With
    the request parameter ``hold``, it waits forever before its first response (``holding`` is set).
    """

    async def load(self) -> bool:
        self.started = 0
        self.yielded = 0
        self.cancelled = 0
        self.active = 0
        self.all_closed = asyncio.Event()
        self.all_closed.set()
        self.holding = asyncio.Event()
        self.active_at_unload: int | None = None
        return True

    async def unload(self) -> bool:
        self.active_at_unload = self.active
        return True

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for payload in payloads:
            size = _int_param(payload, "size", 16) or 16
            chunk = np.array([b"x" * size], dtype=object)
            self.started += 1
            self.active += 1
            self.all_closed.clear()
            try:
                if _int_param(payload, "hold"):
                    self.holding.set()
                    await asyncio.Event().wait()
                while True:
                    await asyncio.sleep(0)
                    self.yielded += 1
                    yield InferenceResponse(
                        model_name=self.name,
                        outputs=[ResponseOutput(name="chunk", shape=[1], datatype="BYTES", data=chunk)],
                    )
            except (GeneratorExit, asyncio.CancelledError):
                self.cancelled += 1
                raise
            finally:
                self.active -= 1
                if self.active == 0:
                    self.all_closed.set()


class Spinner(MLModel):
    """Streams forever without ever awaiting (a model that never gives the event loop a turn)."""

    async def load(self) -> bool:
        self.cancelled = 0
        return True

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for _ in payloads:
            try:
                while True:
                    yield InferenceResponse(model_name=self.name, outputs=[])
            except (GeneratorExit, asyncio.CancelledError):
                self.cancelled += 1
                raise
