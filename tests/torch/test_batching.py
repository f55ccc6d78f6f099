"""The PyTorch runtime under adaptive batching and sequence batching, one runtime for both.

Adaptive: concurrent callers share one forward call (``batch_size`` > 1) and each gets exactly
its own rows. Sequences (``TorchModel`` with ``sequence_state``): the LSTM's hidden state is the sequence's
state; several sequences sent chunk by chunk, sharing batches, give what one forward pass over
each whole sequence gives.

Comparisons: the LSTM's outputs must be bit-identical (``np.array_equal``) to its own forward
pass, whatever the batch: on CPU float32 its results for a row do not depend on the other rows
here. The MLP's do, by a few ulps (the matrix product's kernel and reduction order depend on
the number of rows), so its rows are compared with a tight tolerance (rtol 1e-6, atol 1e-7).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from runtime.sequences import SequenceStep
from runtime.settings import ModelSettings
from runtime.torch import TorchModel
from runtime.types import InferenceRequest, InferenceResponse, MetadataTensor, RequestInput
from tests.conftest import InProcess
from tests.servers import RunningServer, start_server
from tests.torch_helpers import build_repository, inputs_for, own_forward, own_module, settings_of

LSTM = "lstm-torchscript"
MLP = "mlp-export"
STEPS = 12


@pytest.fixture(scope="session")
def torch_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.getbasetemp())


def _batched(root: Path, folder: str, name: str, **changes: Any) -> ModelSettings:
    """A model of the examples with other settings (its artefact found by absolute path)."""
    settings = settings_of(root, folder)
    assert settings.parameters is not None and settings.parameters.uri is not None
    settings.parameters.uri = str(root / folder / settings.parameters.uri)
    return settings.model_copy(update={"name": name, **changes})


def _body(inputs: dict[str, np.ndarray], **parameters: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "inputs": [
            {"name": name, "datatype": "FP32", "shape": list(array.shape), "data": array.ravel().tolist()}
            for name, array in inputs.items()
        ]
    }
    if parameters:
        document["parameters"] = parameters
    return document


def _outputs(document: dict[str, Any]) -> dict[str, np.ndarray]:
    return {
        out["name"]: np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        for out in document["outputs"]
    }


def _check_rows(folder: str, got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for name, array in expected.items():
        assert got[name].shape == array.shape, name
        if folder.startswith("lstm"):
            assert np.array_equal(got[name], array), name
        else:
            np.testing.assert_allclose(got[name], array, rtol=1e-6, atol=1e-7, err_msg=name)


# ---------------------------------------------------------------------- adaptive batching


@pytest.mark.anyio
@pytest.mark.parametrize("folder", [MLP, LSTM])
async def test_adaptive_batch_gives_each_caller_its_own_rows(
    inprocess: InProcess, torch_repository: Path, folder: str
) -> None:
    """Four callers with 1, 2, 3 and 1 rows: the batch leaves when it holds all four."""
    rows = [1, 2, 3, 1]
    settings = _batched(torch_repository, folder, "batched", max_batch_size=len(rows), max_batch_time=30.0)
    await inprocess.load(settings)
    inputs = [inputs_for(folder, count, seed=10 + i) for i, count in enumerate(rows)]
    async with inprocess.client() as client:
        responses = await asyncio.gather(
            *(client.post("/v2/models/batched/infer", json=_body(own)) for own in inputs)
        )
    module = own_module(torch_repository, folder)
    for own, response in zip(inputs, responses, strict=True):
        assert response.status_code == 200, response.text
        document = response.json()
        assert document["parameters"]["batch_size"] == len(rows)
        _check_rows(folder, _outputs(document), own_forward(module, folder, own))
    assert len({r.json()["parameters"]["batch_id"] for r in responses}) == 1


# ---------------------------------------------------------------------- sequence batching, in process


def _sequence_settings(root: Path, name: str = "seq", **changes: Any) -> ModelSettings:
    settings = settings_of(root, "lstm-sequence")
    assert settings.parameters is not None and settings.parameters.uri is not None
    settings.parameters.uri = str(root / "lstm-sequence" / settings.parameters.uri)
    return settings.model_copy(update={"name": name, **changes})


def _whole(module: Any, x: np.ndarray) -> dict[str, np.ndarray]:
    """The LSTM's own forward pass over a whole sequence, from a zero state."""
    zeros = np.zeros((x.shape[0], 1, 16), dtype=np.float32)
    return own_forward(module, "lstm", {"x": x, "h0": zeros, "c0": zeros})


