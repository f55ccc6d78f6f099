"""/metrics scraped with prometheus-client's parser after a known mix of requests: exact counts."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from httpx_sse import aconnect_sse
from prometheus_client.parser import text_string_to_metric_families

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.settings import ModelSettings
from runtime.telemetry.counts import Recorder, merge
from runtime.telemetry.logging import JsonFormatter
from tests.adaptive_helpers import body as rows_body
from tests.adaptive_helpers import row_settings, until
from tests.models import zoo
from tests.models.seqzoo import Recorder as SequenceRecorder
from tests.sequencing import body as seq_body
from tests.servers import serving

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

MODELS = (
    ModelSettings(name="echo", implementation=zoo.Echo),
    ModelSettings(name="raising", implementation=zoo.Raising),
    row_settings("rows", max_batch_size=4, max_batch_time=30),
    row_settings("busy", max_batch_size=4, max_batch_time=30, max_queue_size=1, queue_timeout=4),
    ModelSettings(name="seq", implementation=SequenceRecorder, sequence_batching=True),
    ModelSettings(name="counter", implementation="tests.stream_models.Counter"),
)

ECHO = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


async def scrape(port: int) -> Samples:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


@pytest.mark.parametrize("access_log", [False, True], ids=["metrics-alone", "with-access-log"])
async def test_exact_counts_after_a_known_mix(access_log: bool) -> None:
    # metrics alone: the REST infer path counts itself and gRPC handlers are observed as registered;
    # with the access log: the REST app is wrapped and gRPC has an interceptor. The counts are the same.
    async with serving(*MODELS, access_log=access_log) as server:
        assert bool(server.observability.grpc_interceptors()) is access_log
        base = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            assert (await client.get("/v2/health/ready")).status_code == 200
            # REST: 3 echo successes, 2 failures of the model, 1 unknown model
            for _ in range(3):
                assert (await client.post("/v2/models/echo/infer", json=ECHO)).status_code == 200
            for _ in range(2):
                assert (await client.post("/v2/models/raising/infer", json=ECHO)).status_code == 500
            assert (await client.post("/v2/models/nowhere/infer", json=ECHO)).status_code == 404
            # adaptive batching: 4 requests leave as one batch of 4 (the batch time is 30 s)
            rows = await asyncio.gather(
                *(client.post("/v2/models/rows/infer", json=rows_body([[i, i]])) for i in range(4))
            )
            assert [r.status_code for r in rows] == [200] * 4
            # 503s: one request waits (then times out in the queue), the next finds the queue full
            waiting = asyncio.create_task(client.post("/v2/models/busy/infer", json=rows_body([[1, 1]])))
            scheduler = server.registry.get("busy").scheduler
            await until(lambda: getattr(scheduler, "queued", 0) == 1)
            samples = await scrape(server.metrics_port or 0)
            assert value(samples, "model_queue_depth", model_name="busy", model_version="") == 1
            assert value(samples, "nv_inference_pending_request_count", model="busy", version="") == 1
            full = await client.post("/v2/models/busy/infer", json=rows_body([[2, 2]]))
            assert full.status_code == 503
            # a sequence: START, a step that ends it (x = 0), then a request to a sequence never started
            assert (
                await client.post(
                    "/v2/models/seq/infer", json=seq_body(1, sequence_id="a", sequence_start=True)
                )
            ).status_code == 200
            assert (
                await client.post("/v2/models/seq/infer", json=seq_body(0, sequence_id="a"))
            ).status_code == 200
            assert (
                await client.post("/v2/models/seq/infer", json=seq_body(1, sequence_id="zz"))
            ).status_code == 400
            # an SSE stream of 3 events
            one = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [3]}]}
            async with aconnect_sse(client, "POST", "/v2/models/counter/infer_stream", json=one) as source:
                events = [event async for event in source.aiter_sse()]
            assert len(events) == 3
            # the waiting request times out in the queue (queue_timeout: long enough that the
            # request above found the queue full even on a loaded machine)
            assert (await waiting).status_code == 503
        # gRPC: 2 successes, 1 unknown model
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="echo")
            request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
            for _ in range(2):
                await stub.ModelInfer(request)
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.ModelInfer(pb.ModelInferRequest(model_name="nowhere"))
            assert missing.value.code() is grpc.StatusCode.NOT_FOUND
            health = health_pb2_grpc.HealthStub(channel)
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == 1  # SERVING
        samples = await scrape(server.metrics_port or 0)

    def model(name: str, family: str) -> float:
        return value(samples, family, model_name=name, model_version="")

    def triton(name: str, family: str) -> float:
        return value(samples, family, model=name, version="")

    # MLServer's families
    assert model("echo", "model_infer_request_success_total") == 5  # 3 REST + 2 gRPC
    assert model("echo", "model_infer_request_failure_total") == 0
    assert model("raising", "model_infer_request_failure_total") == 2
    assert model("rows", "model_infer_request_success_total") == 4
    assert model("busy", "model_infer_request_failure_total") == 2
    assert model("echo", "model_infer_request_duration_count") == 5
    assert model("seq", "model_infer_request_success_total") == 2
    assert model("seq", "model_infer_request_failure_total") == 1
    assert not any(dict(labels).get("model_name") == "nowhere" for _, labels in samples)
    # Triton's families
    assert triton("echo", "nv_inference_request_success") == 5
    assert value(samples, "nv_inference_request_failure", model="raising", version="", reason="BACKEND") == 2
    busy_failed = {"model": "busy", "version": "", "reason": "REJECTED"}  # timed out in the queue
    assert value(samples, "nv_inference_request_failure", **busy_failed) == 1
    assert triton("rows", "nv_inference_count") == 4
    assert triton("rows", "nv_inference_exec_count") == 1  # batching: 4 inferences in 1 execution
    assert triton("echo", "nv_inference_exec_count") == 5
    assert triton("busy", "nv_inference_exec_count") == 0
    assert triton("echo", "nv_inference_pending_request_count") == 0
    assert triton("rows", "nv_inference_queue_duration_us") > 0
    assert triton("echo", "nv_inference_request_duration_us") > 0
    assert triton("echo", "nv_inference_compute_infer_duration_us") > 0
    # this server's own
    assert value(samples, "model_batch_size_bucket", model_name="rows", model_version="", le="2") == 0
    assert value(samples, "model_batch_size_bucket", model_name="rows", model_version="", le="4") == 1
    assert model("rows", "model_batch_size_sum") == 4
    for reason in ("overloaded", "queue_timeout"):
        assert (
            value(
                samples,
                "model_infer_request_rejected_total",
                model_name="busy",
                model_version="",
                reason=reason,
            )
            == 1
        )
    assert model("busy", "model_queue_depth") == 0
    seq = {"model_name": "seq", "model_version": ""}
    assert value(samples, "model_sequences_ended_total", **seq, reason="end") == 1
    assert value(samples, "model_sequences_ended_total", **seq, reason="idle") == 0
    assert value(samples, "model_sequences_rejected_total", **seq, reason="not_open") == 1
    assert model("seq", "model_sequences_open") == 0
    assert model("seq", "model_sequence_states") == 0
    assert model("counter", "model_streams_total") == 1
    assert model("counter", "model_stream_events_sent_total") == 3
    assert model("counter", "model_streams_open") == 0
    assert model("counter", "model_streams_cancelled_total") == 0
    # the transports
    rest = {"method": "POST", "path": "/v2/models/{model_name}/infer"}
    assert value(samples, "rest_server_requests_total", **rest, status_code="200") == 3 + 4 + 2
    assert value(samples, "rest_server_requests_total", **rest, status_code="500") == 2
    assert value(samples, "rest_server_requests_total", **rest, status_code="503") == 2
    assert value(samples, "rest_server_requests_total", **rest, status_code="404") == 1
    assert value(samples, "rest_server_requests_total", **rest, status_code="400") == 1
    assert value(samples, "rest_server_request_duration_seconds_count", **rest, status_code="200") == 9
    stream = {"method": "POST", "path": "/v2/models/{model_name}/infer_stream", "status_code": "200"}
    assert value(samples, "rest_server_requests_total", **stream) == 1
    rpc = {
        "grpc_type": "unary",
        "grpc_service": "inference.GRPCInferenceService",
        "grpc_method": "ModelInfer",
    }
    assert value(samples, "grpc_server_started_total", **rpc) == 3
    assert value(samples, "grpc_server_handled_total", **rpc, grpc_code="OK") == 2
    assert value(samples, "grpc_server_handled_total", **rpc, grpc_code="NOT_FOUND") == 1
    assert value(samples, "grpc_server_handling_seconds_count", **rpc) == 3
    check = {"grpc_type": "unary", "grpc_service": "grpc.health.v1.Health", "grpc_method": "Check"}
    assert value(samples, "grpc_server_started_total", **check) == 1
    assert value(samples, "grpc_server_handled_total", **check, grpc_code="OK") == 1
    ready = {"method": "GET", "path": "/v2/health/ready", "status_code": "200"}
    assert value(samples, "rest_server_requests_total", **ready) == 1


async def test_continuous_batching_gauges() -> None:
    settings = ModelSettings(
        name="steps",
        implementation="tests.continuous_models.Ticker",
        continuous_batching=True,
        max_batch_size=2,
    )
    async with serving(settings) as server:
        samples = await scrape(server.metrics_port or 0)
    labels = {"model_name": "steps", "model_version": ""}
    assert value(samples, "model_continuous_running", **labels) == 0
    assert value(samples, "model_continuous_waiting", **labels) == 0


async def test_metrics_off_serves_no_port_and_counts_nothing() -> None:
    async with serving(ModelSettings(name="echo", implementation=zoo.Echo), metrics_endpoint="") as server:
        assert server.metrics_port is None
        assert server.dataplane.observer is None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            assert (await client.post("/v2/models/echo/infer", json=ECHO)).status_code == 200


async def test_metrics_port_answers_404_elsewhere() -> None:
    async with serving(ModelSettings(name="echo", implementation=zoo.Echo)) as server:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{server.metrics_port}/v2/health/live")
    assert response.status_code == 404 and response.json() == {"error": "Not Found"}


def test_snapshots_of_several_processes_add_up() -> None:
    """What worker processes will send: each process's snapshot, summed at the scrape."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        snapshots = pool.map(_worker_snapshot, [3, 4])
    total = merge([*snapshots, _worker_snapshot(5)])
    echo = total["models"][("echo", "1")]
    assert echo["success"] == 12 and echo["failure"] == 3
    assert sum(echo["duration"]["counts"]) == 15
    assert total["rest"][("POST", "/x", "200")]["counts"][0] == 12


