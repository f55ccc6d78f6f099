"""The LSTM example (examples/sequences/lstm) carries each sequence's hidden state between requests,
in shared batches; its client runs against a real server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any, cast

import httpx
import numpy as np
import pytest

from runtime.repository import import_model_class
from runtime.settings import ModelSettings
from tests.conftest import ROOT, InProcess
from tests.servers import start_server

EXAMPLE = ROOT / "examples" / "sequences" / "lstm"


@pytest.mark.anyio
async def test_chunked_sequences_match_one_pass_over_the_whole_utterance(inprocess: InProcess) -> None:
    """Race: eight utterances stream their chunks concurrently, so their steps share batches; each
    must still get exactly what the LSTM computes over its whole utterance at once."""
    import torch

    settings = ModelSettings.from_file(EXAMPLE / "model-settings.json")
    assert settings.parameters is not None
    settings.parameters.extra.update(hidden=32, classes=8)  # the example's layout, small and fast
    settings.max_batch_time = 0.02
    await inprocess.load(settings)
    model = inprocess.registry.get("lstm").model
    rng = np.random.default_rng(0)
    utterances = [rng.standard_normal((12, 80), dtype=np.float32) for _ in range(8)]

    async def stream(client: httpx.AsyncClient, n: int) -> np.ndarray:
        outputs = []
        for i, chunk in enumerate(np.split(utterances[n], 3)):
            params = {"sequence_id": n + 1, "sequence_start": i == 0, "sequence_end": i == 2}
            tensor = {
                "name": "frames",
                "shape": list(chunk.shape),
                "datatype": "FP32",
                "data": chunk.ravel().tolist(),
            }
            response = await client.post(
                "/v2/models/lstm/infer", json={"inputs": [tensor], "parameters": params}
            )
            assert response.status_code == 200, response.text
            out = response.json()["outputs"][0]
            outputs.append(np.asarray(out["data"], dtype=np.float32).reshape(out["shape"]))
        return np.concatenate(outputs)

    async with inprocess.client() as client:
        chunked = await asyncio.gather(*(stream(client, n) for n in range(8)))
        stats = (await client.get("/v2/models/lstm")).json()["parameters"]["stats"]
    assert stats["largest_batch"] > 1 and stats["open_sequences"] == 0 and stats["ended"]["end"] == 8
    assert isinstance(model, import_model_class(settings))
    with torch.inference_mode():
        for n, utterance in enumerate(utterances):
            zeros = torch.zeros(2, 1, 32)
            whole, _ = cast(Any, model).net(torch.from_numpy(utterance)[None], (zeros, zeros))
            np.testing.assert_allclose(chunked[n], whole[0].numpy(), rtol=1e-4, atol=1e-5)


def test_lstm_client_example_over_rest_and_one_grpc_stream() -> None:
    """The same utterances over REST (one request at a time per utterance) and over one pipelined
    gRPC stream (every chunk sent at once) must get the same answers: same state, same order."""
    server = start_server(EXAMPLE.parent)
    client = [sys.executable, str(ROOT / "examples" / "clients" / "lstm_client.py"), "--sequences", "8"]
    try:
        rest = subprocess.run(
            [*client, server.http_url], capture_output=True, text=True, timeout=120, check=True
        )
        grpc = subprocess.run(
            [*client, "--grpc", server.grpc_address], capture_output=True, text=True, timeout=120, check=True
        )
    finally:
        server.stop()
    answers = [line for line in rest.stdout.splitlines() if line.startswith("utt-")]
    assert len(answers) == 8 and "40 chunks in" in rest.stdout
    assert [line for line in grpc.stdout.splitlines() if line.startswith("utt-")] == answers
