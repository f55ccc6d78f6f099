"""Shared pieces of the adaptive batching tests: settings of the row model, request bodies, waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

from runtime.core.dataplane import DataPlane
from runtime.scheduling import AdaptiveScheduler
from runtime.settings import ModelParameters, ModelSettings
from runtime.types import InferenceRequest, InferenceResponse
from tests.conftest import InProcess
from tests.models.adaptive.model import RowModel

NAME = "rows"


def row_settings(
    name: str = NAME,
    max_batch_size: int = 4,
    max_batch_time: float = 30.0,
    extra: dict[str, Any] | None = None,
    **fields: Any,
) -> ModelSettings:
    """The row model with batching on. The long default max_batch_time makes batches leave only
    when full, so that tests do not depend on timing."""
    return ModelSettings(
        name=name,
        implementation=RowModel,
        max_batch_size=max_batch_size,
        max_batch_time=max_batch_time,
        parameters=ModelParameters(extra=extra or {}),
        **fields,
    )


def body(
    rows: list[list[Any]],
    id: str | None = None,
    datatype: str = "FP32",
    parameters: dict[str, Any] | None = None,
    outputs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An infer request body whose one input ``x`` holds ``rows``."""
    width = len(rows[0]) if rows else 0
    doc: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [len(rows), width], "datatype": datatype, "data": rows}]
    }
    if id is not None:
        doc["id"] = id
    if parameters is not None:
        doc["parameters"] = parameters
    if outputs is not None:
        doc["outputs"] = outputs
    return doc


async def post(client: httpx.AsyncClient, doc: dict[str, Any], name: str = NAME) -> httpx.Response:
    return await client.post(f"/v2/models/{name}/infer", json=doc)


def model_of(server: InProcess, name: str = NAME) -> RowModel:
    model = server.registry.get(name).model
    assert isinstance(model, RowModel)
    return model


def scheduler_of(server: InProcess, name: str = NAME) -> AdaptiveScheduler:
    scheduler = server.registry.get(name).scheduler
    assert isinstance(scheduler, AdaptiveScheduler)
    return scheduler


def infer_task(
    dataplane: DataPlane, doc: dict[str, Any], name: str = NAME
) -> asyncio.Task[InferenceResponse]:
    """A caller of the core, as a task the test can cancel."""
    return asyncio.create_task(dataplane.infer(InferenceRequest.model_validate(doc), name))


async def until(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Yield to the event loop until ``condition`` holds (each step lets queued callbacks run)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0)


def params(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    parameters: dict[str, Any] = response.json()["parameters"]
    return parameters


def output(response: httpx.Response, name: str) -> Any:
    for out in response.json()["outputs"]:
        if out["name"] == name:
            return out
    raise AssertionError(f"no output {name!r} in {response.json()}")
