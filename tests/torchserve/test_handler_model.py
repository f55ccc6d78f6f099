"""``runtime.torchserve.handler_model``: a TorchServe handler served as a model over the OIP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ts", reason="the torchserve extra (pip install -e '.[torchserve]') is not installed")

from runtime.repository import read_repository
from tests.conftest import InProcess
from tests.frontends.torchserve.test_rest_api import archive

pytestmark = pytest.mark.anyio


async def test_a_v2_request_without_an_id_gives_the_handler_the_id_it_is_answered_with(
    tmp_path: Path, inprocess: InProcess
) -> None:
    """The handler's ``context.get_request_id`` and the answer's ``id`` are the one id
    ``runtime.ids.assign_id`` gives the request."""
    archive(tmp_path, "echo", "echo_handler.py")
    found, broken = read_repository(tmp_path)
    assert not broken
    await inprocess.load(*found)
    body = {"inputs": [{"name": "body", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    async with inprocess.client() as client:
        response = await client.post("/v2/models/echo/infer", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    seen = json.loads(answer["outputs"][0]["data"][0])
    assert seen["data"] == {"body": {"bytes": "hi"}}
    assert answer["id"] and seen["request_id"] == answer["id"]