def _worker_snapshot(n: int) -> dict[str, Any]:
    recorder = Recorder()
    counters = recorder.model("echo", "1")
    for _ in range(n):
        counters.success += 1
        counters.duration.observe(0.0001)
        recorder.rest_request("POST", "/x", 200, 0.0001)
    counters.failure += 1
    counters.duration.observe(0.0001)
    return recorder.snapshot()


# ---------------------------------------------------------------------- logs


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def access_lines() -> Iterator[list[str]]:
    handler = _Lines()
    logger = logging.getLogger("runtime.access")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


async def test_access_log_lines_are_json_with_every_field(access_lines: list[str]) -> None:
    async with serving(*MODELS, access_log=True) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            await client.post("/v2/models/echo/infer", json=ECHO, headers={"x-request-id": "r-1"})
            await client.post("/v2/models/seq/infer", json=seq_body(1, sequence_id="s9", sequence_start=True))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="echo", id="g-1")
            request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
            await stub.ModelInfer(request)
    lines = [json.loads(line) for line in access_lines]
    assert len(lines) == 3
    fields = {
        "time",
        "transport",
        "route",
        "model",
        "version",
        "status",
        "duration_ms",
        "request_id",
        "sequence_id",
        "trace_id",
    }
    assert all(fields <= set(line) for line in lines)
    rest, seq, rpc = lines
    assert (rest["transport"], rest["route"], rest["model"], rest["status"], rest["request_id"]) == (
        "rest",
        "POST /v2/models/{model_name}/infer",
        "echo",
        200,
        "r-1",
    )
    assert seq["sequence_id"] == "s9"
    assert (rpc["transport"], rpc["model"], rpc["status"], rpc["request_id"]) == ("grpc", "echo", "OK", "g-1")
    assert rpc["route"] == "/inference.GRPCInferenceService/ModelInfer"


