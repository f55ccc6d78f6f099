"""Prometheus metrics: exact counts kept in plain Python, exposed with prometheus-client.

The serving path only adds to plain integers and floats (a :class:`Recorder` per process); the
Prometheus families are built at scrape time by :class:`ServerCollector`, registered in a
``CollectorRegistry`` of the server's own (never the global one). What the schedulers own (queue
depth, sequences, continuous batching, executions) is read from them at scrape time too.

Several processes: a recorder's :meth:`Recorder.snapshot` is a plain, picklable dict, and
snapshots add up (:func:`merge`). The collector sums its own recorder's snapshot with those of any
other sources (``ServerCollector.sources``: callables returning snapshots, e.g. of worker
processes answering over their pipe), so a scrape of the one metrics port shows every process's
counts, exactly. The family names, labels and meanings are listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from runtime.core.residency import LOAD_BUCKETS
from runtime.telemetry.counts import (
    BATCH_BUCKETS,
    DURATION_BUCKETS,
    TRITON_REASONS,
    ModelKey,
    Recorder,
    merge,
)
from runtime.telemetry.tokens import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, TokenStats

if TYPE_CHECKING:
    from runtime.core.registry import Registry
    from runtime.scheduling.scheduler import Scheduler

MODEL_LABELS = ("model_name", "model_version")
TRITON_LABELS = ("model", "version")
REST_LABELS = ("method", "path", "status_code")
GRPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")


class ServerCollector:
    """Builds every family from the recorders' snapshots and the registry's schedulers."""

    def __init__(self, recorder: Recorder, registry: Registry) -> None:
        self.recorder = recorder
        self.registry = registry
        self.sources: list[Callable[[], dict[str, Any]]] = []
        """Snapshots of other processes, summed with this one's at every scrape."""

    def describe(self) -> list[Metric]:
        return []  # families are built at collect time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        data = merge([self.recorder.snapshot(), *(source() for source in self.sources)])
        yield from _model_families(data.get("models", {}))
        yield from _transport_families(data)
        yield from _scheduler_families(self.registry)
        yield from _residency_families(self.registry)


def _model_families(models: dict[ModelKey, dict[str, Any]]) -> Iterator[Metric]:
    success = CounterMetricFamily(
        "model_infer_request_success", "Inference requests that succeeded", labels=MODEL_LABELS
    )
    failure = CounterMetricFamily(
        "model_infer_request_failure", "Inference requests that failed (any error)", labels=MODEL_LABELS
    )
    duration = HistogramMetricFamily(
        "model_infer_request_duration",
        "Seconds from the DataPlane taking an inference request to its answer",
        labels=MODEL_LABELS,
    )
    rejected = CounterMetricFamily(
        "model_infer_request_rejected",
        "Inference requests refused with 503 (reason: overloaded, queue_timeout, not_ready, shutting_down, "
        "worker_lost)",
        labels=(*MODEL_LABELS, "reason"),
    )
    streams_open = GaugeMetricFamily("model_streams_open", "Streams being served now", labels=MODEL_LABELS)
    streams = CounterMetricFamily("model_streams", "Streams opened", labels=MODEL_LABELS)
    events = CounterMetricFamily(
        "model_stream_events_sent",
        "Stream responses sent (in-band errors included)",
        labels=MODEL_LABELS,
    )
    cancelled = CounterMetricFamily(
        "model_streams_cancelled",
        "Streams the client left (disconnected or cancelled) before they ended",
        labels=MODEL_LABELS,
    )
    triton = {
        name: Metric(name, text, "unknown")
        for name, text in (
            ("nv_inference_request_success", "Number of successful inference requests (Triton's name)"),
            (
                "nv_inference_request_failure",
                "Number of failed inference requests, by reason (Triton's name)",
            ),
            (
                "nv_inference_request_duration_us",
                "Cumulative duration of the successful inference requests, in microseconds",
            ),
        )
    }
    for (name, version), c in sorted(models.items()):
        labels = [name, version]
        tlabels = {"model": name, "version": version}
        success.add_metric(labels, c["success"])
        failure.add_metric(labels, c["failure"])
        duration.add_metric(labels, _buckets(c["duration"]["counts"], DURATION_BUCKETS), c["duration"]["sum"])
        for reason, count in sorted(c["rejected"].items()):
            rejected.add_metric([*labels, reason], count)
        streams_open.add_metric(labels, c["streams_open"])
        streams.add_metric(labels, c["streams_opened"])
        events.add_metric(labels, c["stream_events"])
        cancelled.add_metric(labels, c["streams_cancelled"])
        triton["nv_inference_request_success"].add_sample(
            "nv_inference_request_success", tlabels, c["success"]
        )
        failed = c["failed"]
        for reason in TRITON_REASONS:  # every reason present from the start, as Triton's
            triton["nv_inference_request_failure"].add_sample(
                "nv_inference_request_failure", {**tlabels, "reason": reason}, failed.get(reason, 0)
            )
        triton["nv_inference_request_duration_us"].add_sample(
            "nv_inference_request_duration_us", tlabels, round(c["success_seconds"] * 1e6)
        )
    yield from (success, failure, duration, rejected, streams_open, streams, events, cancelled)
    yield from triton.values()


