"""Server and model settings, with MLServer's field names.

``Settings`` is read from ``settings.json`` (in the model folder or given with ``--settings``),
``ModelSettings`` from each ``model-settings.json``. Environment variables fill what a file leaves
out: ``MLSERVER_<FIELD>`` for the server, ``MLSERVER_MODEL_<FIELD>`` for a model (nested fields with
``__``, e.g. ``MLSERVER_MODEL_PARAMETERS__URI``). Every field has a default and a docstring; the
docstrings are the documentation, the JSON Schemas in ``schemas/`` and the CLI's ``--help``.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.field_docs import documented
from runtime.types import MetadataTensor
from runtime.version import __version__

logger = logging.getLogger(__name__)

SETTINGS_FILENAME = "settings.json"
MODEL_SETTINGS_FILENAME = "model-settings.json"
ENV_PREFIX = "MLSERVER_"
MODEL_ENV_PREFIX = "MLSERVER_MODEL_"
MODEL_ENV_PARAMETERS = ("uri", "version", "format", "content_type", "extra")
"""Parameters read from ``MLSERVER_MODEL_<NAME>`` directly (no ``PARAMETERS__``), as MLServer does."""


TORCHSERVE_PORTS = {
    "http_port": 8080,
    "management_port": 8081,
    "metrics_port": 8082,
    "grpc_port": 7070,
    "grpc_management_port": 7071,
}
"""The ports ``torchserve: true`` gives the fields that were not set explicitly (TorchServe's own)."""


@documented
class CORSSettings(BaseModel):
    """Cross-origin requests to the REST API (``cors_settings`` in settings.json), as MLServer's, with
    its defaults; Starlette's CORSMiddleware applies them."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    allow_origins: list[str] = []
    """Origins allowed to make cross-origin requests, e.g. ``["https://example.org"]``; ``["*"]``
    allows any."""

    allow_origin_regex: str | None = None
    """A regular expression of the origins allowed (matched whole), e.g. ``https://.*\\.example\\.org``."""

    allow_credentials: bool = False
    """Allow cookies (credentials) in cross-origin requests."""

    allow_methods: list[str] = ["GET"]
    """HTTP methods allowed in cross-origin requests; ``["*"]`` allows every one."""

    allow_headers: list[str] = []
    """Request headers allowed in cross-origin requests, beside the CORS-safelisted ones; ``["*"]``
    allows any."""

    expose_headers: list[str] = []
    """Response headers a browser lets the page read."""

    max_age: int = 600
    """Seconds a browser may cache a preflight's answer."""


@documented
class Settings(BaseSettings):
    """Settings of the server (``settings.json``; environment prefix ``MLSERVER_``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        protected_namespaces=(),
        defer_build=True,  # until @documented has set the descriptions
        validate_default=True,
    )

    debug: bool = False
    """Log at DEBUG level and include tracebacks of model failures in the logs."""

    host: str = "127.0.0.1"
    """Address the HTTP and gRPC servers listen on. Use 0.0.0.0 to listen on every interface."""

    http_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the REST server; 0 picks a free port (the chosen one is logged)."""

    grpc_port: int = Field(default=8081, ge=0, le=65535)
    """Port of the gRPC server; 0 picks a free port (the chosen one is logged)."""

    grpc_management_port: int | None = Field(default=None, ge=0, le=65535)
    """A second port of the same gRPC server, where TorchServe's management clients look for it
    (7071 with ``torchserve``); unset: none. Every service is served on both ports."""

    torchserve: bool = False
    """Take TorchServe's default ports: REST 8080 (inference, and this server's other REST routes),
    management 8081, metrics 8082, gRPC 7070 (inference) and 7071 (``grpc_management_port``). Only the defaults move:
    a port given explicitly (flag, settings.json, environment) is kept."""

    root_path: str = ""
    """Path prefix the REST API is served under, for proxies that strip or add one."""

    server_name: str = "mlserver-like"
    """Name reported by server metadata (GET /v2)."""

    server_version: str = __version__
    """Version reported by server metadata (GET /v2)."""

    extensions: list[str] = []
    """Extra protocol extensions to list in server metadata, beside those the server implements."""

    model_repository_root: str = "."
    """Folder searched, recursively, for model-settings.json files."""

    load_models_at_startup: bool = True
    """Load every model found in the repository when the server starts."""

    logging_settings: str | dict[str, Any] | None = None
    """A logging config (dictConfig) as a dict, or the path of a JSON file holding one."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Level of the server's own logs."""

    access_log: bool = False
    """Log one line per REST request, gRPC call and stream (logger ``runtime.access``): time,
    transport, route or RPC, model, version, status, duration, request id, sequence id and trace
    id. Off by default: it costs throughput."""

    use_structured_logging: bool = False
    """Write every log line as one JSON object (MLServer's name), access log lines included."""

    metrics_endpoint: str | None = "/metrics"
    """Path of the Prometheus metrics, served on ``metrics_port``; empty (or null) turns metrics off
    (nothing is counted then)."""

    metrics_port: int = Field(default=8082, ge=0, le=65535)
    """Port of the Prometheus metrics server; 0 picks a free port (the chosen one is logged)."""

    tracing_server: str | None = None
    """OTLP/gRPC address the OpenTelemetry traces are exported to, as in MLServer, e.g.
    ``otel-collector:4317`` (plaintext unless ``https://``; ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf``
    makes it an OTLP/HTTP address). Needs the ``tracing`` extra. Unset: traces
    are on only when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` variable is set (and ``OTEL_SDK_DISABLED`` is not true)."""

    max_request_size: int = Field(default=100 * 1024 * 1024, gt=0)
    """Largest HTTP request body accepted, in bytes; larger bodies get 413 (a gzip body: once
    decompressed)."""

    cors_settings: CORSSettings | None = None
    """Answer cross-origin requests (CORS) on every REST route, as MLServer does: allow_origins,
    allow_origin_regex, allow_credentials, allow_methods, allow_headers, expose_headers, max_age.
    Unset: no CORS headers, browsers refuse pages of other origins."""

    gzip_enabled: bool = True
    """Compress REST answers of 500 bytes or more with gzip for clients that accept it, and read
    request bodies sent with ``Content-Encoding: gzip``, on every REST route, as MLServer does.
    Server-Sent Events streams are not compressed."""

    http_keepalive_timeout: float = Field(default=75.0, gt=0)
    """Seconds an HTTP keep-alive connection may sit idle between requests before the server
    closes it (nginx's ``keepalive_timeout``)."""

    http_header_timeout: float = Field(default=60.0, gt=0)
    """Seconds a client has to send a request's whole header, from the connection's start or the
    request's first byte; a new connection that sends nothing is closed, a header still incomplete
    gets 408 (nginx's ``client_header_timeout``; it stops slowloris)."""

    http_max_header_size: int = Field(default=32 * 1024, ge=1024)
    """Largest HTTP request header (request line and fields), in bytes; a larger one gets 431
    (nginx's ``large_client_header_buffers`` 4 x 8k)."""

    shutdown_grace_period: float = Field(default=30.0, ge=0)
    """Seconds in-flight requests get to finish after SIGTERM/SIGINT before models are unloaded."""

    drain_delay: float = Field(default=0.0, ge=0)
    """Seconds the server keeps accepting connections after SIGTERM/SIGINT while readiness answers
    503 (gRPC: not ready, grpc.health NOT_SERVING) and new inference is refused with 503, so that
    load balancers see it leave before connections are refused; in-flight work goes on meanwhile.
    After it, the listeners stay open while requests or streams are in flight; they close once none
    is, or when ``shutdown_grace_period`` has passed (what is still running then is cut). Set it to
    at least the readiness probe's period (times its failure threshold) behind a load balancer."""

    strict_readiness: bool = True
    """Triton's strict readiness: the server is ready only when every model asked for at startup
    (every model-settings.json of the repository) is loaded and ready, no model load has failed,
    and at least one model is loaded (unless ``load_models_at_startup`` is off). When false, the
    server is ready once it started, whatever its models' states (each model's own ready endpoint
    still tells)."""

    loop_block_warning: float = Field(default=0.1, ge=0)
    """Seconds the event loop may stay blocked (e.g. by a model's ``async def predict`` computing
    without awaiting) before the server logs a warning naming the model; 0 turns the check off.
    The default is asyncio's own threshold for a slow callback (``slow_callback_duration``): every
    request on the server waits while the loop is blocked. A stall with no model's code on the
    loop's stack (an import on first use, a full garbage collection) is reported once it lasts
    five times as long."""

    transport_fairness: bool = True
    """Share the event loop fairly between REST and gRPC: while gRPC inference calls are being
    served, REST ``infer`` requests start one per loop iteration, so that gRPC (which accepts one
    call at a time) is not starved by many REST connections. REST alone is not slowed. See
    runtime/core/fairness.py and the README's "REST and gRPC together"."""

    grpc_max_message_length: int = Field(default=100 * 1024 * 1024, gt=0)
    """Largest gRPC message sent or received, in bytes."""

    parallel_workers: int = Field(default=0, ge=0)
    """Worker processes that run each model whose model-settings.json does not set ``workers``
    (MLServer's name): 0 runs models in the server process; N >= 1 runs N processes per model,
    each with its own copy of it."""

    management_port: int = Field(default=8083, ge=0, le=65535)
    """Port of the management API (TorchServe's REST shape: list, describe, register, scale,
    set-default, unregister); 0 picks a free port."""

    management_host: str = "127.0.0.1"
    """Address the management API listens on (loopback unless set otherwise)."""

    management_enabled: bool = True
    """Serve the management API."""

    management_token_auth: bool = True
    """Require ``Authorization: Bearer <key>`` on the management API, with a key generated at start
    and written to ``management_key_file`` (readable by the server's user only), as TorchServe
    0.11 does. Turn it off only where the port is otherwise protected."""

    repository_token_auth: bool = True
    """Require the management key (``Authorization: Bearer <key>``, the key in
    ``management_key_file``) on the model repository extension's load and unload, on the inference
    ports: REST ``POST /v2/repository/models/{name}/load`` and ``/unload``, gRPC
    ``RepositoryModelLoad`` and ``RepositoryModelUnload``. Without it they answer 401 /
    UNAUTHENTICATED, as Triton refuses them unless its model control mode allows them. False opens
    them to every client of the inference ports. The repository index (read-only) is always open."""

    management_key_file: str = ""
    """Where the management key is written (JSON ``{"management": {"key": ...}}``, mode 0600,
    removed at stop); empty: a ``key_file.json`` in a private temporary folder, whose path is logged."""

    allowed_urls: list[str] = []
    """Regular expressions (case-insensitive, matching the whole path or URL) of what models may be
    registered from through the management API. Empty: only folders and archives inside
    ``model_repository_root``."""

    grpc_stream_format: Literal["mlserver", "triton"] = "mlserver"
    """What ModelStreamInfer streams back. ``mlserver``: ModelInferResponse messages, as MLServer and
    its clients do; an error for one request is answered in-band by a response with that request's
    id, no outputs, and the parameters ``error`` (the message) and ``error_code`` (the gRPC status
    name). ``triton``: ModelStreamInferResponse messages, as Triton and tritonclient's
    start_stream/async_stream_infer do: errors in ``error_message``, every response carries the
    parameter ``triton_final_response``. Either way the stream stays open after an error."""

    mlflow_model: str | None = None
    """The model that answers MLflow's scoring route ``POST /invocations`` (and ``/health``). Unset:
    the only MLflow model loaded (``runtime.mlflow.MLflowModel``), else the only model loaded; with
    several of either and none named here, ``/invocations`` answers 404 saying so."""

    max_loaded_models: int = Field(default=0, ge=0)
    """Most model versions loaded at once; 0: no limit. With a limit (this or
    ``models_memory_limit``), every model of the repository is registered, those not loaded are
    listed UNAVAILABLE ("not loaded") and loaded by the first request naming them, and the least
    recently used idle model is unloaded to make room (see docs/many-models.md)."""

    models_memory_limit: int = Field(default=0, ge=0)
    """Most resident memory the loaded models may add, in bytes or as text (``"512MiB"``,
    ``"4GiB"``, ``"800MB"``); 0: no limit. Each model's share is measured when it loads (the growth
    of the resident set of the server process, or of its worker processes). Loads run one at a
    time, so the total may pass the limit by at most the model being loaded."""

    model_load_wait: float = Field(default=60.0, gt=0)
    """Most seconds a request waits for its model to be loaded on demand (and for room to load
    it while every loaded model is busy) before it gets 503 with ``Retry-After``; a request's own
    timeout shortens it."""

    repository_poll_interval: float = Field(default=0.0, ge=0)
    """Seconds between two looks at the model repository (Triton's POLL mode); 0: off. A new
    model folder is registered (and loaded, unless models load on demand), a changed
    model-settings.json or model file reloads its model (the old copy serves until the new one is
    ready), a removed folder unloads its model once its work has ended."""

    response_cache: str = Field(default="", pattern=r"^(|memory|rediss?://.*)$")
    """Where the answers of models with ``"response_cache": true`` are kept: empty (off),
    ``memory`` (an LRU of ``response_cache_size`` answers in this process) or
    ``redis://host:port/db`` (shared by the replicas; entries expire after ``response_cache_ttl``)."""

    response_cache_size: int = Field(default=1024, ge=1)
    """Most answers the ``memory`` response cache holds (least recently used dropped first)."""

    response_cache_ttl: float = Field(default=300.0, gt=0)
    """Seconds a response cached in Redis lives."""

    grpc_tls_certificate: str | None = None
    """Path of a PEM certificate (chain) for the gRPC port; with grpc_tls_private_key it turns TLS on."""

    grpc_tls_private_key: str | None = None
    """Path of the PEM private key of grpc_tls_certificate."""

    _source: Path | None = PrivateAttr(default=None)
    _unknown_keys: list[str] = PrivateAttr(default_factory=list)

    @field_validator("metrics_endpoint")
    @classmethod
    def _metrics_path(cls, value: str | None) -> str | None:
        if value and not value.startswith("/"):
            raise ValueError(f"metrics_endpoint must be a path starting with '/', got {value!r}")
        return value or None

    @field_validator("models_memory_limit", mode="before")
    @classmethod
    def _memory_size(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _torchserve_ports(self) -> Settings:
        if self.torchserve:
            for name, port in TORCHSERVE_PORTS.items():
                if name not in self.model_fields_set:
                    setattr(self, name, port)
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.grpc_tls_certificate is None) != (self.grpc_tls_private_key is None):
            raise ValueError("grpc_tls_certificate and grpc_tls_private_key must be given together")
        return self

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
        """Read a settings.json (if given and present), then apply overrides (e.g. from the CLI)."""
        data: dict[str, Any] = {}
        unknown: list[str] = []
        if path is not None and Path(path).is_file():
            data = _read_json(Path(path))
            unknown = unknown_keys(cls, data, Path(path))
        data.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**data)
        settings._source = Path(path) if path is not None else None
        settings._unknown_keys = unknown
        return settings

    @property
    def unknown_keys(self) -> list[str]:
        """One warning per key of the settings.json this was read from that no field has (logged
        when the server starts, see :func:`unknown_keys`)."""
        return list(self._unknown_keys)

    @property
    def metrics_enabled(self) -> bool:
        return bool(self.metrics_endpoint)