@pytest.mark.parametrize("how", ["flags", "settings.json", "environment"])
def test_structured_logging_writes_one_json_object_per_line(tmp_path: Any, how: str) -> None:
    """The real CLI with structured logging and the access log on (by flags, by settings.json, or
    by MLServer's environment variables): every stderr line is JSON."""
    from tests.servers import start_server

    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "model-settings.json").write_text(
        json.dumps({"name": "echo", "implementation": "tests.models.zoo.Echo"})
    )
    flags: tuple[str, ...] = ()
    env: dict[str, str] = {}
    if how == "flags":
        flags = ("--use-structured-logging", "--access-log")
    elif how == "settings.json":
        (tmp_path / "settings.json").write_text(
            json.dumps({"use_structured_logging": True, "access_log": True})
        )
    else:
        env = {"MLSERVER_USE_STRUCTURED_LOGGING": "true", "MLSERVER_ACCESS_LOG": "true"}
    server = start_server(tmp_path, *flags, env=env)
    try:
        with httpx.Client(base_url=server.http_url) as client:
            assert client.post("/v2/models/echo/infer", json=ECHO).status_code == 200
            assert client.get("/v2/health/ready").status_code == 200
        with httpx.Client() as client:
            assert "model_infer_request_success_total" in client.get(server.metrics_url).text
    finally:
        assert server.stop() == 0
    lines = [line for line in server.read_log().splitlines() if line.strip()]
    documents = [json.loads(line) for line in lines]  # raises on any line that is not JSON
    access = [d for d in documents if d["logger"] == "runtime.access"]
    assert [d["route"] for d in access] == ["POST /v2/models/{model_name}/infer", "GET /v2/health/ready"]
    assert any("ready" in d["message"] for d in documents)


