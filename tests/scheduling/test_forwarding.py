"""The scheduler of a model whose batcher runs inside each of its workers
(``runtime.scheduling.forwarding``), behind a real server: whole requests and streams forwarded to
the workers, their executions counted across them, and the server's table of which worker holds
which sequence kept exact (sequences ended inside a worker, a START a worker refused)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.settings import ModelSettings
from tests.sequencing import until
from tests.servers import clients, executor, serving

pytestmark = pytest.mark.anyio


def sequence_ticker(**settings: Any) -> ModelSettings:
    """A continuous-batching sequence model (each request one step) in worker processes."""
    return ModelSettings(
        name="seqs",
        implementation="tests.continuous_models.SequenceTicker",
        continuous_batching=True,
        sequence_batching=True,
        max_batch_size=8,
        **settings,
    )


def ticker_step(key: str, **control: Any) -> dict[str, Any]:
    """One step of sequence ``key`` of ``sequence_ticker``."""
    return {"inputs": [], "parameters": {"length": 1, "sequence_id": key, **control}}


async def test_a_continuous_batching_model_runs_in_workers() -> None:
    settings = ModelSettings(
        name="ticker",
        implementation="tests.continuous_models.Ticker",
        continuous_batching=True,
        max_batch_size=4,
        workers=2,
    )
    async with serving(settings) as server:
        async with clients(server) as (oip, admin):
            answers = await asyncio.gather(
                *(
                    oip.post("/v2/models/ticker/infer", json={"inputs": [], "parameters": {"length": 3}})
                    for _ in range(4)
                )
            )
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            async with oip.stream(
                "POST", "/v2/models/ticker/infer_stream", json={"inputs": [], "parameters": {"length": 5}}
            ) as answer:
                events = [line async for line in answer.aiter_lines() if line.startswith("data:")]
            assert len(events) == 5
            assert len((await admin.get("/models/ticker")).json()[0]["workers"]) == 2
            # the batcher runs inside each worker: a scrape reads its executions there, so that
            # Triton's inference and execution counts of the model are exact across its workers
            scraped = await oip.get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    samples = {
        (s.name, s.labels.get("model")): s.value
        for family in text_string_to_metric_families(scraped.text)
        for s in family.samples
    }
    assert samples[("nv_inference_count", "ticker")] == 4 * 3 + 5  # every stream, every step
    assert 3 <= samples[("nv_inference_exec_count", "ticker")] <= 4 * 3 + 5  # steps of up to 4 streams


async def test_sequences_that_end_inside_their_worker_leave_the_servers_table() -> None:
    """Under continuous batching the workers' own batchers end sequences (here by idle timeout);
    each worker tells the server, whose table of which worker holds which sequence empties."""
    settings = sequence_ticker(max_sequence_idle_ms=300, workers=2)
    step = ticker_step
    async with serving(settings) as server:
        pool = executor(server, "seqs").pool
        async with clients(server) as (oip, _):
            keys = [f"s{i}" for i in range(8)]
            answers = await asyncio.gather(
                *(oip.post("/v2/models/seqs/infer", json=step(k, sequence_start=True)) for k in keys)
            )
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            assert set(pool.owners) <= set(keys) and len({w.id for w in pool.owners.values()}) == 2
            ended = await oip.post("/v2/models/seqs/infer", json=step("s7", sequence_end=True))
            assert ended.status_code == 200, ended.text
            await until(lambda: not pool.owners, 30)  # the others end by idle timeout in the workers
            assert all(not w.sequences for w in pool.workers)
            # a later request of one hears why it ended, from the worker that held it
            late = await oip.post("/v2/models/seqs/infer", json=step("s0"))
            assert late.status_code == 400 and "idle" in late.json()["error"], late.text
            assert not pool.owners
            # the id can start a new sequence, which the table holds again until it ends
            again = await oip.post("/v2/models/seqs/infer", json=step("s0", sequence_start=True))
            assert again.status_code == 200, again.text
            assert set(pool.owners) == {"s0"}
            await until(lambda: not pool.owners, 30)


async def test_a_start_its_worker_refuses_leaves_no_sequence_behind() -> None:
    """A START beyond ``max_sequences`` is refused by the worker's own batcher (503): the server
    must not go on believing that the worker holds that sequence."""
    settings = sequence_ticker(max_sequences=1, workers=1)
    step = ticker_step
    async with serving(settings) as server:
        pool = executor(server, "seqs").pool
        async with clients(server) as (oip, _):
            first = await oip.post("/v2/models/seqs/infer", json=step("a", sequence_start=True))
            assert first.status_code == 200, first.text
            refused = await oip.post("/v2/models/seqs/infer", json=step("b", sequence_start=True))
            assert refused.status_code == 503 and "error" in refused.json(), refused.text
            assert set(pool.owners) == {"a"}
            stats = (await oip.get("/v2/models/seqs")).json()["parameters"]["sequence_stats"]
            assert stats["open_sequences"] == 1
            ended = await oip.post("/v2/models/seqs/infer", json=step("a", sequence_end=True))
            assert ended.status_code == 200, ended.text
            await until(lambda: not pool.owners, 30)
            stats = (await oip.get("/v2/models/seqs")).json()["parameters"]["sequence_stats"]
            assert stats["open_sequences"] == 0 and stats["ended"]["end"] == 1
