"""Server and model settings, with MLServer's field names.

``Settings`` is read from ``settings.json`` (in the model folder or given with ``--settings``);
``ModelSettings`` (``runtime.model_settings``, named here too) from each ``model-settings.json``. Environment variables fill what a file leaves
out: ``MLSERVER_<FIELD>`` for the server, ``MLSERVER_MODEL_<FIELD>`` for a model (nested fields with
``__``, e.g. ``MLSERVER_MODEL_PARAMETERS__URI``). Every field has a default and a docstring; the
docstrings are the documentation, the JSON Schemas in ``schemas/`` and the CLI's ``--help``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.field_docs import documented
from runtime.model_settings import (
    MODEL_ENV_PARAMETERS,
    MODEL_ENV_PREFIX,
    MODEL_SETTINGS_FILENAME,
    GenerateSettings,
    ModelParameters,
    ModelSettings,
)
from runtime.settings_files import MLSERVER_IGNORED, SIZE_FIELDS, parse_size, read_json, unknown_keys
from runtime.version import __version__

__all__ = [
    "ENV_PREFIX",
    "MLSERVER_IGNORED",
    "MODEL_ENV_PARAMETERS",
    "MODEL_ENV_PREFIX",
    "MODEL_SETTINGS_FILENAME",
    "SETTINGS_FILENAME",
    "TORCHSERVE_PORTS",
    "CORSSettings",
    "GenerateSettings",
    "ModelParameters",
    "ModelSettings",
    "Settings",
    "json_schemas",
    "parse_size",
    "unknown_keys",
]

logger = logging.getLogger(__name__)

SETTINGS_FILENAME = "settings.json"
ENV_PREFIX = "MLSERVER_"

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

    @field_validator(*SIZE_FIELDS, mode="before")
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
            data = read_json(Path(path))
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


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schemas of settings.json and model-settings.json, as written to schemas/."""
    return {
        "settings.schema.json": Settings.model_json_schema(),
        "model-settings.schema.json": ModelSettings.model_json_schema(),
    }
