"""Models in worker processes behind a real server: REST, sequences, faults, scaling, streams."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import httpx
import pytest

from runtime.settings import ModelSettings
from tests.sequencing import until
from tests.servers import clients, executor, serving, start_server

pytestmark = pytest.mark.anyio


def model(cls: str, name: str, workers: int | None = 2, **settings: Any) -> ModelSettings:
    return ModelSettings(name=name, implementation=f"tests.worker_models.{cls}", workers=workers, **settings)


def body(x: int = 1, **params: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [x]}]}
    if params:
        document["parameters"] = params
    return document


def pid(answer: httpx.Response) -> int:
    assert answer.status_code == 200, answer.text
    return int(next(o for o in answer.json()["outputs"] if o["name"] == "pid")["data"][0])


def total(answer: httpx.Response) -> int:
    assert answer.status_code == 200, answer.text
    return int(next(o for o in answer.json()["outputs"] if o["name"] == "sum")["data"][0])


async def test_two_workers_answer_from_their_own_pids() -> None:
    async with serving(model("Echo", "echo"), model("Echo", "local", workers=0)) as server:
        async with clients(server) as (oip, admin):
            described = (await admin.get("/models/echo")).json()[0]
            pids = {w["pid"] for w in described["workers"]}
            assert len(pids) == 2 and os.getpid() not in pids
            assert described["parallelType"] == "workers" and described["minWorkers"] == 2
            assert all(w["status"] == "READY" and w["memoryUsage"] > 0 for w in described["workers"])
            answers = await asyncio.gather(
                *(oip.post("/v2/models/echo/infer", json=body(i, sleep=0.2)) for i in range(6))
            )
            assert {pid(a) for a in answers} == pids
            assert pid(await oip.post("/v2/models/local/infer", json=body())) == os.getpid()
            assert (await oip.get("/v2/models/echo/ready")).status_code == 200


async def test_parallel_workers_is_the_default_for_every_model() -> None:
    async with serving(model("Echo", "echo", workers=None), parallel_workers=1) as server:
        assert len(executor(server, "echo").describe()) == 1


async def test_a_model_whose_workers_do_not_load_in_time_fails_alone() -> None:
    stuck = model("BlockingLoad", "stuck", workers=1, worker_start_timeout=1)
    async with serving(stuck, model("Echo", "echo", workers=1)) as server:
        async with clients(server) as (oip, admin):
            index = (await oip.post("/v2/repository/index", json={})).json()
            (entry,) = [e for e in index if e["name"] == "stuck"]
            assert entry["state"] == "UNAVAILABLE"
            assert "'stuck'" in entry["reason"] and "worker 1" in entry["reason"]
            assert "worker_start_timeout (1s)" in entry["reason"]
            assert (await oip.get("/v2/models/stuck/ready")).status_code != 200
            assert (await oip.get("/v2/models/echo/ready")).status_code == 200
            assert pid(await oip.post("/v2/models/echo/infer", json=body())) != os.getpid()
            # scaling a model up with workers that do not load in time fails the same way
            echo = executor(server, "echo")
            echo.pool.settings.worker_start_timeout = 0.001
            scaled = await admin.put("/models/echo?min_worker=2&synchronous=true")
            assert scaled.status_code >= 400 and "worker_start_timeout" in scaled.text, scaled.text
            assert pid(await oip.post("/v2/models/echo/infer", json=body())) != os.getpid()


async def test_64_sequences_on_2_workers_keep_their_sums_and_their_worker() -> None:
    settings = model("RunningSum", "sum", sequence_batching=True, max_batch_size=8, max_batch_time=0.002)
    async with serving(settings) as server:
        async with clients(server) as (oip, _):

            async def sequence(i: int) -> set[int]:
                seen = set()
                start = await oip.post(
                    "/v2/models/sum/infer", json=body(i, sequence_id=f"s{i}", sequence_start=True)
                )
                seen.add(pid(start))
                expected = i
                for x in range(1, 6):
                    expected += x
                    answer = await oip.post(
                        "/v2/models/sum/infer", json=body(x, sequence_id=f"s{i}", sequence_end=x == 5)
                    )
                    assert total(answer) == expected
                    seen.add(pid(answer))
                return seen

            pids = await asyncio.gather(*(sequence(i) for i in range(64)))
            assert all(len(p) == 1 for p in pids)
            assert len(set().union(*pids)) == 2
            # every sequence ended (the model is told after the END's answer): the workers hold none
            await until(lambda: [w["sequences"] for w in executor(server, "sum").describe()] == [0, 0])


async def test_a_killed_worker_fails_only_its_requests_and_sequences() -> None:
    """The race: requests and sequences in flight on both workers when one is killed with -9."""
    settings = model("RunningSum", "sum", sequence_batching=True, max_batch_size=4, max_batch_time=0.001)
    async with serving(settings, model("Echo", "echo"), model("Echo", "other", workers=1)) as server:
        async with clients(server) as (oip, admin):
            for i in range(8):
                answer = await oip.post(
                    "/v2/models/sum/infer", json=body(1, sequence_id=f"q{i}", sequence_start=True)
                )
                assert total(answer) == 1
            workers = executor(server, "echo")
            victim = workers.pool.workers[0]
            slow = [
                asyncio.ensure_future(oip.post("/v2/models/echo/infer", json=body(i, sleep=1.5)))
                for i in range(6)
            ]
            await until(lambda: victim.busy >= 3)  # the load reached both workers
            os.kill(victim.pid or 0, signal.SIGKILL)
            answers = await asyncio.gather(*slow)
            failed = [a for a in answers if a.status_code != 200]
            assert len(failed) == 3 and all(a.status_code == 503 for a in failed)
            assert "died (killed by SIGKILL)" in failed[0].json()["error"]
            assert all(pid(a) != victim.pid for a in answers if a.status_code == 200)
            # the other models never noticed
            assert (await oip.post("/v2/models/other/infer", json=body())).status_code == 200
            await workers.pool.until_ready(2)
            described = (await admin.get("/models/echo")).json()[0]
            assert len(described["workers"]) == 2 and all(
                w["status"] == "READY" for w in described["workers"]
            )
            assert victim.pid not in {w["pid"] for w in described["workers"]}
            # the metrics show it
            scraped = (await oip.get(f"http://127.0.0.1:{server.metrics_port}/metrics")).text
            assert 'model_worker_restarts_total{model_name="echo",model_version=""} 1.0' in scraped
            assert 'model_workers{model_name="echo",model_version="",status="READY"} 2.0' in scraped
            assert (
                'model_infer_request_rejected_total{model_name="echo",model_version="",reason="worker_lost"} 3.0'
                in scraped
            )
            # the sequence model's workers are separate processes: kill one, its sequences are lost
            sums = executor(server, "sum")
            lost_worker = sums.pool.workers[0]
            lost = set(lost_worker.sequences)
            os.kill(lost_worker.pid or 0, signal.SIGKILL)
            await sums.pool.until_ready(2)
            await until(lambda: all(w.pid != lost_worker.pid for w in sums.pool.workers))
            for i in range(8):
                answer = await oip.post("/v2/models/sum/infer", json=body(1, sequence_id=f"q{i}"))
                if f"q{i}" in lost:
                    assert answer.status_code == 400
                    assert "worker_lost" in answer.json()["error"], answer.text
                else:
                    assert total(answer) == 2
            fresh = await oip.post(
                "/v2/models/sum/infer", json=body(5, sequence_id=next(iter(lost)), sequence_start=True)
            )
            assert total(fresh) == 5


async def test_scale_1_3_1_under_load_loses_nothing() -> None:
    async with serving(model("Echo", "echo", workers=1)) as server:
        async with clients(server) as (oip, admin):
            stop = asyncio.Event()
            statuses: list[int] = []
            pids: list[int] = []

            async def load() -> None:
                while not stop.is_set():
                    answer = await oip.post("/v2/models/echo/infer", json=body(1, sleep=0.01))
                    statuses.append(answer.status_code)
                    if answer.status_code == 200:
                        pids.append(pid(answer))

            clients_ = [asyncio.ensure_future(load()) for _ in range(6)]
            up = await admin.put("/models/echo", params={"min_worker": 3, "synchronous": "true"})
            assert up.status_code == 200 and up.json()["status"] == "Workers scaled to 3 for model: echo"
            assert len((await admin.get("/models/echo")).json()[0]["workers"]) == 3
            seen = len(pids)
            await until(lambda: len(set(pids[seen:])) == 3)
            down = await admin.put("/models/echo", params={"min_worker": 1, "synchronous": "true"})
            assert down.status_code == 200
            stop.set()
            await asyncio.gather(*clients_)
            assert statuses and set(statuses) == {200}
            workers = (await admin.get("/models/echo")).json()[0]["workers"]
            assert [w["status"] for w in workers] == ["READY"]


async def test_a_streaming_model_streams_through_a_worker() -> None:
    async with serving(model("Counter", "count", workers=1)) as server:
        async with clients(server) as (oip, _):
            async with oip.stream("POST", "/v2/models/count/infer_stream", json=body(1, count=4)) as answer:
                assert answer.status_code == 200
                events = [
                    json.loads(line[5:]) async for line in answer.aiter_lines() if line.startswith("data:")
                ]
            assert len(events) == 4
            pids = {next(o for o in e["outputs"] if o["name"] == "pid")["data"][0] for e in events}
            assert pids == {executor(server, "count").describe()[0]["pid"]}


def test_sigterm_drains_the_workers(tmp_path: Any) -> None:
    folder = tmp_path / "slow"
    folder.mkdir()
    unloaded = tmp_path / "unloaded"
    (folder / "model-settings.json").write_text(
        '{"name": "slow", "implementation": "tests.worker_models.SlowUnload", "workers": 2, '
        f'"parameters": {{"extra": {{"unloaded": "{unloaded}"}}}}}}'
    )
    server = start_server(tmp_path)
    try:
        with httpx.Client(base_url=server.http_url, timeout=30) as client:
            assert client.post("/v2/models/slow/infer", json=body()).status_code == 200
    finally:
        assert server.stop() == 0
    pids = [int(line) for line in unloaded.read_text().split()]
    assert len(pids) == 2
    for gone in pids:  # unloaded, then exited
        with pytest.raises(ProcessLookupError):
            os.kill(gone, 0)


async def test_register_with_workers_then_move_in_and_out_of_the_server_process(tmp_path: Any) -> None:
    folder = tmp_path / "echo"
    folder.mkdir()
    (folder / "model-settings.json").write_text(
        '{"name": "echo", "implementation": "tests.worker_models.Echo"}'
    )
    async with serving(model_repository_root=str(tmp_path), load_models_at_startup=False) as server:
        async with clients(server) as (oip, admin):
            answer = await admin.post(
                "/models", params={"url": "echo", "initial_workers": 2, "synchronous": "true"}
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == 'Model "echo" Version: None registered with 2 initial workers'
            described = (await admin.get("/models/echo")).json()[0]
            assert described["parallelType"] == "workers" and len(described["workers"]) == 2
            assert pid(await oip.post("/v2/models/echo/infer", json=body())) != os.getpid()
            inside = await admin.put("/models/echo", params={"min_worker": 0, "synchronous": "true"})
            assert inside.status_code == 200, inside.text
            assert (await admin.get("/models/echo")).json()[0]["parallelType"] == "in_process"
            assert pid(await oip.post("/v2/models/echo/infer", json=body())) == os.getpid()
            out = await admin.put("/models/echo", params={"min_worker": 1, "synchronous": "true"})
            assert out.status_code == 200
            assert len((await admin.get("/models/echo")).json()[0]["workers"]) == 1
            # unregistering drains: a request in flight is answered
            slow = asyncio.ensure_future(oip.post("/v2/models/echo/infer", json=body(1, sleep=0.5)))
            await until(lambda: executor(server, "echo").pool.workers[0].busy == 1)
            assert (await admin.delete("/models/echo")).status_code == 200
            assert (await slow).status_code == 200


def _gone(pid: int) -> bool:
    """Whether a process has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except FileNotFoundError:
        return True


def test_workers_die_with_a_killed_server(tmp_path: Any) -> None:
    folder = tmp_path / "echo"
    folder.mkdir()
    (folder / "model-settings.json").write_text(
        '{"name": "echo", "implementation": "tests.worker_models.Burner", "workers": 2}'
    )
    key_file = tmp_path / "key.json"
    server = start_server(tmp_path, "--management-key-file", str(key_file))
    try:
        key = json.loads(key_file.read_text())["management"]["key"]
        described = httpx.get(
            f"http://{server.endpoints['management']}/models/echo", headers={"Authorization": f"Bearer {key}"}
        ).json()[0]
        pids = [w["pid"] for w in described["workers"]]
        assert len(pids) == 2
        with httpx.Client(base_url=server.http_url, timeout=30) as client:  # one worker busy in a thread
            client.post("/v2/models/echo/infer", json=body(1, sleep=0.01))
    finally:
        server.stop(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids)