def _transport_families(data: dict[str, Any]) -> Iterator[Metric]:
    requests = CounterMetricFamily("rest_server_requests", "REST requests answered", labels=REST_LABELS)
    seconds = HistogramMetricFamily(
        "rest_server_request_duration_seconds",
        "Seconds from a REST request's arrival to the end of its response (streams: the stream's end)",
        labels=REST_LABELS,
    )
    for key, h in sorted(data.get("rest", {}).items()):
        requests.add_metric(list(key), sum(h["counts"]))
        seconds.add_metric(list(key), _buckets(h["counts"], DURATION_BUCKETS), h["sum"])
    started = CounterMetricFamily("grpc_server_started", "gRPC calls started", labels=GRPC_LABELS)
    for key, count in sorted(data.get("grpc_started", {}).items()):
        started.add_metric(list(key), count)
    handled = CounterMetricFamily(
        "grpc_server_handled", "gRPC calls completed, by status code", labels=(*GRPC_LABELS, "grpc_code")
    )
    for key, count in sorted(data.get("grpc_handled", {}).items()):
        handled.add_metric(list(key), count)
    handling = HistogramMetricFamily(
        "grpc_server_handling_seconds", "Seconds from a gRPC call's start to its end", labels=GRPC_LABELS
    )
    for key, h in sorted(data.get("grpc_seconds", {}).items()):
        handling.add_metric(list(key), _buckets(h["counts"], DURATION_BUCKETS), h["sum"])
    yield from (requests, seconds, started, handled, handling)