async def _send_sequence(
    client: httpx.AsyncClient, base: str, model: str, key: str, x: np.ndarray, chunks: list[int]
) -> dict[str, np.ndarray]:
    """Send ``x`` chunk by chunk as one sequence; the outputs joined over time, and the last state."""
    ys, start = [], 0
    last: dict[str, np.ndarray] = {}
    for index, size in enumerate(chunks):
        params = {"sequence_id": key, "sequence_start": index == 0, "sequence_end": index == len(chunks) - 1}
        response = await client.post(
            f"{base}/v2/models/{model}/infer", json=_body({"x": x[:, start : start + size]}, **params)
        )
        assert response.status_code == 200, response.text
        last = _outputs(response.json())
        ys.append(last["y"])
        start += size
    assert start == x.shape[1]
    return {"y": np.concatenate(ys, axis=1), "h": last["h"], "c": last["c"]}


# chunkings of STEPS steps: the same ones share forward calls, the others run beside them
CHUNKS = {"a": [3, 3, 3, 3], "b": [3, 3, 3, 3], "c": [3, 3, 3, 3], "d": [4, 4, 4], "e": [1, 5, 3, 3]}
ROWS = {"a": 1, "b": 2, "c": 1, "d": 1, "e": 1}


def _sequences() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {key: rng.standard_normal((ROWS[key], STEPS, 8), dtype=np.float32) for key in CHUNKS}


async def _serve_sequences(
    client: httpx.AsyncClient, base: str, model: str
) -> dict[str, dict[str, np.ndarray]]:
    xs = _sequences()
    served = await asyncio.gather(
        *(_send_sequence(client, base, model, f"s-{key}", xs[key], CHUNKS[key]) for key in CHUNKS)
    )
    return dict(zip(CHUNKS, served, strict=True))


def _check_sequences(root: Path, served: dict[str, dict[str, np.ndarray]]) -> None:
    module = own_module(root, LSTM)
    xs = _sequences()
    for key, got in served.items():
        _check_rows("lstm", got, _whole(module, xs[key]))


@pytest.mark.anyio
async def test_sequences_chunk_by_chunk_equal_one_pass_over_each_sequence(
    inprocess: InProcess, torch_repository: Path
) -> None:
    await inprocess.load(_sequence_settings(torch_repository, max_batch_time=2.0))
    async with inprocess.client() as client:
        served = await _serve_sequences(client, "", "seq")
        stats = (await client.get("/v2/models/seq")).json()["parameters"]["stats"]
    _check_sequences(torch_repository, served)
    assert stats["steps"] == sum(len(chunks) for chunks in CHUNKS.values())
    assert stats["largest_batch"] > 1 and stats["batches"] < stats["steps"]
    assert stats["open_sequences"] == 0 and stats["states_held"] == 0


