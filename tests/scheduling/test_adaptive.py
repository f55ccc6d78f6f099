"""``runtime.scheduling.adaptive``: who shares a batch, and what each caller gets back."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import numpy as np
import pytest

from runtime.codecs import NumpyCodec
from runtime.model import MLModel
from runtime.scheduling import AdaptiveScheduler, DirectScheduler
from runtime.settings import ModelSettings
from runtime.types import Datatype, InferenceRequest, InferenceResponse, ResponseOutput
from tests.adaptive_helpers import (
    body,
    infer_task,
    model_of,
    output,
    params,
    post,
    row_settings,
    scheduler_of,
)
from tests.conftest import InProcess

pytestmark = pytest.mark.anyio


async def test_concurrent_callers_get_their_own_rows_ids_and_parameters(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=4))
    async with inprocess.client() as client:
        responses = await asyncio.gather(
            *(
                post(client, body([[i, i + 0.5], [-i, -i - 0.5]][: 1 + i % 2], id=f"req-{i}"))
                for i in range(4)
            )
        )
    batch_ids = set()
    for i, response in enumerate(responses):
        doc = response.json()
        assert response.status_code == 200, doc
        assert doc["id"] == f"req-{i}"
        assert doc["model_name"] == "rows"
        y = output(response, "y")
        assert y["data"] == [i, i + 0.5, -i, -i - 0.5][: 2 * (1 + i % 2)]
        assert y["shape"] == [1 + i % 2, 2]
        assert output(response, "n")["data"] == [6] * (1 + i % 2)  # the model saw 6 rows
        parameters = params(response)
        assert parameters["batch_size"] == 4
        assert parameters["model_says"] == "hello"  # the model's own response parameters are kept
        batch_ids.add(parameters["batch_id"])
    assert len(batch_ids) == 1
    assert model_of(inprocess).batch_rows == [6]


async def test_batch_leaves_when_its_oldest_request_has_waited_max_batch_time(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=8, max_batch_time=0.05))
    async with inprocess.client() as client:
        responses = await asyncio.gather(*(post(client, body([[i, i]])) for i in range(3)))
    assert all(r.status_code == 200 for r in responses)
    # never full, yet served: every batch left on its deadline
    assert sum(params(r)["batch_size"] for r in responses) >= 3
    assert sum(model_of(inprocess).batch_rows) == 3


async def test_batch_sizes_never_exceed_max_batch_size(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=4, max_batch_time=0.01, max_concurrent_batches=2))
    rng = random.Random(7)
    counts = [rng.randint(1, 3) for _ in range(40)]
    async with inprocess.client() as client:
        responses = await asyncio.gather(
            *(post(client, body([[i, i]] * count, id=str(i))) for i, count in enumerate(counts))
        )
    by_batch: dict[int, int] = {}
    for i, (response, count) in enumerate(zip(responses, counts, strict=True)):
        assert response.status_code == 200, response.text
        assert output(response, "y")["data"] == [i, i] * count
        parameters = params(response)
        assert 1 <= parameters["batch_size"] <= 4
        by_batch[parameters["batch_id"]] = by_batch.get(parameters["batch_id"], 0) + 1
    model = model_of(inprocess)
    assert len(model.batches) == len(by_batch)
    assert max(by_batch.values()) <= 4
    assert sum(model.batch_rows) == sum(counts)
    # the reported batch_size is the number of requests that batch held
    for response in responses:
        assert params(response)["batch_size"] == by_batch[params(response)["batch_id"]]


async def test_mixed_shapes_and_datatypes_go_to_different_batches(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=3))  # every group fills: no timing involved
    docs = (
        [body([[i, i, i]], id=f"wide-{i}") for i in range(3)]
        + [body([[i, i]], id=f"narrow-{i}") for i in range(3)]
        + [body([[i, i]], id=f"int-{i}", datatype="INT32") for i in range(3)]
        + [
            body([["a", "b"]], id="bytes-0", datatype="BYTES"),
            body([["c", "d"], ["e", "f"]], id="bytes-1", datatype="BYTES"),
            body([["", "é"]], id="bytes-2", datatype="BYTES"),
        ]
    )
    async with inprocess.client() as client:
        responses = await asyncio.gather(*(post(client, doc) for doc in docs))
    batches: dict[str, set[int]] = {}
    for doc, response in zip(docs, responses, strict=True):
        kind = doc["id"].split("-")[0]
        batches.setdefault(kind, set()).add(params(response)["batch_id"])
        assert output(response, "y")["data"] == [v for row in doc["inputs"][0]["data"] for v in row]
        assert output(response, "y")["datatype"] == doc["inputs"][0]["datatype"]
    # each kind shares one batch, and no two kinds share one
    assert all(len(ids) == 1 for ids in batches.values())
    assert len(set.union(*batches.values())) == 4
    assert all(params(response)["batch_size"] == 3 for response in responses)  # BYTES rows merge too
    assert sorted(model_of(inprocess).batch_rows) == [3, 3, 3, 4]


async def test_an_incompatible_request_does_not_hold_back_a_full_batch(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=3, max_batch_time=30.0))
    odd = infer_task(inprocess.dataplane, body([[1.0, 2.0, 3.0, 4.0]]))
    async with inprocess.client() as client:
        responses = await asyncio.gather(*(post(client, body([[i, i]])) for i in range(3)))
    assert [params(r)["batch_size"] for r in responses] == [3, 3, 3]
    assert not odd.done()  # still forming its own batch, and it did not block the full one
    async with asyncio.timeout(10):  # its batch would wait 30 s to fill: the unload sends it now
        await inprocess.registry.unload("rows")
    alone = await odd
    assert alone.parameters is not None and alone.parameters.model_extra == {
        "model_says": "hello",
        "batch_id": 2,
        "batch_size": 1,
    }


async def test_requested_outputs_and_binary_form_stay_with_each_caller(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=3))
    docs = [
        body([[1, 1]], id="binary", parameters={"binary_data_output": True}),
        body([[2, 2]], id="only-y", outputs=[{"name": "y"}]),
        body([[3, 3]], id="all"),
    ]
    async with inprocess.client() as client:
        binary, only_y, everything = await asyncio.gather(*(post(client, doc) for doc in docs))
    assert only_y.json()["id"] == "only-y"
    assert [o["name"] for o in only_y.json()["outputs"]] == ["y"]
    assert output(only_y, "y")["data"] == [2, 2]
    assert [o["name"] for o in everything.json()["outputs"]] == ["y", "n"]
    assert output(everything, "y")["data"] == [3, 3]
    # the binary caller gets its rows as raw bytes, the others JSON, all from one batch
    header_length = int(binary.headers["inference-header-content-length"])
    raw = binary.content[header_length:]
    assert np.frombuffer(raw[:8], dtype="<f4").tolist() == [1.0, 1.0]
    assert {params(only_y)["batch_id"], params(everything)["batch_id"]} == {
        params_of_binary(binary.content[:header_length])
    }
    assert params(everything)["batch_size"] == 3


def params_of_binary(header: bytes) -> int:
    import orjson

    batch_id: int = orjson.loads(header)["parameters"]["batch_id"]
    return batch_id


async def test_requests_with_different_model_parameters_are_not_merged(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=2))
    docs = [
        body([[1, 1]], parameters={"scale": 1, "timeout": 10_000_000}),
        body([[2, 2]], parameters={"scale": 2}),
        body([[3, 3]], parameters={"scale": 1}),
        body([[4, 4]], parameters={"scale": 2, "binary_data_output": False}),
    ]
    async with inprocess.client() as client:
        responses = await asyncio.gather(*(post(client, doc) for doc in docs))
    ids = [params(r)["batch_id"] for r in responses]
    assert ids[0] == ids[2] and ids[1] == ids[3] and ids[0] != ids[1]
    # the model sees the parameters its callers share, and none meant for the queue or transport
    seen = [
        batch.parameters.model_dump(exclude_none=True)
        for batch in model_of(inprocess).batches
        if batch.parameters
    ]
    assert sorted(seen, key=str) == [{"scale": 1}, {"scale": 2}]


async def test_requests_whose_inputs_disagree_on_rows_are_served_alone(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=2, max_batch_time=30.0))
    doc = body([[1, 2]])
    doc["inputs"].append({"name": "z", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]})
    async with inprocess.client() as client:
        response = await post(client, doc)
    assert params(response)["batch_size"] == 1
    assert model_of(inprocess).batches[0].inputs[1].shape == [3]


async def test_stopping_serves_what_is_queued_and_refuses_new_requests(inprocess: InProcess) -> None:
    await inprocess.load(row_settings(max_batch_size=4, max_batch_time=30.0))
    scheduler = scheduler_of(inprocess)
    callers = [infer_task(inprocess.dataplane, body([[i, i]])) for i in range(2)]
    await asyncio.sleep(0)
    assert scheduler.queued == 2
    await scheduler.stop()
    responses = await asyncio.gather(*callers)
    assert [(r.parameters.model_extra or {})["batch_size"] for r in responses if r.parameters] == [2, 2]
    with pytest.raises(Exception, match="unloading"):
        await scheduler.infer(InferenceRequest.model_validate(body([[1, 1]])))


async def test_model_metadata_shows_every_batching_setting(inprocess: InProcess) -> None:
    await inprocess.load(
        row_settings(max_batch_size=8, max_batch_time=0.02, max_queue_size=50, queue_timeout=1.5),
        ModelSettings(name="plain", implementation=MLModel, max_batch_size=8),
    )
    async with inprocess.client() as client:
        adaptive = (await client.get("/v2/models/rows")).json()["parameters"]
        plain = (await client.get("/v2/models/plain")).json()["parameters"]
    assert adaptive == {
        "scheduler": "adaptive",
        "max_batch_size": 8,
        "max_batch_time": 0.02,
        "max_concurrent_batches": 1,
        "max_queue_size": 50,
        "queue_timeout": 1.5,
    }
    assert plain == {"scheduler": "direct"}  # max_batch_time 0: batching is off, as in MLServer
    assert isinstance(inprocess.registry.get("plain").scheduler, DirectScheduler)
    assert isinstance(inprocess.registry.get("rows").scheduler, AdaptiveScheduler)


class Doubler(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("y", x * 2)])


async def test_unary_requests_on_a_stream_are_batched(inprocess: InProcess) -> None:
    await inprocess.load(
        ModelSettings(name="double", implementation=Doubler, max_batch_size=4, max_batch_time=0.01)
    )

    async def requests() -> AsyncIterator[InferenceRequest]:
        for i in range(3):
            yield InferenceRequest.model_validate(body([[i, i]], id=str(i)))

    seen = [r async for r in inprocess.dataplane.infer_stream(requests(), "double")]
    assert [r.id for r in seen] == ["0", "1", "2"]
    assert [r.outputs[0].data.reshape(-1).tolist() for r in seen] == [[0, 0], [2, 2], [4, 4]]
    assert all(r.parameters is not None and (r.parameters.model_extra or {})["batch_size"] == 1 for r in seen)


class ListModel(MLModel):
    """Returns its outputs as flat Python lists, as many hand-written models do."""

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = payload.inputs[0].data
        return InferenceResponse(
            model_name=self.name,
            outputs=[
                ResponseOutput(
                    name="sum", shape=[x.shape[0], 1], datatype=Datatype.FP64, data=x.sum(axis=1).tolist()
                ),
                ResponseOutput(
                    name="label",
                    shape=[x.shape[0]],
                    datatype=Datatype.BYTES,
                    data=[f"row{v[0]:g}" for v in x],
                ),
            ],
        )


async def test_outputs_given_as_lists_are_split_by_rows(inprocess: InProcess) -> None:
    await inprocess.load(
        ModelSettings(name="lists", implementation=ListModel, max_batch_size=3, max_batch_time=30)
    )
    async with inprocess.client() as client:
        responses = await asyncio.gather(
            *(post(client, body([[i, 1.0]] * (i + 1)), name="lists") for i in range(3))
        )
    for i, response in enumerate(responses):
        assert params(response)["batch_size"] == 3
        assert output(response, "sum") == {
            "name": "sum",
            "datatype": "FP64",
            "shape": [i + 1, 1],
            "data": [i + 1.0] * (i + 1),
        }
        assert output(response, "label")["data"] == [f"row{i}"] * (i + 1)
