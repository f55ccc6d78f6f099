"""Sequences survive the loss of a replica, with real processes: redis-server, two server replicas
sharing it (``MLSERVER_MODEL_SEQUENCE_STORE``), and a proxy hashing on ``ts_request_sequence_id``:
HAProxy and nginx, each with its shipped config (deploy/haproxy, deploy/nginx).

64 counter sequences of 20 numbered steps each (``sequence_step``) run through the proxy while one
replica is killed with SIGKILL and later started again; the client retries a step whose answer did
not come (a dropped connection, 502/503/504), honouring ``Retry-After``. Every answer's history
shows the inputs applied so far, so a step applied twice (or lost) would show; every sequence
must finish with the right running sum. A drain test checks the hand-over on SIGTERM.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from tests.conftest import TEST_MODELS
from tests.external import free_port, haproxy, nginx, redis_server
from tests.servers import ROOT, RunningServer, start_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FOLDER = TEST_MODELS / "replicas"
SEQUENCES = 64
STEPS = 20
RETRYABLE = {502, 503, 504}


@pytest.fixture
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def replica(redis_url: str, port: int, *args: str, lease_ms: int = 1000) -> RunningServer:
    env = {"MLSERVER_MODEL_SEQUENCE_STORE": redis_url, "MLSERVER_MODEL_SEQUENCE_LEASE_MS": str(lease_ms)}
    return start_server(FOLDER, "--http-port", str(port), *args, env=env)


def body(x: int, step: int) -> dict[str, Any]:
    parameters: dict[str, Any] = {"sequence_step": step}
    if step == 1:
        parameters["sequence_start"] = True
    if step == STEPS:
        parameters["sequence_end"] = True
    return {
        "inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [x]}],
        "parameters": parameters,
    }


class Run:
    """The client side: counts applied steps, retries, and which replicas answered."""

    def __init__(self) -> None:
        self.done = 0
        self.retried = 0
        self.replicas: set[str] = set()
        self.milestones: dict[int, asyncio.Event] = {}

    def at(self, steps: int) -> asyncio.Event:
        return self.milestones.setdefault(steps, asyncio.Event())

    def step_done(self) -> None:
        self.done += 1
        for steps, event in self.milestones.items():
            if self.done >= steps:
                event.set()


async def counter(client: httpx.AsyncClient, run: Run, index: int) -> int:
    """One sequence of STEPS steps, x = step number; returns its final sum."""
    sid = f"counter-{index}"
    final = -1
    for number in range(1, STEPS + 1):
        for attempt in range(400):
            try:
                answer = await client.post(
                    "/v2/models/counter/infer",
                    json=body(number, number),
                    headers={"ts_request_sequence_id": sid, "sequence_step": str(number)},
                )
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.status_code not in RETRYABLE:
                break
            run.retried += 1
            wait = float(answer.headers.get("retry-after", "0.05")) if answer is not None else 0.05
            await asyncio.sleep(min(wait, 0.1) * (1 + attempt % 3))
        else:
            raise AssertionError(f"{sid} step {number} never got an answer")
        assert answer.status_code == 200, (sid, number, answer.text)
        outputs = answer.json()["outputs"]
        expected = list(range(1, number + 1))
        assert [int(v) for v in outputs[1]["data"]] == expected, (sid, number, "applied other than once")
        final = int(outputs[0]["data"][0])
        assert final == sum(expected)
        run.replicas.add(answer.headers["sequence_replica"])
        run.step_done()
    return final


@pytest.mark.parametrize("proxy_kind", ["haproxy", "nginx"])
async def test_sequences_survive_a_replica_killed_and_restarted(
    redis_url: str, proxy_kind: str, record_property: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    front = {"haproxy": haproxy, "nginx": nginx}[proxy_kind]
    ports = {"a": free_port(), "b": free_port()}
    servers = {name: replica(redis_url, port) for name, port in ports.items()}
    try:
        with front([f"127.0.0.1:{port}" for port in ports.values()]) as proxy:
            run = Run()
            killed, back = run.at(SEQUENCES * STEPS // 4), run.at(SEQUENCES * STEPS // 2)

            async def chaos() -> None:
                await killed.wait()
                servers["a"].process.send_signal(signal.SIGKILL)
                servers["a"].stop()
                await back.wait()
                servers["a"] = await asyncio.to_thread(replica, redis_url, ports["a"])

            limits = httpx.Limits(max_connections=SEQUENCES, max_keepalive_connections=SEQUENCES)
            async with httpx.AsyncClient(base_url=proxy.url, limits=limits, timeout=30) as client:
                trouble = asyncio.create_task(chaos())
                sums = await asyncio.gather(*(counter(client, run, i) for i in range(SEQUENCES)))
                await trouble
                assert sums == [STEPS * (STEPS + 1) // 2] * SEQUENCES
                assert run.done == SEQUENCES * STEPS
                # the restarted replica rejoins: new sequences reach it once the proxy takes it back
                # (nginx waits out fail_timeout first, which may outlast the run above)
                extra, deadline = SEQUENCES, time.monotonic() + 30
                while len(run.replicas) < 3 and time.monotonic() < deadline:
                    assert await counter(client, run, extra) == STEPS * (STEPS + 1) // 2
                    extra += 1
            assert len(run.replicas) >= 3  # a, b and a again (a new process: a new replica id)
            assert run.retried > 0  # the kill and the hand-back made clients retry
            record_property("retried_steps", run.retried)
            with capsys.disabled():
                print(
                    f"\n{SEQUENCES} sequences x {STEPS} steps through {proxy_kind}, one replica killed and "
                    f"restarted: {run.retried} step attempts retried, every step applied once"
                )
    finally:
        for server in servers.values():
            server.stop(signal.SIGKILL)


async def test_a_draining_replica_hands_its_sequences_over(redis_url: str) -> None:
    # a long lease: the other replica could not take over before it expires, unless it is released
    a = replica(redis_url, free_port(), "--drain-delay", "30", lease_ms=60000)
    b = replica(redis_url, free_port(), lease_ms=60000)
    try:
        async with (
            httpx.AsyncClient(base_url=a.http_url) as on_a,
            httpx.AsyncClient(base_url=b.http_url) as on_b,
        ):
            for number in (1, 2):
                answer = await on_a.post(
                    "/v2/models/counter/infer",
                    json=body(number, number),
                    headers={"ts_request_sequence_id": "d"},
                )
                assert answer.status_code == 200
            held = await on_b.post(
                "/v2/models/counter/infer", json=body(3, 3), headers={"ts_request_sequence_id": "d"}
            )
            assert held.status_code == 503 and held.headers["retry-after"] == "1"
            a.process.send_signal(signal.SIGTERM)
            a.wait_for_log("handed 1 sequence")
            later = await on_a.post(
                "/v2/models/counter/infer", json=body(3, 3), headers={"ts_request_sequence_id": "d"}
            )
            assert later.status_code == 503 and later.headers["retry-after"] == "1"
            moved = await on_b.post(
                "/v2/models/counter/infer", json=body(3, 3), headers={"ts_request_sequence_id": "d"}
            )
            assert moved.status_code == 200, moved.text
            assert int(moved.json()["outputs"][0]["data"][0]) == 6
    finally:
        a.stop(signal.SIGKILL)
        b.stop()


async def test_a_draining_replica_finishes_the_step_it_runs_and_releases_its_sequence(redis_url: str) -> None:
    """SIGTERM while a step runs: the step finishes (200), and the write of its state frees the
    lease, so the other replica goes on at once from that state (the lease, 60 s, has not expired),
    while the draining one still keeps its listeners open."""
    import redis.asyncio as aioredis

    a = replica(redis_url, free_port(), "--drain-delay", "30", lease_ms=60000)
    b = replica(redis_url, free_port(), lease_ms=60000)
    probe = aioredis.Redis.from_url(redis_url)
    try:
        async with (
            httpx.AsyncClient(base_url=a.http_url, timeout=30) as on_a,
            httpx.AsyncClient(base_url=b.http_url, timeout=30) as on_b,
        ):
            slow = body(4, 1)
            slow["parameters"]["hold_s"] = 2.0
            running = asyncio.create_task(
                on_a.post("/v2/models/counter/infer", json=slow, headers={"ts_request_sequence_id": "f"})
            )
            key = "mlserver:seq:counter::f"
            for _ in range(1000):  # until a claimed it: the step runs now (2 s), nothing written yet
                if await probe.hget(key, "step") == b"0":
                    break
                await asyncio.sleep(0.005)
            else:
                raise AssertionError("the step never started")
            a.process.send_signal(signal.SIGTERM)
            answer = await running
            assert answer.status_code == 200 and int(answer.json()["outputs"][0]["data"][0]) == 4
            assert await probe.hget(key, "step") == b"1"  # its state written
            seconds, micros = await probe.time()
            lease_end = int(await probe.hget(key, "until") or 0)
            assert 0 < lease_end <= seconds * 1000 + micros // 1000  # and its lease freed with it
            assert (await on_a.get("/v2/health/ready")).status_code == 503  # a drains still
            moved = await on_b.post(
                "/v2/models/counter/infer", json=body(5, 2), headers={"ts_request_sequence_id": "f"}
            )
            assert moved.status_code == 200, moved.text
            assert [int(v) for v in moved.json()["outputs"][1]["data"]] == [4, 5]
            a.process.send_signal(signal.SIGTERM)  # a second signal cuts the drain delay short
            assert await asyncio.to_thread(a.process.wait, 60) == 0
    finally:
        await probe.aclose()
        a.stop(signal.SIGKILL)
        b.stop()


def grpc_step(x: int, start: bool = False) -> Any:
    """A gRPC ModelInfer request of one counter step (its sequence fields go in metadata)."""
    from runtime.frontends.grpc.generated import dataplane_pb2 as pb

    made = pb.ModelInferRequest(model_name="counter")
    made.inputs.add(name="x", datatype="INT64", shape=[1])
    made.raw_input_contents.append(np.array([x], np.int64).tobytes())
    if start:
        made.parameters["sequence_start"].bool_param = True
    return made


def grpc_total(answer: Any) -> int:
    return int(np.frombuffer(answer.raw_output_contents[0], np.int64)[0])


def test_grpc_metadata_carry_the_sequence_and_its_step_numbers_over_redis(redis_url: str) -> None:
    """Over gRPC with the Redis store: a START without an id learns the server-made id and the
    replica from the trailing metadata; the id and ``sequence_step`` travel as metadata; a retried
    step gets its stored answer, a step from the future FAILED_PRECONDITION naming the expected one."""
    server = replica(redis_url, free_port())
    try:
        with grpc.insecure_channel(server.grpc_address) as channel:
            infer = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            first, call = infer.with_call(grpc_step(5, start=True), metadata=(("sequence_step", "1"),))
            trailers = dict(call.trailing_metadata())
            made = trailers["ts_request_sequence_id"]
            served_by = first.parameters["sequence_replica"].string_param
            assert made.startswith("seq-") and first.parameters["sequence_id"].string_param == made
            assert trailers["sequence_replica"] == served_by != ""

            def numbered(x: int, number: int) -> tuple[Any, dict[str, str]]:
                metadata = (("ts_request_sequence_id", made), ("sequence_step", str(number)))
                answer, call = infer.with_call(grpc_step(x), metadata=metadata)
                return answer, dict(call.trailing_metadata())

            second, trailers = numbered(3, 2)
            assert grpc_total(second) == 8 and trailers["sequence_replica"] == served_by
            retried, _ = numbered(3, 2)
            assert list(retried.raw_output_contents) == list(second.raw_output_contents)
            with pytest.raises(grpc.RpcError) as ahead:
                numbered(1, 5)
            assert ahead.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "expects sequence_step=3, got 5" in (ahead.value.details() or "")
            third, _ = numbered(1, 3)
            assert grpc_total(third) == 9  # the retry and the refused step applied nothing
    finally:
        server.stop()


@pytest.mark.parametrize("proxy_kind", ["haproxy", "nginx"])
def test_the_shipped_configs_route_grpc_by_the_sequence_metadata(redis_url: str, proxy_kind: str) -> None:
    """The gRPC part of each shipped proxy config: every step of a sequence reaches one replica
    (hashing on the ``ts_request_sequence_id`` metadata), and the sequences spread over both."""
    front = {"haproxy": haproxy, "nginx": nginx}[proxy_kind]
    servers = [replica(redis_url, free_port()) for _ in range(2)]
    try:
        rest = [server.http_url.removeprefix("http://") for server in servers]
        with (
            front(rest, [server.grpc_address for server in servers]) as proxy,
            grpc.insecure_channel(proxy.grpc) as channel,
        ):
            infer = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            served: dict[str, set[str]] = {}
            for number in range(1, 6):
                for index in range(16):
                    sid = f"{proxy_kind}-grpc-{index}"
                    metadata = (("ts_request_sequence_id", sid), ("sequence_step", str(number)))
                    answer, call = infer.with_call(grpc_step(number, start=number == 1), metadata=metadata)
                    assert grpc_total(answer) == sum(range(1, number + 1))
                    served.setdefault(sid, set()).add(dict(call.trailing_metadata())["sequence_replica"])
            assert all(len(replicas) == 1 for replicas in served.values()), served
            assert len(set().union(*served.values())) == 2  # 16 sequences hashed over both replicas
    finally:
        for server in servers:
            server.stop()


def test_the_shipped_proxy_configs_are_valid() -> None:
    """haproxy -c on the shipped config; nginx -t on the nginx one (skipped where nginx is absent)."""
    from tests.external import HAPROXY_CONFIG, binary

    checked = subprocess.run(
        [binary("haproxy"), "-c", "-f", str(HAPROXY_CONFIG)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("nginx is not installed (apt-get install nginx): deploy/nginx/nginx.conf not checked")
    with tempfile.TemporaryDirectory() as prefix:
        checked = subprocess.run(
            [nginx, "-t", "-p", prefix, "-c", str(ROOT / "deploy" / "nginx" / "nginx.conf")],
            capture_output=True,
            text=True,
        )
    assert checked.returncode == 0, checked.stdout + checked.stderr
