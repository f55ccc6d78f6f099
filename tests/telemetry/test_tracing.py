"""Traces with the real OpenTelemetry SDK and its in-memory exporter: traceparent in, spans out."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator

import grpc
import httpx
import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.frontends.grpc.generated import dataplane_pb2 as pb
from runtime.frontends.grpc.generated import dataplane_pb2_grpc
from runtime.model import MLModel
from runtime.settings import ModelSettings, Settings
from runtime.telemetry import tracing
from runtime.telemetry.logging import JsonFormatter
from runtime.types import InferenceRequest, InferenceResponse, ResponseOutput
from tests.adaptive_helpers import body as rows_body
from tests.adaptive_helpers import row_settings
from tests.models import zoo
from tests.servers import serving

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
ECHO = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, object]]]:
    lines: list[dict[str, object]] = []
    formatter = JsonFormatter()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(formatter.format(record)))

    handler = Collect()
    logger = logging.getLogger("runtime.access")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def _hex(value: int) -> str:
    return f"{value:032x}"


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_traceparent_is_honoured_on_rest_and_grpc(
    exporter: tuple[TracerProvider, InMemorySpanExporter], access_lines: list[dict[str, object]]
) -> None:
    provider, memory = exporter
    models = (ModelSettings(name="echo", implementation=zoo.Echo),)
    async with serving(*models, tracer_provider=provider, access_log=True) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            response = await client.post(
                "/v2/models/echo/infer", json=ECHO, headers={"traceparent": TRACEPARENT}
            )
            assert response.status_code == 200
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="echo")
            request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
            await stub.ModelInfer(request, metadata=(("traceparent", TRACEPARENT),))
    spans = memory.get_finished_spans()
    rest = by_name(spans, "POST /v2/models/{model_name}/infer")
    rpc = by_name(spans, "inference.GRPCInferenceService/ModelInfer")
    assert len(rest) == 1 and len(rpc) == 1
    for server_span in (rest[0], rpc[0]):
        assert _hex(server_span.context.trace_id) == TRACE_ID
        assert server_span.parent is not None and f"{server_span.parent.span_id:016x}" == PARENT_ID
    infers = by_name(spans, "infer echo")
    assert len(infers) == 2
    assert {s.parent.span_id for s in infers if s.parent} == {rest[0].context.span_id, rpc[0].context.span_id}
    assert [line["trace_id"] for line in access_lines] == [TRACE_ID, TRACE_ID]


async def test_a_batch_span_links_the_requests_in_it(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    async with serving(
        row_settings("rows", max_batch_size=2, max_batch_time=30), tracer_provider=provider
    ) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            parents = [f"00-{i:032x}-{i:016x}-01" for i in (1, 2)]
            responses = await asyncio.gather(
                *(
                    client.post(
                        "/v2/models/rows/infer", json=rows_body([[i, i]]), headers={"traceparent": tp}
                    )
                    for i, tp in enumerate(parents)
                )
            )
            assert [r.status_code for r in responses] == [200, 200]
    spans = memory.get_finished_spans()
    (batch,) = by_name(spans, "batch")
    (predict,) = by_name(spans, "predict")
    infers = by_name(spans, "infer rows")
    queues = by_name(spans, "queue")
    assert batch.attributes is not None and batch.attributes["batch.size"] == 2
    assert {link.context.span_id for link in batch.links} == {s.context.span_id for s in infers}
    assert predict.parent is not None and predict.parent.span_id == batch.context.span_id
    assert {q.parent.span_id for q in queues if q.parent} == {s.context.span_id for s in infers}
    assert {_hex(s.context.trace_id) for s in infers} == {f"{i:032x}" for i in (1, 2)}
    assert all(
        q.start_time is not None and q.end_time is not None and q.start_time <= q.end_time for q in queues
    )


def test_tracing_is_off_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.from_settings(Settings()) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert tracing.wanted(Settings())
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.wanted(Settings(tracing_server="http://127.0.0.1:4318"))


def test_the_exporter_follows_tracing_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    # as MLServer: tracing_server is an OTLP/gRPC address, with or without a scheme
    for address in ("collector:4317", "http://collector:4317"):
        grpc_exporter = tracing.exporter(Settings(tracing_server=address))
        assert isinstance(grpc_exporter, GrpcExporter) and grpc_exporter._endpoint == "collector:4317"
    # the standard protocol variable makes it an OTLP/HTTP address
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    http = tracing.exporter(Settings(tracing_server="http://collector:4318"))
    assert isinstance(http, HttpExporter) and http._endpoint == "http://collector:4318/v1/traces"
    # without tracing_server, the OTEL_* variables say where (over HTTP unless they say grpc)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://elsewhere:4318/v1/traces")
    default = tracing.exporter(Settings())
    assert isinstance(default, HttpExporter) and default._endpoint == "http://elsewhere:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert isinstance(tracing.exporter(Settings()), GrpcExporter)


def test_the_core_does_not_import_opentelemetry() -> None:
    import subprocess
    import sys

    code = (
        "import sys, runtime.server.serving, runtime.core.dataplane; "
        "print([m for m in sys.modules if m.startswith('opentelemetry')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("settings", "document"),
    [
        (ModelSettings(name="direct", implementation=zoo.Echo), ECHO),
        (
            ModelSettings(name="seq", implementation="tests.models.seqzoo.Recorder", sequence_batching=True),
            {
                "inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}],
                "parameters": {"sequence_id": "t", "sequence_start": True},
            },
        ),
        (
            ModelSettings(
                name="steps", implementation="tests.continuous_models.Ticker", continuous_batching=True
            ),
            {"inputs": [], "parameters": {"length": 2}},
        ),
    ],
    ids=["direct", "sequence", "continuous"],
)
async def test_every_strategy_traces_its_queue_batch_and_model_call(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
    settings: ModelSettings,
    document: dict[str, object],
) -> None:
    provider, memory = exporter
    async with serving(settings, tracer_provider=provider) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            response = await client.post(
                f"/v2/models/{settings.name}/infer", json=document, headers={"traceparent": TRACEPARENT}
            )
            assert response.status_code == 200, response.text
    spans = memory.get_finished_spans()
    (infer,) = by_name(spans, f"infer {settings.name}")
    assert _hex(infer.context.trace_id) == TRACE_ID
    batches = by_name(spans, "batch")
    steps = 2 if settings.continuous_batching else 1  # continuous batching: a batch span per step
    assert len(batches) == steps
    for batch in batches:
        assert [link.context.span_id for link in batch.links] == [infer.context.span_id]
        assert batch.attributes is not None and batch.attributes["batch.size"] == 1
    predicts = by_name(spans, "predict")
    assert sorted(p.parent.span_id for p in predicts if p.parent) == sorted(
        b.context.span_id for b in batches
    )
    (queue,) = by_name(spans, "queue")  # a request waits once, before its first model call
    assert queue.parent is not None and queue.parent.span_id == infer.context.span_id
    assert queue.start_time is not None and queue.end_time is not None
    assert queue.start_time <= queue.end_time


class SpanCounter(MLModel):
    """Streams 0, 1, ..., n-1 and notes the span current in its generator at each step."""

    async def load(self) -> bool:
        self.seen: list[int] = []
        return True

    async def predict_stream(
        self, payloads: AsyncIterator[InferenceRequest]
    ) -> AsyncIterator[InferenceResponse]:
        from opentelemetry import trace

        async for payload in payloads:
            for i in range(int(np.asarray(payload.inputs[0].data).reshape(-1)[0])):
                self.seen.append(trace.get_current_span().get_span_context().span_id)
                await asyncio.sleep(0)
                yield InferenceResponse(
                    model_name=self.name,
                    outputs=[ResponseOutput(name="i", shape=[1], datatype="INT32", data=[i])],
                )


@pytest.mark.parametrize("adaptive", [False, True], ids=["direct", "adaptive"])
async def test_a_stream_served_by_one_model_call_traces_its_queue_batch_and_model_call(
    exporter: tuple[TracerProvider, InMemorySpanExporter], adaptive: bool
) -> None:
    provider, memory = exporter
    settings = ModelSettings(name="counter", implementation=SpanCounter)
    if adaptive:
        settings = settings.model_copy(update={"max_batch_size": 4, "max_batch_time": 0.01})
    document = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT32", "data": [3]}]}
    async with serving(settings, tracer_provider=provider) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            response = await client.post(
                "/v2/models/counter/infer_stream", json=document, headers={"traceparent": TRACEPARENT}
            )
            assert response.status_code == 200, response.text
            assert response.text.count("data:") == 3
        model = server.registry.get("counter").model
        assert isinstance(model, SpanCounter)
        seen = model.seen
    spans = memory.get_finished_spans()
    (request,) = by_name(spans, "POST /v2/models/{model_name}/infer_stream")
    assert _hex(request.context.trace_id) == TRACE_ID
    (batch,) = by_name(spans, "batch")
    assert [link.context.span_id for link in batch.links] == [request.context.span_id]
    assert batch.attributes is not None and batch.attributes["batch.size"] == 1
    (predict,) = by_name(spans, "predict")
    assert predict.parent is not None and predict.parent.span_id == batch.context.span_id
    assert seen == [predict.context.span_id] * 3  # the model runs in its predict span
    (queue,) = by_name(spans, "queue")
    assert queue.parent is not None and queue.parent.span_id == request.context.span_id
    assert batch.start_time is not None and request.start_time is not None
    assert request.start_time <= batch.start_time
    assert predict.end_time is not None and request.end_time is not None
    assert predict.end_time <= request.end_time  # the model call spans the whole stream


async def test_a_failed_stream_marks_its_model_call_failed(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    settings = ModelSettings(name="words", implementation="tests.stream_models.Words")
    document = {
        "inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a b c"]}],
        "parameters": {"fail_after": 1},
    }
    async with serving(settings, tracer_provider=provider) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            response = await client.post("/v2/models/words/infer_stream", json=document)
            assert "broke after 1 words" in response.text
    spans = memory.get_finished_spans()
    (predict,) = by_name(spans, "predict")
    (batch,) = by_name(spans, "batch")
    for span in (predict, batch):
        assert not span.status.is_ok
        assert [event.name for event in span.events] == ["exception"]
