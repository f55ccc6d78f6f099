"""The PyTorch runtime under continuous batching: the example token decoder, served from its saved
files by a real server, generates exactly what the model's own generation loop does.

``decoder-stream`` (TorchScript, continuous batching) feeds each stream's ``next_token`` back as
its ``tokens`` and its hidden state back as ``h0``/``c0``, step after step, until ``max_steps``,
the request's ``max_tokens`` or the end token 0. ``decoder-chat`` (state_dict, continuous and
sequence batching) also keeps the state between the requests of a sequence.

Comparisons: a stream alone must equal the own loop bit for bit (CPU float32). Streams that share
a step run in one forward call, where the linear head's results for a row may differ from a
batch of one by a few ulps, so those are compared with a tight tolerance, and tokens exactly.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton_grpc
from httpx_sse import aconnect_sse
from torch import nn

from runtime.settings import ModelSettings
from tests.conftest import InProcess
from tests.servers import RunningServer, start_server
from tests.torch_helpers import build_repository, settings_of

HIDDEN = 32
OUTPUT_NAMES = ("next_token", "logits", "h", "c")
Chunk = dict[str, np.ndarray]


@pytest.fixture(scope="session")
def torch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def decoder_server(
    torch_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("decoders")
    for folder in ("decoder-stream", "decoder-chat"):
        settings = _settings(torch_repository, folder)
        (root / folder).mkdir()
        document = settings.model_dump(mode="json", exclude_none=True, exclude={"folder"})
        (root / folder / "model-settings.json").write_text(json.dumps(document))
        for source in (torch_repository / folder).glob("*.py"):  # decoder-chat's class
            shutil.copy(source, root / folder)
    server = start_server(root, "--grpc-stream-format", "triton")
    yield server
    assert server.stop() == 0


def _settings(root: Path, folder: str, **changes: Any) -> ModelSettings:
    settings = settings_of(root, folder)
    assert settings.parameters is not None and settings.parameters.uri is not None
    settings.parameters.uri = str(root / folder / settings.parameters.uri)
    if settings.parameters.extra.get("module_class"):  # the class file beside the weights
        settings = settings.model_copy(update={"folder": root / folder})
    return settings.model_copy(update=changes)


def _with_extra(settings: ModelSettings, **extra: Any) -> ModelSettings:
    assert settings.parameters is not None
    parameters = settings.parameters.model_copy(update={"extra": {**settings.parameters.extra, **extra}})
    return settings.model_copy(update={"parameters": parameters})


# ---------------------------------------------------------------------- the model's own generation


def own_decoder(root: Path, folder: str = "decoder-stream") -> Any:
    if folder == "decoder-stream":
        return torch.jit.load(str(root / folder / "decoder.pt"))
    spec = importlib.util.spec_from_file_location("_own_decoder", root / folder / "decoder.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.Decoder()
    net.load_state_dict(torch.load(root / folder / "decoder.pth", weights_only=True))
    return net.eval()


def own_generation(
    module: Any, prompt: np.ndarray, steps: int, state: tuple[np.ndarray, np.ndarray] | None = None
) -> list[Chunk]:
    """What the model's own loop produces: one chunk per step, fed its own next token and state,
    until ``steps`` steps or every row says 0."""
    rows = prompt.shape[0]
    tokens = torch.from_numpy(prompt.copy())
    if state is None:
        h, c = torch.zeros(rows, 1, HIDDEN), torch.zeros(rows, 1, HIDDEN)
    else:
        h, c = torch.from_numpy(state[0].copy()), torch.from_numpy(state[1].copy())
    chunks = []
    with torch.inference_mode():
        for _ in range(steps):
            next_token, logits, h, c = module(tokens, h, c)
            chunks.append(
                {
                    name: t.numpy().copy()
                    for name, t in zip(OUTPUT_NAMES, (next_token, logits, h, c), strict=True)
                }
            )
            tokens = next_token
            if bool((next_token == 0).all()):
                break
    return chunks


def _same(got: list[Chunk], expected: list[Chunk], exact: bool = True) -> None:
    assert len(got) == len(expected), ([g["next_token"].ravel().tolist() for g in got], len(expected))
    for step, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        for name in OUTPUT_NAMES:
            if name not in mine:
                continue
            if exact or name == "next_token":
                assert np.array_equal(mine[name], theirs[name]), (step, name)
            else:
                np.testing.assert_allclose(
                    mine[name], theirs[name], rtol=1e-5, atol=1e-6, err_msg=f"{step} {name}"
                )


def _tokens(prompt: np.ndarray) -> dict[str, Any]:
    return {
        "name": "tokens",
        "datatype": "INT64",
        "shape": list(prompt.shape),
        "data": prompt.ravel().tolist(),
    }


def _chunk(document: dict[str, Any]) -> Chunk:
    dtypes = {"INT64": np.int64, "FP32": np.float32}
    return {
        out["name"]: np.asarray(out["data"], dtype=dtypes[out["datatype"]]).reshape(out["shape"])
        for out in document["outputs"]
    }


async def _stream(
    client: httpx.AsyncClient, url: str, prompt: np.ndarray, **parameters: Any
) -> tuple[list[Chunk], list[int]]:
    """One SSE stream: its chunks and the batch size of each."""
    body = {"inputs": [_tokens(prompt)], "parameters": parameters}
    chunks, sizes = [], []
    async with aconnect_sse(client, "POST", url, json=body) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for event in source.aiter_sse():
            assert event.event == "message", event.data
            document = json.loads(event.data)
            chunks.append(_chunk(document))
            sizes.append(document["parameters"]["batch_size"])
    return chunks, sizes


# ---------------------------------------------------------------------- streams over REST (SSE)


def test_a_stream_equals_the_models_own_generation(
    decoder_server: RunningServer, torch_repository: Path
) -> None:
    module = own_decoder(torch_repository)
    prompt = np.array([[3, 4]], dtype=np.int64)

    async def run() -> tuple[list[Chunk], list[int]]:
        async with httpx.AsyncClient(base_url=decoder_server.http_url, timeout=60) as client:
            return await _stream(client, "/v2/models/decoder-stream/infer_stream", prompt)

    chunks, sizes = asyncio.run(run())
    expected = own_generation(module, prompt, 32)
    _same(chunks, expected)
    assert [int(c["next_token"][0, 0]) for c in chunks] == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0]
    assert sizes == [1] * len(chunks)


def test_concurrent_streams_share_steps_and_each_gets_its_own_generation(
    decoder_server: RunningServer, torch_repository: Path
) -> None:
    module = own_decoder(torch_repository)
    rng = np.random.default_rng(5)
    cases = []
    for index in range(12):
        rows, length = 1 + index % 2, 1 + index % 3  # prompts of 1 to 3 tokens, 1 or 2 rows
        cases.append((rng.integers(1, 10, size=(rows, length), dtype=np.int64), 4 + index))

    async def run() -> list[tuple[list[Chunk], list[int]]]:
        async with httpx.AsyncClient(base_url=decoder_server.http_url, timeout=60) as client:
            url = "/v2/models/decoder-stream/infer_stream"
            return await asyncio.gather(*(_stream(client, url, p, max_tokens=n) for p, n in cases))

    served = asyncio.run(run())
    for (prompt, steps), (chunks, _) in zip(cases, served, strict=True):
        _same(chunks, own_generation(module, prompt, steps), exact=False)
    assert max(size for _, sizes in served for size in sizes) > 1


def test_unary_infer_stacks_the_steps_and_keeps_the_last_state(
    decoder_server: RunningServer, torch_repository: Path
) -> None:
    prompt = np.array([[9], [12]], dtype=np.int64)
    body = {"inputs": [_tokens(prompt)], "parameters": {"max_tokens": 5}}
    response = httpx.post(f"{decoder_server.http_url}/v2/models/decoder-stream/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    got = _chunk(response.json())
    expected = own_generation(own_decoder(torch_repository), prompt, 5)
    assert got["next_token"].shape == (2, 5, 1) and got["logits"].shape == (2, 5, 16)
    assert np.array_equal(got["next_token"], np.stack([e["next_token"] for e in expected], axis=1))
    assert np.array_equal(got["logits"], np.stack([e["logits"] for e in expected], axis=1))
    assert np.array_equal(got["h"], expected[-1]["h"]) and np.array_equal(got["c"], expected[-1]["c"])
    assert got["next_token"][:, :, 0].tolist() == [[10, 11, 12, 13, 14], [13, 14, 15, 0, 0]]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"parameters": {"max_tokens": 33}}, 400, "more than this model's max_steps (32)"),
        ({"parameters": {"max_tokens": "many"}}, 400, "'max_tokens' must be a positive integer"),
        ({"parameters": {"max_tokens": 0}}, 400, "'max_tokens' must be a positive integer"),
        (
            {"inputs": [{"name": "token", "datatype": "INT64", "shape": [1, 1], "data": [3]}]},
            400,
            "no input 'token'",
        ),
        (
            {"inputs": [{"name": "tokens", "datatype": "FP32", "shape": [1, 1], "data": [3]}]},
            400,
            "must be INT64",
        ),
    ],
)
def test_bad_requests_are_refused_before_the_stream(
    decoder_server: RunningServer, body: dict[str, Any], status: int, message: str
) -> None:
    document = {"inputs": [_tokens(np.array([[3]], dtype=np.int64))], **body}
    for endpoint in ("infer_stream", "infer"):
        response = httpx.post(
            f"{decoder_server.http_url}/v2/models/decoder-stream/{endpoint}", json=document, timeout=60
        )
        assert response.status_code == status, response.text
        assert message in response.json()["error"]
    assert httpx.get(f"{decoder_server.http_url}/v2/health/ready").status_code == 200


def test_a_failing_stream_ends_alone(decoder_server: RunningServer, torch_repository: Path) -> None:
    """Token 99 is outside the vocabulary: the embedding raises for that stream's step; the step is
    run again stream by stream, so that only that stream ends (500), and the others go on."""
    module = own_decoder(torch_repository)
    good = np.array([[2]], dtype=np.int64)

    async def run() -> tuple[list[Chunk], int, dict[str, Any]]:
        async with httpx.AsyncClient(base_url=decoder_server.http_url, timeout=60) as client:
            task = asyncio.ensure_future(_stream(client, "/v2/models/decoder-stream/infer_stream", good))
            body = {"inputs": [_tokens(np.array([[99]], dtype=np.int64))]}
            bad = await client.post("/v2/models/decoder-stream/infer", json=body)
            chunks, _ = await task
            return chunks, bad.status_code, bad.json()

    chunks, status, document = asyncio.run(run())
    assert status == 500 and "index" in document["error"].lower(), document
    _same(chunks, own_generation(module, good, 32), exact=False)


# ---------------------------------------------------------------------- gRPC (tritonclient, Triton's stream format)


def _triton_tokens(prompt: np.ndarray) -> list[triton_grpc.InferInput]:
    tensor = triton_grpc.InferInput("tokens", list(prompt.shape), "INT64")
    tensor.set_data_from_numpy(prompt)
    return [tensor]


def test_tritonclient_streams_equal_the_own_generation(
    decoder_server: RunningServer, torch_repository: Path
) -> None:
    module = own_decoder(torch_repository)
    prompts = {"a": np.array([[1, 2]], dtype=np.int64), "b": np.array([[6]], dtype=np.int64)}
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = triton_grpc.InferenceServerClient(decoder_server.grpc_address)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    got: dict[str, list[Chunk]] = {"a": [], "b": []}
    try:
        for key, prompt in prompts.items():
            client.async_stream_infer("decoder-stream", _triton_tokens(prompt), request_id=key)
        finished: set[str] = set()
        while finished != set(prompts):
            result, error = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            got[response.id].append({name: result.as_numpy(name) for name in OUTPUT_NAMES})
            if response.parameters["triton_final_response"].bool_param:
                finished.add(response.id)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    for key, prompt in prompts.items():
        _same(got[key], own_generation(module, prompt, 32), exact=False)


# ---------------------------------------------------------------------- with sequences: the state goes on


def test_a_sequence_goes_on_from_its_previous_request(
    decoder_server: RunningServer, torch_repository: Path
) -> None:
    module = own_decoder(torch_repository, "decoder-chat")
    url = f"{decoder_server.http_url}/v2/models/decoder-chat/infer"
    first_prompt, second_prompt = np.array([[3, 4]], dtype=np.int64), np.array([[7]], dtype=np.int64)
    first = httpx.post(
        url,
        timeout=60,
        json={
            "inputs": [_tokens(first_prompt)],
            "parameters": {"sequence_id": "chat-1", "sequence_start": True, "max_tokens": 3},
        },
    )
    assert first.status_code == 200, first.text
    expected_first = own_generation(module, first_prompt, 3)
    assert _chunk(first.json())["next_token"].ravel().tolist() == [5, 6, 7]
    assert np.array_equal(_chunk(first.json())["h"], expected_first[-1]["h"])

    async def second() -> list[Chunk]:
        async with httpx.AsyncClient(base_url=decoder_server.http_url, timeout=60) as client:
            chunks, _ = await _stream(
                client,
                "/v2/models/decoder-chat/infer_stream",
                second_prompt,
                sequence_id="chat-1",
                sequence_end=True,
                max_tokens=4,
            )
            return chunks

    state = (expected_first[-1]["h"], expected_first[-1]["c"])
    _same(asyncio.run(second()), own_generation(module, second_prompt, 4, state))
    ended = httpx.post(
        url, timeout=60, json={"inputs": [_tokens(second_prompt)], "parameters": {"sequence_id": "chat-1"}}
    )
    assert ended.status_code == 400, ended.text


def test_a_later_request_of_a_sequence_waits_for_the_earlier_stream(
    decoder_server: RunningServer, torch_repository: Path
) -> None:
    module = own_decoder(torch_repository, "decoder-chat")
    first_prompt, second_prompt = np.array([[1]], dtype=np.int64), np.array([[2]], dtype=np.int64)

    async def run() -> tuple[list[Chunk], dict[str, Any]]:
        async with httpx.AsyncClient(base_url=decoder_server.http_url, timeout=60) as client:
            body = {
                "inputs": [_tokens(first_prompt)],
                "parameters": {"sequence_id": 7, "sequence_start": True, "max_tokens": 10},
            }
            chunks: list[Chunk] = []
            async with aconnect_sse(
                client, "POST", "/v2/models/decoder-chat/infer_stream", json=body
            ) as source:
                events = source.aiter_sse()
                chunks.append(_chunk(json.loads((await anext(events)).data)))
                later = asyncio.ensure_future(
                    client.post(
                        "/v2/models/decoder-chat/infer",
                        json={
                            "inputs": [_tokens(second_prompt)],
                            "parameters": {"sequence_id": 7, "sequence_end": True, "max_tokens": 3},
                        },
                    )
                )
                async for event in events:
                    chunks.append(_chunk(json.loads(event.data)))
            response = await later
            assert response.status_code == 200, response.text
            return chunks, response.json()

    chunks, later = asyncio.run(run())
    expected_first = own_generation(module, first_prompt, 10)
    _same(chunks, expected_first)
    expected = own_generation(module, second_prompt, 3, (expected_first[-1]["h"], expected_first[-1]["c"]))
    got = _chunk(later)
    assert np.array_equal(got["next_token"], np.stack([e["next_token"] for e in expected], axis=1))
    assert np.array_equal(got["h"], expected[-1]["h"])


def test_tritonclient_sequence_over_grpc(decoder_server: RunningServer, torch_repository: Path) -> None:
    module = own_decoder(torch_repository, "decoder-chat")
    client = triton_grpc.InferenceServerClient(decoder_server.grpc_address)
    prompts = [np.array([[4]], dtype=np.int64), np.array([[9]], dtype=np.int64)]
    try:
        answers = [
            client.infer(
                "decoder-chat",
                _triton_tokens(prompt),
                sequence_id=4242,
                sequence_start=index == 0,
                sequence_end=index == 1,
                parameters={"max_tokens": 2},
            )
            for index, prompt in enumerate(prompts)
        ]
    finally:
        client.close()
    first = own_generation(module, prompts[0], 2)
    second = own_generation(module, prompts[1], 2, (first[-1]["h"], first[-1]["c"]))
    for answer, expected in zip(answers, (first, second), strict=True):
        assert np.array_equal(
            answer.as_numpy("next_token"), np.stack([e["next_token"] for e in expected], axis=1)
        )
        assert np.array_equal(answer.as_numpy("c"), expected[-1]["c"])


# ---------------------------------------------------------------------- settings checked at load


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("extra", "changes", "message"),
    [
        ({"max_steps": None}, {}, "needs parameters.extra.max_steps"),
        ({"feedback": {"token": "next_token"}}, {}, "feedback names input 'token'"),
        ({"feedback": {"tokens": "logits"}}, {}, "they must have the same datatype"),
        ({"feedback": {"tokens": "next"}}, {}, "maps 'tokens' to 'next', which is not a declared output"),
        ({"feedback": {"h0": "h"}}, {}, "in both feedback and sequence_state"),
        ({"stop": {"output": "token", "values": [0]}}, {}, "stop watches output 'token'"),
        ({"stop": {"output": "next_token", "values": []}}, {}, "stop.values"),
        ({}, {"continuous_batching": False, "sequence_batching": False}, "settings set neither"),
        (
            {"sequence_state": {}},
            {"continuous_batching": False},
            'is used with "continuous_batching": true only',
        ),
    ],
)
async def test_bad_continuous_settings_fail_the_load(
    inprocess: InProcess, torch_repository: Path, extra: dict[str, Any], changes: dict[str, Any], message: str
) -> None:
    settings = _with_extra(_settings(torch_repository, "decoder-stream", name="bad", **changes), **extra)
    await inprocess.load(settings)
    entry = inprocess.registry.find("bad", None)
    assert entry.reason is not None and message in entry.reason, entry.reason


class _Shrink(nn.Module):
    """Returns one column fewer than it takes: its output cannot be fed back as its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 1:] * 2


@pytest.mark.anyio
async def test_an_output_the_program_cannot_take_back_ends_the_stream_with_a_reason(
    inprocess: InProcess, tmp_path: Path
) -> None:
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(_Shrink(), (torch.ones(2, 4),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(tmp_path / "shrink.pt2"))
    settings = ModelSettings.model_validate(
        {
            "name": "shrink",
            "implementation": "runtime.torch.TorchModel",
            "continuous_batching": True,
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, -1]}],
            "parameters": {
                "uri": str(tmp_path / "shrink.pt2"),
                "extra": {"feedback": {"x": "y"}, "max_steps": 3},
            },
        }
    )
    await inprocess.load(settings)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    async with inprocess.client() as client:
        async with aconnect_sse(client, "POST", "/v2/models/shrink/infer_stream", json=body) as source:
            events = [event async for event in source.aiter_sse()]
    assert [event.event for event in events] == ["message", "error"]
    assert json.loads(events[0].data)["outputs"][0]["data"] == [4.0, 6.0, 8.0]
    error = json.loads(events[1].data)["error"]
    assert "cannot feed input 'x'" in error and "dimension 1 is fixed at 4" in error, error