@documented
class ModelParameters(BaseModel):
    """Parameters of a model version (``parameters`` in model-settings.json)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=(), defer_build=True)

    uri: str | None = None
    """Where the model's artefact lies (a file or folder); relative paths are relative to the model's folder."""

    version: str | None = None
    """The version this model-settings.json serves; models of one name and several versions coexist."""

    environment_path: str | None = None
    """Accepted for compatibility with MLServer's settings; this server runs models in its own environment."""

    format: str | None = None
    """The artefact's format, for runtimes that serve more than one."""

    content_type: str | None = None
    """Default codec content type for requests that do not say one (e.g. ``np``, ``str``)."""

    extra: dict[str, Any] = {}
    """Free-form settings for the model's own code."""


@documented
class GenerateSettings(BaseModel):
    """How the generate extension maps text to a model's tensors (``generate`` in model-settings.json).

    ``POST /v2/models/{m}/generate`` with ``{"text_input": "...", "parameters": {...}}`` becomes an
    inference request whose one input is a BYTES tensor named ``text_input`` (holding the UTF-8
    text) and whose request parameters are the generate parameters; the model answers with a BYTES
    output named ``text_output``. The defaults follow Triton's generate extension.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    text_input: str = "text_input"
    """Name of the BYTES input that receives a generate request's ``text_input``."""

    text_output: str = "text_output"
    """Name of the BYTES output whose (single) element becomes the response's ``text_output``."""


