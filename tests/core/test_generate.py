"""The generate extension takes infer's path: over a real server, a client that goes away cancels
the model's work, and TorchServe's sequence headers open, continue and end a sequence.

``/generate`` is served as ``/infer`` and ``/generate_stream`` as ``/infer_stream`` (one path in
``runtime.frontends.rest.sse_routes``); these tests pin what that path gives them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import aconnect_sse

from runtime import MLModel, SequenceModel, SequenceStep
from runtime.codecs import StringCodec
from runtime.server.serving import Server
from runtime.settings import ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from tests.servers import serving

pytestmark = pytest.mark.anyio


def text_response(name: str, text: str) -> InferenceResponse:
    return InferenceResponse(model_name=name, outputs=[StringCodec.encode_output("text_output", [text])])


class Stalling(MLModel):
    """``predict`` waits until it is cancelled; ``predict_stream`` streams "tok" until it is closed.
    Each counts how its work ended (``cancelled``) and sets ``ended`` then."""

    async def load(self) -> bool:
        self.predicting = asyncio.Event()
        self.streaming = asyncio.Event()
        self.ended = asyncio.Event()
        self.cancelled = 0
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        self.predicting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.ended.set()
            raise
        raise AssertionError("unreachable")

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        async for _ in payloads:
            try:
                while True:
                    yield text_response(self.name, "tok")
                    self.streaming.set()
                    await asyncio.sleep(0.001)
            except (GeneratorExit, asyncio.CancelledError):
                self.cancelled += 1
                self.ended.set()
                raise


class Transcript(SequenceModel):
    """A sequence model over text: each step answers everything its sequence was sent so far."""

    async def predict_sequences(self, steps: list[SequenceStep]) -> list[InferenceResponse | BaseException]:
        answers: list[InferenceResponse | BaseException] = []
        for step in steps:
            text = (step.state or "") + StringCodec.decode_input(step.request.inputs[0])[0]
            step.state = text
            answers.append(text_response(self.name, text))
        return answers


STALLING = ModelSettings(name="stalling", implementation=Stalling)
TRANSCRIPT = ModelSettings(name="transcript", implementation=Transcript, sequence_batching=True)


def stalling(server: Server) -> Stalling:
    model = server.registry.get("stalling").model
    assert isinstance(model, Stalling)
    return model


async def test_generate_cancels_the_model_when_the_client_goes_away() -> None:
    """Race: the client leaves while ``predict`` runs; the model's coroutine is cancelled."""
    async with serving(STALLING) as server:
        model = stalling(server)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60.0) as client:
            call = asyncio.ensure_future(
                client.post("/v2/models/stalling/generate", json={"text_input": "hi"})
            )
            await asyncio.wait_for(model.predicting.wait(), 30)
            call.cancel()  # the connection closes: the server sees http.disconnect
            with pytest.raises(asyncio.CancelledError):
                await call
        await asyncio.wait_for(model.ended.wait(), 30)
        assert model.cancelled == 1
        assert server.dataplane.ready()


@pytest.mark.parametrize("first_event", [True, False], ids=["mid-stream", "before-the-first-event"])
async def test_generate_stream_closes_the_models_generator_when_the_client_goes_away(
    first_event: bool,
) -> None:
    """Race: the client leaves while the model streams (or before its first answer is sent)."""
    async with serving(STALLING) as server:
        model = stalling(server)
        url = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
            if first_event:
                async with aconnect_sse(
                    client, "POST", "/v2/models/stalling/generate_stream", json={"text_input": "hi"}
                ) as source:
                    async for event in source.aiter_sse():
                        assert orjson.loads(event.data)["text_output"] == "tok"
                        break
            else:
                body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
                call = asyncio.ensure_future(client.post("/v2/models/stalling/generate_stream", json=body))
                await asyncio.wait_for(model.streaming.wait(), 30)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
        await asyncio.wait_for(model.ended.wait(), 30)
        assert model.cancelled == 1
        await asyncio.wait_for(server.dataplane.streams.wait_idle(), 30)


def sequence_headers(sequence_id: str, **flags: bool) -> dict[str, str]:
    headers = {"ts_request_sequence_id": sequence_id}
    headers.update({f"ts_request_sequence_{name}": "true" for name, on in flags.items() if on})
    return headers


async def generate_stream(
    client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
) -> list[Any]:
    async with aconnect_sse(
        client, "POST", "/v2/models/transcript/generate_stream", json=body, headers=headers
    ) as source:
        assert source.response.status_code == 200
        return [(event.event, orjson.loads(event.data)) async for event in source.aiter_sse()]


async def test_sequence_headers_open_continue_and_end_a_sequence_through_generate() -> None:
    async with serving(TRANSCRIPT) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60.0) as client:
            opened = await client.post(
                "/v2/models/transcript/generate",
                json={"text_input": "a"},
                headers=sequence_headers("s1", start=True),
            )
            assert opened.status_code == 200, opened.text
            assert opened.json()["text_output"] == "a"
            assert opened.headers["ts_request_sequence_id"] == "s1"

            events = await generate_stream(client, {"text_input": "b"}, sequence_headers("s1"))
            assert events == [("message", {"text_output": "ab", "model_name": "transcript"})]

            tensor = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["c"]}]}
            ended = await client.post(
                "/v2/models/transcript/generate", json=tensor, headers=sequence_headers("s1", end=True)
            )
            assert ended.status_code == 200, ended.text
            assert ended.json()["outputs"][0]["data"] == ["abc"]
            assert ended.headers["ts_request_sequence_end"] == "true"

            after = await client.post(
                "/v2/models/transcript/generate", json={"text_input": "d"}, headers=sequence_headers("s1")
            )
            assert after.status_code == 400
            assert "s1" in after.json()["error"]

            # a sequence opened on generate_stream goes on through generate
            events = await generate_stream(client, {"text_input": "x"}, sequence_headers("s2", start=True))
            assert events == [("message", {"text_output": "x", "model_name": "transcript"})]
            more = await client.post(
                "/v2/models/transcript/generate",
                json={"text_input": "y"},
                headers=sequence_headers("s2", end=True),
            )
            assert more.json()["text_output"] == "xy"
