"""A model's ``@custom_handler`` methods as REST routes: while it is ready, through the error table."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from runtime.errors import InvalidInput
from runtime.handlers import custom_handler
from runtime.model import MLModel
from runtime.settings import ModelSettings
from tests.conftest import InProcess


class Handlers(MLModel):
    @custom_handler(rest_path="/my-custom-endpoint")
    async def my_payload(self, payload: list[int]) -> int:
        return sum(payload)

    @custom_handler(rest_path="/describe", rest_method="GET")
    def describe(self, request: Request) -> dict[str, Any]:
        return {"model": self.name, "query": dict(request.query_params)}

    @custom_handler(rest_path="/scale")
    async def scale(self, values: list[float], factor: float = 2.0) -> list[float]:
        return [v * float(factor) for v in values]

    @custom_handler(rest_path="/text", rest_method="GET")
    async def text(self) -> Response:
        return PlainTextResponse("plain")

    @custom_handler(rest_path="/refuse")
    async def refuse(self, payload: Any) -> None:
        raise InvalidInput("payload refused")

    @custom_handler(rest_path="/crash")
    async def crash(self, payload: Any) -> None:
        raise RuntimeError("boom")


async def test_handlers_answer_json_while_the_model_is_loaded(inprocess: InProcess) -> None:
    await inprocess.load(ModelSettings(name="handlers", implementation=Handlers))
    async with inprocess.client() as client:
        summed = await client.post("/my-custom-endpoint", json=[1, 2, 3, 4])
        described = await client.get("/describe", params={"a": "1"})
        scaled = await client.post("/scale", json={"values": [1, 2], "factor": 3})
        defaulted = await client.post("/scale?factor=4", json={"values": [1]})
        text = await client.get("/text")
        await inprocess.registry.unload("handlers")
        gone = await client.post("/my-custom-endpoint", json=[1])
    assert (summed.status_code, summed.json()) == (200, 10)
    assert described.json() == {"model": "handlers", "query": {"a": "1"}}
    assert scaled.json() == [3.0, 6.0]
    assert defaulted.json() == [4.0]
    assert (text.text, text.headers["content-type"].split(";")[0]) == ("plain", "text/plain")
    assert gone.status_code == 404 and "error" in gone.json()


async def test_errors_are_answered_by_the_error_table(inprocess: InProcess) -> None:
    await inprocess.load(ModelSettings(name="handlers", implementation=Handlers))
    async with inprocess.client() as client:
        refused = await client.post("/refuse", json={})
        crashed = await client.post("/crash", json={})
        not_json = await client.post("/my-custom-endpoint", content=b"{nope")
        lacking = await client.post("/scale", json={"factor": 2})
        wrong_method = await client.get("/my-custom-endpoint")
    assert (refused.status_code, refused.json()) == (400, {"error": "payload refused"})
    assert crashed.status_code == 500 and "boom" in crashed.json()["error"]
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]
    assert lacking.status_code == 400 and "'values'" in lacking.json()["error"]
    assert wrong_method.status_code == 404