@documented
class ModelSettings(BaseSettings):
    """Settings of one model (``model-settings.json``; environment prefix ``MLSERVER_MODEL_``)."""

    model_config = SettingsConfigDict(
        env_prefix=MODEL_ENV_PREFIX,
        env_nested_delimiter="__",
        extra="ignore",
        protected_namespaces=(),
        defer_build=True,  # until @documented has set the descriptions
        arbitrary_types_allowed=True,
    )

    name: str = ""
    """Model name; defaults to the name of the folder holding model-settings.json."""

    implementation: str | SkipJsonSchema[type] = "runtime.model.MLModel"
    """Import path of the model class, e.g. ``model.EchoModel``; a first part naming a .py file in the
    model's folder is loaded from there."""

    platform: str = ""
    """Platform reported in model metadata (e.g. ``pytorch_torchscript``)."""

    versions: list[str] = []
    """Versions reported in model metadata; the server fills it from the loaded versions when empty."""

    inputs: list[MetadataTensor] = []
    """Input tensors the model accepts. When given, requests are checked against them (names,
    datatypes, shapes with -1 as any size)."""

    outputs: list[MetadataTensor] = []
    """Output tensors the model returns, for metadata."""

    require_declared_inputs: bool = False
    """Refuse (400) a request that lacks a declared input not marked ``"parameters": {"optional":
    true}``, as Triton does. Off by default, as in MLServer: the model gets the inputs the client
    sent. (The PyTorch runtime always needs the inputs its ``forward`` takes.)"""

    max_batch_size: int = Field(default=0, ge=0)
    """Most requests merged into one batch; 0 or 1 turns batching off. With continuous batching:
    the most streams running together (0 counts as 1)."""

    max_batch_time: float = Field(default=0.0, ge=0)
    """Most seconds the first request of a batch waits for others to join it. Adaptive batching
    is on when ``max_batch_size`` > 1 and this is > 0 (as in MLServer)."""

    max_concurrent_batches: int = Field(default=1, ge=1)
    """Most batches of this model whose ``predict`` runs at once (adaptive batching); the next
    batch forms while these run. Raise it for models that ``predict`` on a thread pool or a
    device that overlaps calls."""

    max_queue_size: int = Field(default=1024, ge=1)
    """Most requests waiting in this model's batching queue (Triton's ``max_queue_size``);
    a request beyond it gets 503 at once."""

    queue_timeout: float = Field(default=0.0, ge=0)
    """Most seconds a request waits in the batching queue before it gets 503; 0: no limit
    (Triton's ``default_timeout_microseconds``, in seconds). A request's own OIP ``timeout``
    parameter (microseconds) can shorten it, not lengthen it."""

    request_timeout: float = Field(default=0.0, ge=0)
    """Most seconds a request (queued and running) may take before it gets 503 and its work is
    cancelled; 0: no limit. A request's own OIP ``timeout`` parameter (microseconds, as Triton's)
    can shorten it, not lengthen it. Streams are not limited by it."""

    predict_threads: int = Field(default=1, ge=1)
    """Threads that run a plain (not ``async``) ``predict`` of this model, off the event loop;
    more than 1 lets calls overlap (the model must then be thread-safe)."""

    continuous_batching: bool = False
    """Serve the model's streams with continuous batching: at most ``max_batch_size`` streams run
    together and advance one step at a time (the model subclasses ``runtime.ContinuousModel`` and
    implements ``step``); finished streams leave and waiting ones join at every step. Streams wait to
    join in a queue of at most ``max_queue_size``, for at most ``queue_timeout`` seconds."""

    workers: int | None = Field(default=None, ge=0)
    """Worker processes that run this model, each with its own copy of it (loaded from these
    settings): 0 keeps it in the server process; N >= 1 runs N processes, requests going to the
    least busy one and every request of a sequence to the one holding its state. A worker that
    dies is restarted; only the requests it held fail (503). Unset: the server's
    ``parallel_workers``."""

    worker_start_timeout: float = Field(default=120.0, gt=0)
    """Seconds a worker process gets to load its copy of the model (at load, at a restart, when
    scaling up). One that has not loaded by then is killed, and the load, restart or scaling fails
    with an error that names the model, the worker and this timeout."""

    # ---- sequence batching (stateful models); see runtime.sequences

    sequence_batching: bool = False
    """Serve the model with the sequence batcher: requests that share a ``sequence_id`` run in order,
    one per batch, with the model's per-sequence state kept between them (the model implements
    ``runtime.SequenceModel.predict_sequences``). Batches take at most ``max_batch_size`` requests of
    different sequences, oldest first, waiting at most ``max_batch_time`` for more."""

    max_sequences: int = Field(default=1000, ge=1)
    """Most sequences open at once on this model; a START beyond it is refused at once (503)."""

    max_sequence_queue_size: int = Field(default=10, ge=0)
    """Most requests of one sequence waiting beyond the one running; one more is refused (503)."""

    max_sequence_idle_ms: int = Field(default=60000, ge=0)
    """A sequence with nothing queued and nothing running for this long ends (reason ``idle``);
    0 turns the idle timeout off."""

    sequence_timeout_ms: int = Field(default=0, ge=0)
    """Most milliseconds a sequence may live from its START: requests accepted before then finish,
    later ones are refused (400) and the sequence ends (reason ``timeout``). 0: no limit."""

    sequence_state_capacity: int = Field(default=0, ge=0)
    """Most sequence states the state store keeps (an LRU). Evicting a live sequence's state ends
    that sequence (reason ``eviction``) and its next request is refused (400). 0: ``max_sequences``."""

    sequence_store: str = Field(default="memory", pattern=r"^(memory|rediss?://.*)$")
    """Where sequence states live: ``memory`` (this process, an LRU of ``sequence_state_capacity``)
    or ``redis://host:port/db`` (shared by the model's replicas: each step is claimed with a lease
    and written with a fencing token, a sequence idle for ``max_sequence_idle_ms`` ends there too,
    endings are recorded; not with worker processes; see docs/replicas.md). ``MLSERVER_MODEL_SEQUENCE_STORE`` sets it for every model whose
    model-settings.json does not."""

    sequence_lease_ms: int = Field(default=5000, ge=50)
    """With a shared ``sequence_store``: how long a replica holds a sequence after its last step;
    another replica takes the sequence over once the lease has expired (or was released)."""

    sequence_ended_memory: int = Field(default=10000, ge=1)
    """How many recently ended sequence ids are remembered, so that a late request to one is told
    why it ended (instead of being told to START)."""

    pinned: bool = False
    """Load this model at start and never unload it to make room (it counts in
    ``max_loaded_models`` and ``models_memory_limit``); the server is ready once it is."""

    warmup: list[dict[str, Any]] | str | None = None
    """Requests the model serves before it is READY, on every load (Triton's ``model_warmup``): a
    list of V2 inference request bodies, or the name of a file in the model's folder holding one
    JSON request per line. A warm-up request that fails fails the load, with its reason."""

    response_cache: bool = False
    """Keep this model's answers in the server's ``response_cache``: a request equal to an earlier
    one (same model version, inputs, requested outputs and parameters, whatever its id) is answered
    from it without calling the model. Errors, streams and sequence steps are never cached; a
    reload of the model drops its entries."""

    parameters: ModelParameters | None = None
    """Parameters of this model version: uri, version, content_type, extra."""

    generate: GenerateSettings = GenerateSettings()
    """How /generate and /generate_stream map text to this model's tensors (names of its text input
    and output; by default ``text_input`` and ``text_output``, as in Triton)."""

    _source: Path | None = PrivateAttr(default=None)

    @field_validator("implementation", mode="before")
    @classmethod
    def _implementation(cls, value: Any) -> Any:
        if isinstance(value, type) or isinstance(value, str):
            return value
        raise ValueError("implementation must be an import path or a class")

    @property
    def version(self) -> str | None:
        return self.parameters.version if self.parameters else None

    @property
    def folder(self) -> Path | None:
        """The folder of the model-settings.json this came from, if any."""
        return self._source.parent if self._source else None

    @classmethod
    def from_environment(cls) -> ModelSettings:
        """The one model that ``MLSERVER_MODEL_*`` variables describe, read as MLServer reads them
        (what KServe sets): ``NAME``, ``IMPLEMENTATION`` and the other fields of this class, and
        the parameters ``URI``, ``VERSION``, ``FORMAT``, ``CONTENT_TYPE`` and ``EXTRA`` (a JSON
        object) without a ``PARAMETERS__`` prefix. When the URI is a folder (KServe's
        ``/mnt/models``), the model's code may live there, as beside a model-settings.json."""
        settings = cls()
        found = _environment_parameters()
        if found:
            own = settings.parameters.model_dump(exclude_unset=True) if settings.parameters else {}
            settings.parameters = ModelParameters(**{**found, **own})
        uri = settings.parameters.uri if settings.parameters else None
        if uri and Path(uri).is_dir():
            settings._source = Path(uri) / MODEL_SETTINGS_FILENAME
        return settings

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ModelSettings:
        path = Path(path)
        data = _read_json(path)
        # as MLServer: MLSERVER_MODEL_* variables fill what the file leaves out (KServe names the
        # model so), then the folder names it
        if "name" not in data and not os.environ.get(MODEL_ENV_PREFIX + "NAME"):
            data["name"] = path.parent.name
        found = _environment_parameters()
        if found:
            own = data.get("parameters")
            data["parameters"] = {**found, **own} if isinstance(own, dict) else own if own else found
        for warning in unknown_keys(cls, data, path):
            logger.warning("%s", warning)
        settings = cls(**data)
        settings._source = path
        return settings


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}