@pytest.mark.anyio
async def test_sequence_state_rules(inprocess: InProcess, torch_repository: Path) -> None:
    """A client's own state input wins over the kept one; a request outside any sequence starts
    from zeros; a sequence keeps its number of rows; a request without x is refused."""
    await inprocess.load(_sequence_settings(torch_repository))
    module = own_module(torch_repository, LSTM)
    own = inputs_for("lstm", 2, seed=3)
    async with inprocess.client() as client:
        url = "/v2/models/seq/infer"
        seeded = await client.post(url, json=_body(own, sequence_id="seeded", sequence_start=True))
        assert seeded.status_code == 200, seeded.text
        _check_rows("lstm", _outputs(seeded.json()), own_forward(module, "lstm", own))

        alone = await client.post(url, json=_body({"x": own["x"]}))
        assert alone.status_code == 200, alone.text
        _check_rows("lstm", _outputs(alone.json()), _whole(module, own["x"]))

        wrong = await client.post(url, json=_body({"x": own["x"][:1]}, sequence_id="seeded"))
        assert wrong.status_code == 400
        assert "'h0' has 2 row(s) but this request has 1" in wrong.json()["error"]

        missing = await client.post(
            url, json=_body({"h0": own["h0"]}, sequence_id="other", sequence_start=True)
        )
        assert missing.status_code == 400
        assert "['x']" in missing.json()["error"]

        # the failed step kept the previous state: the sequence goes on from the first chunk
        follow = await client.post(url, json=_body({"x": own["x"]}, sequence_id="seeded", sequence_end=True))
        assert follow.status_code == 200, follow.text
        first = _outputs(seeded.json())
        expected = own_forward(module, "lstm", {"x": own["x"], "h0": first["h"], "c0": first["c"]})
        _check_rows("lstm", _outputs(follow.json()), expected)


def _with(settings: ModelSettings, **extra: Any) -> ModelSettings:
    assert settings.parameters is not None
    parameters = settings.parameters.model_copy(update={"extra": {**settings.parameters.extra, **extra}})
    return settings.model_copy(update={"parameters": parameters})


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sequence_state": {}}, "needs parameters.extra.sequence_state"),
        ({"sequence_state": {"h1": "h", "c0": "c"}}, "names input 'h1'"),
        ({"sequence_state": {"h0": "hidden", "c0": "c"}}, "maps 'h0' to 'hidden'"),
        ({"sequence_state": {"x": "y", "h0": "h", "c0": "c"}}, "'x' must be declared"),
    ],
)
async def test_bad_sequence_settings_fail_the_load(
    inprocess: InProcess, torch_repository: Path, change: dict[str, Any], message: str
) -> None:
    await inprocess.load(_with(_sequence_settings(torch_repository), **change))
    async with inprocess.client() as client:
        ready = await client.get("/v2/models/seq/ready")
    assert ready.status_code == 503
    assert message in ready.text, ready.text


@pytest.mark.anyio
async def test_state_needs_fixed_dimensions_and_a_strategy_that_keeps_it(
    inprocess: InProcess, torch_repository: Path
) -> None:
    loose = _sequence_settings(torch_repository, name="loose")
    loose.inputs[1] = MetadataTensor.model_validate(
        {"name": "h0", "datatype": "FP32", "shape": [-1, -1, 16], "parameters": {"optional": True}}
    )
    plain = _sequence_settings(torch_repository, name="plain", sequence_batching=False)
    await inprocess.load(loose, plain)
    async with inprocess.client() as client:
        for name, message in (
            ("loose", "fixed dimensions after it"),
            ("plain", "this model's settings set neither"),
        ):
            ready = await client.get(f"/v2/models/{name}/ready")
            assert ready.status_code == 503 and message in ready.text, ready.text


# ---------------------------------------------------------------------- one real server, both strategies