def _buckets(counts: list[int], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    cumulative = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        cumulative += count
        out.append(("+Inf" if bound == float("inf") else _number(bound), cumulative))
    return out


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _scheduler_families(registry: Registry) -> Iterator[Metric]:
    """What each loaded model's scheduler owns, read from it now."""
    tl = TRITON_LABELS
    count = Metric("nv_inference_count", "Inferences performed (requests served by executions)", "unknown")
    execs = Metric(
        "nv_inference_exec_count", "Model executions (batches, sequence batches, steps)", "unknown"
    )
    queue_us = Metric("nv_inference_queue_duration_us", "Cumulative queue time of requests, in us", "unknown")
    compute_us = Metric(
        "nv_inference_compute_infer_duration_us", "Cumulative model time of requests, in us", "unknown"
    )
    batch = HistogramMetricFamily(
        "model_batch_size", "Requests (or streams) served by one model execution", labels=MODEL_LABELS
    )
    depth = GaugeMetricFamily(
        "model_queue_depth", "Requests (or streams) waiting in the model's queue now", labels=MODEL_LABELS
    )
    pending = GaugeMetricFamily(
        "nv_inference_pending_request_count",
        "Inference requests (or streams) awaiting execution: in the model's queue now",
        labels=TRITON_LABELS,
    )
    seq_open = GaugeMetricFamily("model_sequences_open", "Sequences open now", labels=MODEL_LABELS)
    seq_ended = CounterMetricFamily(
        "model_sequences_ended",
        "Sequences ended (reason: end, idle, timeout, cancel, eviction, unload, ...)",
        labels=(*MODEL_LABELS, "reason"),
    )
    seq_rejected = CounterMetricFamily(
        "model_sequences_rejected", "Sequence requests refused, by reason", labels=(*MODEL_LABELS, "reason")
    )
    states = GaugeMetricFamily(
        "model_sequence_states", "Sequence states held in the state store", labels=MODEL_LABELS
    )
    running = GaugeMetricFamily(
        "model_continuous_running", "Streams running in the continuous batch now", labels=MODEL_LABELS
    )
    waiting = GaugeMetricFamily(
        "model_continuous_waiting", "Streams waiting to join the continuous batch now", labels=MODEL_LABELS
    )
    for entry in registry.entries():
        scheduler = entry.scheduler
        if scheduler is None:
            continue
        name, version = entry.name, entry.version or ""
        labels = [name, version]
        tlabels = dict(zip(tl, labels, strict=True))
        stats = [scheduler.stats.snapshot()]
        inner: Scheduler | None = getattr(scheduler, "stateless", None)
        if inner is not None:  # the sequence batcher's scheduler for requests outside sequences
            stats.append(inner.stats.snapshot())
        total = merge(stats)
        count.add_sample("nv_inference_count", tlabels, total["inferences"])
        execs.add_sample("nv_inference_exec_count", tlabels, total["executions"])
        queue_us.add_sample("nv_inference_queue_duration_us", tlabels, round(total["queue_seconds"] * 1e6))
        compute_us.add_sample(
            "nv_inference_compute_infer_duration_us", tlabels, round(total["compute_seconds"] * 1e6)
        )
        sizes = total["batch_sizes"]
        counts = [0] * (len(BATCH_BUCKETS) + 1)
        for size, n in sizes.items():
            counts[bisect.bisect_left(BATCH_BUCKETS, size)] += n
        batch.add_metric(labels, _buckets(counts, BATCH_BUCKETS), sum(s * n for s, n in sizes.items()))

        described = scheduler.describe()
        own = described.get("stats", {})
        queued = getattr(scheduler, "queued", None)
        if not isinstance(queued, int):
            queued = own.get("queued_streams", own.get("queued_requests", 0))
        if inner is not None:
            queued += getattr(inner, "queued", 0)
        depth.add_metric(labels, queued)
        pending.add_metric(labels, queued)
        sequences = described.get("sequence_stats") or (
            own if described.get("scheduler") == "sequence" else None
        )
        if sequences:
            seq_open.add_metric(labels, sequences.get("open_sequences", 0))
            states.add_metric(labels, sequences.get("states_held", 0))
            for reason, n in sorted(sequences.get("ended", {}).items()):
                seq_ended.add_metric([*labels, str(reason)], n)
            for reason, n in sorted(sequences.get("rejected", {}).items()):
                seq_rejected.add_metric([*labels, str(reason)], n)
        if described.get("scheduler") == "continuous":
            running.add_metric(labels, own.get("running_streams", 0))
            waiting.add_metric(labels, own.get("queued_streams", 0))
    yield from (count, execs, queue_us, compute_us, batch, depth, pending, seq_open, seq_ended, seq_rejected)
    yield states
    yield from (running, waiting)
    yield from _worker_families(registry)
    yield from _token_families(registry)


def _worker_families(registry: Registry) -> Iterator[Metric]:
    """The worker processes of the models that run in them (``workers`` >= 1)."""
    workers = GaugeMetricFamily(
        "model_workers",
        "Worker processes of the model, by status (READY, STARTING, DRAINING, STOPPING, DEAD)",
        labels=(*MODEL_LABELS, "status"),
    )
    restarts = CounterMetricFamily(
        "model_worker_restarts", "Worker processes started again after one died", labels=MODEL_LABELS
    )
    memory = GaugeMetricFamily(
        "model_worker_memory_bytes",
        "Resident memory of each worker process",
        labels=(*MODEL_LABELS, "worker"),
    )
    for entry in registry.entries():
        pool = entry.workers.pool if entry.workers is not None else None
        if pool is None:
            continue
        labels = [entry.name, entry.version or ""]
        by_status: dict[str, int] = {}
        for described in pool.describe():
            by_status[described["status"]] = by_status.get(described["status"], 0) + 1
            if described["memoryUsage"] is not None:
                memory.add_metric([*labels, described["id"]], described["memoryUsage"])
        for status, n in sorted(by_status.items()):
            workers.add_metric([*labels, status], n)
        restarts.add_metric(labels, pool.restarts)
    yield from (workers, restarts, memory)


def _residency_families(registry: Registry) -> Iterator[Metric]:
    """Loads, unloads and memory of the models (``runtime.core.residency``), and the response cache."""
    loads = CounterMetricFamily(
        "model_loads", "Loads of the model (at start, on demand, reloads)", labels=MODEL_LABELS
    )
    unloads = CounterMetricFamily(
        "model_unloads",
        "Unloads of the model, by reason (evicted, removed, replaced, requested)",
        labels=(*MODEL_LABELS, "reason"),
    )
    seconds = HistogramMetricFamily(
        "model_load_duration_seconds", "Seconds a load took (warm-up included)", labels=MODEL_LABELS
    )
    for (name, version), counts in sorted(registry.residency.counts.items()):
        labels = [name, version]
        loads.add_metric(labels, counts.loads)
        for reason, n in sorted(counts.unloads.items()):
            unloads.add_metric([*labels, reason], n)
        seconds.add_metric(
            labels, _buckets(counts.load_seconds.counts, LOAD_BUCKETS), counts.load_seconds.sum
        )
    held = registry.models_held()
    loaded = GaugeMetricFamily("models_loaded", "Model versions loaded now", value=held["loaded"])
    memory_total = GaugeMetricFamily(
        "models_memory_bytes", "Resident memory the loaded models took when they loaded", value=held["memory"]
    )
    memory = GaugeMetricFamily(
        "model_memory_bytes", "Resident memory the model took when it loaded", labels=MODEL_LABELS
    )
    for entry in registry.resident():
        memory.add_metric([entry.name, entry.version or ""], entry.memory)
    yield from (loads, unloads, seconds, loaded, memory_total, memory)
    cache = registry.cache
    if cache is None:
        return
    hits = CounterMetricFamily(
        "response_cache_hits", "Requests answered from the response cache", labels=MODEL_LABELS
    )
    misses = CounterMetricFamily(
        "response_cache_misses", "Cacheable requests not found in the response cache", labels=MODEL_LABELS
    )
    for (name, version), n in sorted(cache.hits.items()):
        hits.add_metric([name, version], n)
    for (name, version), n in sorted(cache.misses.items()):
        misses.add_metric([name, version], n)
    yield from (hits, misses)


def _token_families(registry: Registry) -> Iterator[Metric]:
    """vLLM's families, for the language models (those whose model keeps ``token_stats``)."""
    prompt = CounterMetricFamily("vllm:prompt_tokens", "Prompt tokens prefilled", labels=MODEL_LABELS)
    generated = CounterMetricFamily("vllm:generation_tokens", "Tokens generated", labels=MODEL_LABELS)
    success = CounterMetricFamily(
        "vllm:request_success",
        "Generation requests ended, by finished_reason (stop, length, abort, error)",
        labels=(*MODEL_LABELS, "finished_reason"),
    )
    ttft = HistogramMetricFamily(
        "vllm:time_to_first_token_seconds",
        "Seconds from a request's arrival (waiting included) to its first token",
        labels=MODEL_LABELS,
    )
    itl = HistogramMetricFamily(
        "vllm:inter_token_latency_seconds", "Seconds between two tokens of a stream", labels=MODEL_LABELS
    )
    e2e = HistogramMetricFamily(
        "vllm:e2e_request_latency_seconds",
        "Seconds from a request's arrival to its last token",
        labels=MODEL_LABELS,
    )
    running = GaugeMetricFamily("vllm:num_requests_running", "Streams generating now", labels=MODEL_LABELS)
    waiting = GaugeMetricFamily(
        "vllm:num_requests_waiting", "Streams waiting for a slot now", labels=MODEL_LABELS
    )
    for entry in registry.entries():
        stats: TokenStats | None = getattr(entry.model, "token_stats", None)
        if not isinstance(stats, TokenStats):
            continue
        labels = [entry.name, entry.version or ""]
        prompt.add_metric(labels, stats.prompt_tokens)
        generated.add_metric(labels, stats.generation_tokens)
        for reason, count in sorted(stats.requests.items()):
            success.add_metric([*labels, reason], count)
        for family, histogram, bounds in (
            (ttft, stats.ttft, TTFT_BUCKETS),
            (itl, stats.inter_token, ITL_BUCKETS),
            (e2e, stats.e2e, E2E_BUCKETS),
        ):
            family.add_metric(labels, _buckets(histogram.counts, bounds), histogram.sum)
        scheduler = entry.scheduler
        running.add_metric(labels, getattr(scheduler, "running", 0))
        waiting.add_metric(labels, getattr(scheduler, "queued", 0))
    yield from (prompt, generated, success, ttft, itl, e2e, running, waiting)


def new_registry(collector: ServerCollector) -> CollectorRegistry:
    """A registry of the server's own (never prometheus-client's global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def metrics_app(registry: CollectorRegistry, path: str) -> Callable[..., Any]:
    """A tiny ASGI app: GET ``path`` answers the text exposition, anything else 404."""

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != path.rstrip("/") or scope["method"] not in ("GET", "HEAD"):
            status, body, kind = 404, orjson.dumps({"error": "Not Found"}), "application/json"
        else:
            status, body, kind = 200, generate_latest(registry), CONTENT_TYPE_LATEST
        headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body if scope["method"] != "HEAD" else b""})

    return app