async def test_streams_the_client_leaves_are_counted_as_cancelled() -> None:
    from tests.stream_models import Endless

    async with serving(ModelSettings(name="endless", implementation=Endless)) as server:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        base = f"http://127.0.0.1:{server.http_port}"
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
            for events in (1, 3):
                stream = aconnect_sse(client, "POST", "/v2/models/endless/infer_stream", json={"inputs": []})
                async with stream as source:
                    seen = 0
                    async for _ in source.aiter_sse():
                        seen += 1
                        if seen == events:
                            break  # leaving the block closes the connection mid-stream
        await asyncio.wait_for(server.dataplane.streams.wait_idle(), 30)
        samples = await scrape(server.metrics_port or 0)
    labels = {"model_name": "endless", "model_version": ""}
    assert value(samples, "model_streams_total", **labels) == 2
    assert value(samples, "model_streams_cancelled_total", **labels) == 2
    assert value(samples, "model_streams_open", **labels) == 0
    assert value(samples, "model_stream_events_sent_total", **labels) >= 4


async def test_sequence_batching_reports_queue_and_compute_time() -> None:
    """A step queued behind its sequence's running step waits; both steps are timed in the model."""
    async with serving(
        ModelSettings(name="seq", implementation=SequenceRecorder, sequence_batching=True)
    ) as server:
        scheduler = server.registry.get("seq").scheduler
        assert scheduler is not None
        model = scheduler.model
        assert isinstance(model, SequenceRecorder)
        model.gate.clear()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as client:
            first = asyncio.create_task(
                client.post(
                    "/v2/models/seq/infer", json=seq_body(1, sequence_id="q", sequence_start=True, hold=True)
                )
            )
            await asyncio.wait_for(model.holding.wait(), 30)
            second = asyncio.create_task(
                client.post("/v2/models/seq/infer", json=seq_body(2, sequence_id="q", hold_s=0.05))
            )
            await until(lambda: scheduler.describe()["stats"]["queued_requests"] == 1)
            model.gate.set()
            assert [(await first).status_code, (await second).status_code] == [200, 200]
        samples = await scrape(server.metrics_port or 0)
    labels = {"model": "seq", "version": ""}
    assert value(samples, "nv_inference_exec_count", **labels) == 2
    assert value(samples, "nv_inference_count", **labels) == 2
    assert value(samples, "nv_inference_queue_duration_us", **labels) > 0  # the second waited for the first
    assert (
        value(samples, "nv_inference_compute_infer_duration_us", **labels) >= 50_000
    )  # hold_s of the second