@pytest.fixture(scope="module")
def batching_server(
    torch_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("torch-batching")
    models = {
        "lstm-batched": _batched(
            torch_repository, LSTM, "lstm-batched", max_batch_size=3, max_batch_time=30.0
        ),
        "lstm-sequence": _sequence_settings(torch_repository, name="lstm-sequence", max_batch_time=2.0),
    }
    for name, settings in models.items():
        (root / name).mkdir()
        document = settings.model_dump(mode="json", exclude_none=True, exclude={"folder"})
        (root / name / "model-settings.json").write_text(json.dumps(document))
    server = start_server(root)
    yield server
    assert server.stop() == 0


def test_real_server_adaptive_batch(batching_server: RunningServer, torch_repository: Path) -> None:
    rows = [2, 1, 3]
    inputs = [inputs_for(LSTM, count, seed=20 + i) for i, count in enumerate(rows)]

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=batching_server.http_url, timeout=60) as client:
            return await asyncio.gather(
                *(client.post("/v2/models/lstm-batched/infer", json=_body(i)) for i in inputs)
            )

    responses = asyncio.run(send())
    module = own_module(torch_repository, LSTM)
    for own, response in zip(inputs, responses, strict=True):
        assert response.status_code == 200, response.text
        assert response.json()["parameters"]["batch_size"] == len(rows)
        _check_rows(LSTM, _outputs(response.json()), own_forward(module, LSTM, own))


def test_real_server_sequences_over_rest(batching_server: RunningServer, torch_repository: Path) -> None:
    async def send() -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        async with httpx.AsyncClient(timeout=60) as client:
            served = await _serve_sequences(client, batching_server.http_url, "lstm-sequence")
            meta = await client.get(f"{batching_server.http_url}/v2/models/lstm-sequence")
            return served, meta.json()["parameters"]["stats"]

    served, stats = asyncio.run(send())
    _check_sequences(torch_repository, served)
    assert stats["largest_batch"] > 1


def test_real_server_sequence_over_grpc(batching_server: RunningServer, torch_repository: Path) -> None:
    x = _sequences()["b"]
    client = triton_grpc.InferenceServerClient(url=batching_server.grpc_address)
    ys, last = [], None
    try:
        for index, start in enumerate(range(0, STEPS, 4)):
            tensor = triton_grpc.InferInput("x", [x.shape[0], 4, 8], "FP32")
            tensor.set_data_from_numpy(np.ascontiguousarray(x[:, start : start + 4]))
            last = client.infer(
                "lstm-sequence",
                [tensor],
                sequence_id=77,
                sequence_start=index == 0,
                sequence_end=start + 4 == STEPS,
            )
            ys.append(last.as_numpy("y"))
    finally:
        client.close()
    assert last is not None
    got = {"y": np.concatenate(ys, axis=1), "h": last.as_numpy("h"), "c": last.as_numpy("c")}
    _check_rows("lstm", got, _whole(own_module(torch_repository, LSTM), x))


@pytest.mark.anyio
async def test_steps_that_agree_after_the_batch_dimension_share_one_forward_call(
    inprocess: InProcess, torch_repository: Path
) -> None:
    await inprocess.load(_sequence_settings(torch_repository))
    model = inprocess.registry.get("seq").model
    assert isinstance(model, TorchModel)
    calls: list[int] = []  # rows of each forward call
    infer = model.runner.infer

    async def counting(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, str]]:
        calls.append(arrays["x"].shape[0])
        return await infer(arrays)

    model.runner.infer = counting  # type: ignore[method-assign]
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal(shape, dtype=np.float32) for shape in ((1, 3, 8), (2, 3, 8), (1, 4, 8))]

    def request(x: np.ndarray) -> InferenceRequest:
        return InferenceRequest(inputs=[RequestInput(name="x", shape=list(x.shape), datatype="FP32", data=x)])

    steps = [SequenceStep(request(x), f"k{i}", True, False, None) for i, x in enumerate(xs)]
    results = await model.predict_sequences(steps)
    assert sorted(calls) == [1, 3]  # (1, 3, 8) and (2, 3, 8) in one call, (1, 4, 8) alone
    module = own_module(torch_repository, LSTM)
    for x, step, result in zip(xs, steps, results, strict=True):
        assert isinstance(result, InferenceResponse)
        expected = _whole(module, x)
        _check_rows("lstm", {out.name: np.asarray(out.data) for out in result.outputs}, expected)
        assert np.array_equal(step.state["h0"], expected["h"]) and np.array_equal(
            step.state["c0"], expected["c"]
        )