def parse_size(text: str) -> int:
    """Bytes from ``"512MiB"``, ``"4GiB"``, ``"800MB"``, ``"1.5G"`` or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: a number of bytes, or one with a unit (512MiB, 4GiB, 800MB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def _environment_parameters() -> dict[str, Any]:
    """The parameters ``MLSERVER_MODEL_URI``, ``_VERSION``, ``_FORMAT``, ``_CONTENT_TYPE`` and
    ``_EXTRA`` (a JSON object) that are set, read as MLServer reads them (no ``PARAMETERS__``)."""
    found: dict[str, Any] = {}
    for field in MODEL_ENV_PARAMETERS:
        raw = os.environ.get(MODEL_ENV_PREFIX + field.upper())
        if raw is None:
            continue
        if field == "extra":
            try:
                found[field] = json.loads(raw)
            except ValueError as exc:
                raise ValueError(f"{MODEL_ENV_PREFIX}EXTRA must be a JSON object: {exc}") from exc
        else:
            found[field] = raw
    return found


MLSERVER_IGNORED: dict[str, frozenset[str]] = {
    "Settings": frozenset(
        {
            "parallel_workers_timeout",
            "environments_dir",
            "model_repository_implementation",
            "model_repository_implementation_args",
            "metrics_rest_server_prefix",
            "metrics_dir",
            "kafka_enabled",
            "kafka_servers",
            "kafka_topic_input",
            "kafka_topic_output",
            "cache_enabled",
            "cache_size",
        }
    ),
    "ModelSettings": frozenset({"parallel_workers", "warm_workers", "cache_enabled"}),
    "ModelParameters": frozenset(
        {"environment_tarball", "inference_pool_gid", "autogenerate_inference_pool_gid"}
    ),
}
"""Keys MLServer's settings accept that this server ignores on purpose (its Kafka server, its
response cache, its environment tarballs and inference pools, the metrics of its worker
processes): known, so not warned about."""


def unknown_keys(model: type[BaseModel], data: dict[str, Any], path: Path, prefix: str = "") -> list[str]:
    """One warning for each key of ``data`` (read from ``path``) that no field of ``model`` has,
    nested settings objects included, naming the closest field (``difflib``): a misspelt key would
    otherwise be ignored in silence. MLServer's keys that this server ignores on purpose
    (:data:`MLSERVER_IGNORED`) are known."""
    if model.model_config.get("extra") == "forbid":
        return []  # its validation refuses unknown keys already
    known = set(model.model_fields) | MLSERVER_IGNORED.get(model.__name__, frozenset())
    warnings: list[str] = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            if key in known:
                continue
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "no setting has a name close to it"
            warnings.append(f"Unknown key {prefix + key!r} in {path} is ignored ({hint})")
            continue
        nested = _settings_model(field.annotation)
        if nested is not None and isinstance(value, dict):
            warnings += unknown_keys(nested, value, path, f"{prefix}{key}.")
    return warnings


def _settings_model(annotation: Any) -> type[BaseModel] | None:
    """The settings model of a nested field (``X`` or ``X | None``), or None."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schemas of settings.json and model-settings.json, as written to schemas/."""
    return {
        "settings.schema.json": Settings.model_json_schema(),
        "model-settings.schema.json": ModelSettings.model_json_schema(),
    }