async def test_continuous_batching_reports_queue_and_compute_time() -> None:
    """With one slot, a stream waits while another runs; every step is timed in the model."""
    settings = ModelSettings(
        name="steps",
        implementation="tests.continuous_models.Ticker",
        continuous_batching=True,
        max_batch_size=1,
    )
    async with serving(settings) as server:
        scheduler = server.registry.get("steps").scheduler
        assert scheduler is not None
        model: Any = scheduler.model
        model.hold()
        one = {"inputs": [], "parameters": {"length": 3, "delay_ms": 20}}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as client:
            first = asyncio.create_task(client.post("/v2/models/steps/infer", json=one))
            await asyncio.wait_for(model.wait_stepping(), 30)
            second = asyncio.create_task(client.post("/v2/models/steps/infer", json=one))
            await until(lambda: getattr(scheduler, "queued", 0) == 1)
            model.release()
            assert [(await first).status_code, (await second).status_code] == [200, 200]
        samples = await scrape(server.metrics_port or 0)
    labels = {"model": "steps", "version": ""}
    assert value(samples, "nv_inference_exec_count", **labels) == 6  # 3 steps each, one at a time
    assert value(samples, "nv_inference_count", **labels) == 6
    assert value(samples, "nv_inference_queue_duration_us", **labels) > 0  # the second waited 3 steps
    assert value(samples, "nv_inference_compute_infer_duration_us", **labels) >= 6 * 20_000


async def test_stream_access_lines_name_their_models(access_lines: list[str]) -> None:
    """One line per SSE stream and per ModelStreamInfer call, naming the model(s) its requests named."""
    async with serving(*MODELS, access_log=True) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as client:
            one = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [2]}]}
            async with aconnect_sse(client, "POST", "/v2/models/counter/infer_stream", json=one) as source:
                assert len([event async for event in source.aiter_sse()]) == 2
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            call = channel.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            requests = []
            for i, name in enumerate(("echo", "echo", "seq")):
                request = pb.ModelInferRequest(model_name=name, id=f"s-{i}")
                if name == "seq":
                    request.inputs.add(name="x", datatype="INT64", shape=[1]).contents.int64_contents.append(
                        1
                    )
                    request.parameters["sequence_id"].string_param = "g7"
                    request.parameters["sequence_start"].bool_param = True
                else:
                    request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(
                        1.0
                    )
                requests.append(request)
            replies = [reply async for reply in call(iter(requests))]
            assert [r.id for r in replies] == ["s-0", "s-1", "s-2"]
            assert all("error" not in r.parameters for r in replies)
    lines = [json.loads(line) for line in access_lines]
    assert len(lines) == 2
    sse, rpc = lines
    assert (sse["transport"], sse["route"], sse["model"], sse["status"]) == (
        "rest",
        "POST /v2/models/{model_name}/infer_stream",
        "counter",
        200,
    )
    assert (rpc["transport"], rpc["route"], rpc["model"], rpc["status"]) == (
        "grpc",
        "/inference.GRPCInferenceService/ModelStreamInfer",
        "echo,seq",
        "OK",
    )
    assert (rpc["request_id"], rpc["sequence_id"]) == ("s-0", "g7")


async def test_requests_refused_before_their_model_are_counted_as_rejected() -> None:
    """A request to a model version that exists but cannot serve (it failed to load) is a failure
    of that version, rejected as ``not_ready``; one to an unknown model is no label at all."""
    async with serving(
        ModelSettings(name="echo", implementation=zoo.Echo),
        ModelSettings(name="broken", implementation=zoo.FailingLoad),
    ) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            for _ in range(3):
                refused = await client.post("/v2/models/broken/infer", json=ECHO)
                assert refused.status_code == 503 and "error" in refused.json()
            assert (await client.post("/v2/models/nowhere/infer", json=ECHO)).status_code == 404
        assert server.metrics_port is not None
        samples = await scrape(server.metrics_port)
    broken = {"model_name": "broken", "model_version": ""}
    assert value(samples, "model_infer_request_failure_total", **broken) == 3
    assert value(samples, "model_infer_request_rejected_total", **broken, reason="not_ready") == 3
    assert value(samples, "model_infer_request_duration_count", **broken) == 3
    assert all(
        value(samples, "nv_inference_request_failure", model="broken", version="", reason=reason) == n
        for reason, n in (("REJECTED", 0), ("CANCELED", 0), ("BACKEND", 0), ("OTHER", 3))
    )
    assert not any(dict(labels).get("model_name") == "nowhere" for _, labels in samples)
