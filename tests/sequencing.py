"""Helpers for the sequence tests: serve a sequence model in process, send steps, wait for states."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

from runtime.scheduling.sequence_batching import SequenceScheduler
from runtime.settings import ModelSettings
from tests.conftest import InProcess
from tests.models.seqzoo import Recorder


async def serve(server: InProcess, name: str = "seq", cls: type = Recorder, **settings: Any) -> Recorder:
    """Load a sequence model in ``server`` and return it."""
    await server.load(ModelSettings(name=name, implementation=cls, sequence_batching=True, **settings))
    model = server.registry.get(name).model
    assert isinstance(model, Recorder)
    return model


def scheduler(server: InProcess, name: str = "seq") -> SequenceScheduler:
    found = server.registry.get(name).scheduler
    assert isinstance(found, SequenceScheduler)
    return found


def body(x: int, **params: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [x]}]}
    if params:
        document["parameters"] = params
    return document


async def step(
    client: httpx.AsyncClient, x: int, model: str = "seq", headers: Any = None, **params: Any
) -> httpx.Response:
    return await client.post(f"/v2/models/{model}/infer", json=body(x, **params), headers=headers)


def total(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return int(response.json()["outputs"][0]["data"][0])


def history(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [int(v) for v in response.json()["outputs"][1]["data"]]


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``condition()`` holds, for states that no event announces (e.g. "request queued")."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.005)
