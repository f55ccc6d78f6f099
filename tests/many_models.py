"""Model repositories of ``Ballast`` models (tests/models/ballast.py) for the many-models tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from runtime.server.serving import Server
from runtime.settings import Settings

MIB = 1024 * 1024


def write_model(root: Path, name: str, k: float, **settings: Any) -> Path:
    """A folder ``root/name`` whose model answers x + k, holding ``mib`` MiB (default 40)."""
    extra = {"k": k, **settings.pop("extra", {})}
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    body = {"name": name, "implementation": "tests.models.ballast.Ballast", "parameters": {"extra": extra}}
    (folder / "model-settings.json").write_text(json.dumps({**body, **settings}))
    return folder


def body(x: float, **extra: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [x]}], **extra}


def answer(response: httpx.Response) -> float:
    assert response.status_code == 200, response.text
    return float(response.json()["outputs"][0]["data"][0])


def metric(exposition: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


@asynccontextmanager
async def serving_repository(root: Path, **settings: Any) -> AsyncIterator[Server]:
    """A real server in this loop on the models of ``root`` (found as ``mlserver-like start`` finds
    them), 127.0.0.1, free ports."""
    settings.setdefault("metrics_port", 0)
    settings.setdefault("management_port", 0)
    server = Server(
        Settings(
            host="127.0.0.1",
            http_port=0,
            grpc_port=0,
            shutdown_grace_period=5,
            model_repository_root=str(root),
            **settings,
        )
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
