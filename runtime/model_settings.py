"""A model's settings (``model-settings.json``), with MLServer's field names.

``ModelSettings`` is read from each ``model-settings.json``; ``MLSERVER_MODEL_<FIELD>`` environment
variables fill what the file leaves out (nested fields with ``__``, e.g.
``MLSERVER_MODEL_PARAMETERS__URI``), and MLServer's ``MLSERVER_MODEL_URI``, ``_VERSION``,
``_FORMAT``, ``_CONTENT_TYPE`` and ``_EXTRA`` set its parameters as KServe's runtime sets them.
Every field has a default and a docstring: the documentation, the JSON Schema in ``schemas/`` and
the CLI's ``--help``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.field_docs import documented
from runtime.settings_files import read_json, unknown_keys
from runtime.types import MetadataTensor

logger = logging.getLogger(__name__)

MODEL_SETTINGS_FILENAME = "model-settings.json"
MODEL_ENV_PREFIX = "MLSERVER_MODEL_"
MODEL_ENV_PARAMETERS = ("uri", "version", "format", "content_type", "extra")
"""Parameters read from ``MLSERVER_MODEL_<NAME>`` directly (no ``PARAMETERS__``), as MLServer does."""


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
        data = read_json(path)
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
