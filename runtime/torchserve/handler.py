"""Running a TorchServe handler unchanged, in this process, with TorchServe's own ``ts`` package.

The handler is loaded as TorchServe's worker loads it (``ts.model_loader``: a ``file.py[:function]``
or a built-in ``ts.torch_handler`` name; a module with exactly one class, or a function), wrapped
in ``ts.service.Service`` with a real ``ts.context.Context``, and each batch goes through
``Service.predict``: so the handler sees exactly what TorchServe gives it (``data[i]`` entries,
request headers and pseudo-headers, request ids, ``model_yaml_config``, ``system_properties``),
and its answers are encoded by TorchServe's own ``create_predict_response`` (status, phrase,
headers, stopping criteria, str/bytes/tensor/JSON bodies), which this module reads back.
``send_intermediate_predict_response`` writes to ``context.cl_socket``: here an object whose
``sendall`` reads the chunk and hands it to the batch's caller.

KServe V1 rows (``Row.instance``) go through TorchServe's KServe envelope, row by row: the handler
gets the instance itself as ``data[i]`` and the answer for that row is sent back as JSON, so that
the V1 front end reads back exactly the object the handler returned.

A handler is synchronous: every call runs on the model's own thread, one at a time (a handler
keeps per-batch state on its context, as in a TorchServe worker).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from runtime.errors import ModelFailed
from runtime.torchserve.payload import BODY, Answer, Row

logger = logging.getLogger(__name__)

ChunkSink = Callable[[list[Answer]], None]
_SEQUENCE_PREFIX = "ts_request_sequence_"


class HandlerFailed(ModelFailed):
    """The handler failed a whole batch; ``status`` is the code TorchServe answers with
    (503 for an exception, 507 out of memory, a ``PredictionException``'s own code)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def decode_predict_response(buf: bytes) -> tuple[int, str, list[Answer]]:
    """Read a message written by ``ts.protocol.otf_message_handler.create_predict_response``."""
    view = memoryview(buf)
    pos = 0

    def integer() -> int:
        nonlocal pos
        (value,) = struct.unpack_from("!i", view, pos)
        pos += 4
        return int(value)

    def chunk(length: int) -> bytes:
        nonlocal pos
        value = bytes(view[pos : pos + length])
        pos += length
        return value

    code = integer()
    message = chunk(integer()).decode("utf-8")
    answers: list[Answer] = []
    while True:
        length = integer()
        if length == -1:
            break
        chunk(length)  # the request id: answers come in the batch's order
        content_type = chunk(integer()).decode("utf-8")
        status = integer()
        phrase = chunk(integer()).decode("utf-8")
        headers: dict[str, str] = {}
        for _ in range(integer()):
            key = chunk(integer()).decode("utf-8")
            headers[key] = chunk(integer()).decode("utf-8")
        if content_type and "content-type" not in {k.lower() for k in headers}:
            headers["content-type"] = content_type
        answers.append(Answer(body=chunk(integer()), status=status, phrase=phrase, headers=headers))
    return code, message, answers


class _ChunkSocket:
    """``context.cl_socket``: intermediate answers go to the running batch's sink."""

    def __init__(self) -> None:
        self.sink: ChunkSink | None = None

    def sendall(self, message: bytes) -> None:
        code, text, answers = decode_predict_response(message)
        if code != 200:
            logger.warning("A handler sent an intermediate answer with code %d: %s", code, text)
        if self.sink is None:
            logger.warning("A handler sent an intermediate answer outside a streamed request; dropped")
            return
        self.sink(answers)


def _load_module(handler: str, model_dir: Path) -> tuple[ModuleType, str | None]:
    """The handler's module (from the model's folder, under a name of its own) and function name."""
    module_part, _, function = handler.partition(":")
    stem = module_part[:-3] if module_part.endswith(".py") else module_part
    path = model_dir / f"{stem}.py"
    if path.is_file():
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        unique = f"_torchserve_handlers.h{digest}.{Path(stem).name}"
        module = sys.modules.get(unique)
        if module is None:
            spec = importlib.util.spec_from_file_location(unique, path)
            if spec is None or spec.loader is None:
                raise ModelFailed(f"Cannot import the handler {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[unique] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[unique]
                raise
        return module, function or None
    # a built-in handler: "image_classifier", "ts.torch_handler.image_classifier", a module path
    built_in = f"ts.torch_handler.{stem.split('/')[-1]}"
    try:
        return importlib.import_module(built_in), function or None
    except ModuleNotFoundError as exc:
        if exc.name is None or not (built_in == exc.name or built_in.startswith(f"{exc.name}.")):
            raise  # the built-in handler is there, but a module it imports is not: say which
        return importlib.import_module(stem), function or None


def _plain(value: Any) -> Any:
    """JSON for what handlers return beside plain objects: tensors and arrays, bytes."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class HandlerRunner:
    """One TorchServe handler, its ``ts.service.Service`` and context. Call it from one thread."""

    def __init__(self, name: str, model_dir: Path, manifest: dict[str, Any], batch_size: int) -> None:
        self.name = name
        self.model_dir = model_dir
        self.manifest = manifest
        self.batch_size = batch_size
        self.service: Any = None
        self._socket = _ChunkSocket()
        self._instances: frozenset[int] = frozenset()
        """The rows of the running batch that are KServe V1 instances."""

    @property
    def context(self) -> Any:
        return self.service.context

    def load(self) -> None:
        """Import the handler and initialise it (blocking: torch loads weights here)."""
        import ts
        from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
        from ts.model_loader import TsModelLoader
        from ts.service import Service

        folder = str(self.model_dir.resolve())
        if folder not in sys.path:  # the handler imports its sibling files, as in a TorchServe worker
            sys.path.insert(0, folder)
        module, function = _load_module(self.manifest["model"]["handler"], self.model_dir)
        loader = TsModelLoader()
        function = function or "handle"
        if hasattr(module, function):
            entry_point, initialize = loader._get_function_entry_point(module, function)
        else:
            entry_point, initialize = loader._get_class_entry_point(module)
        entry_point = self._enveloped(entry_point)

        class Metrics(MetricsCacheYamlImpl):  # type: ignore[misc]
            """TorchServe's metrics cache, reading its yaml without leaving the file open."""

            def _parse_yaml_file(self, config_file_path: str) -> None:
                import yaml

                with open(config_file_path, encoding="utf-8") as f:
                    self._parsed_file = yaml.safe_load(f)

        metrics = Metrics(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
        metrics.initialize_cache()
        service = Service(self.name, folder, self.manifest, entry_point, None, self.batch_size, True, metrics)
        service.set_cl_socket(self._socket)
        initialize(service.context)
        self.service = service

    def _enveloped(self, handle: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """``handle`` behind TorchServe's KServe envelope, for the batch's instance rows only."""

        def enveloped(data: Any, context: Any) -> Any:
            instances = self._instances
            if not instances or data is None:
                return handle(data, context)
            data = [row.get(BODY) if i in instances else row for i, row in enumerate(data)]
            results = handle(data, context)
            if isinstance(results, list):
                results = list(results)
                for i in instances:
                    if i < len(results):
                        context.set_response_content_type(i, "application/json")
                        results[i] = json.dumps(results[i], default=_plain)
            return results

        return enveloped

    def run(
        self,
        rows: list[Row],
        sink: ChunkSink | None = None,
        extra_headers: list[dict[str, str]] | None = None,
    ) -> list[Answer]:
        """Run one batch through ``Service.predict``; the answers, one per row, in order.

        ``sink`` receives intermediate answers the handler sends meanwhile. A failure of the whole
        batch raises ``HandlerFailed`` with TorchServe's message and code.
        """
        batch = []
        for i, row in enumerate(rows):
            headers = dict(row.headers)
            if extra_headers is not None:  # the sequence engine's word replaces the client's
                headers = {k: v for k, v in headers.items() if not k.lower().startswith(_SEQUENCE_PREFIX)}
                headers.update(extra_headers[i])
            batch.append(
                {
                    "requestId": row.request_id.encode(),
                    "parameters": [
                        {"name": name, "contentType": row.content_types.get(name), "value": value}
                        for name, value in row.data.items()
                    ],
                    "headers": [{"name": k.encode(), "value": str(v).encode()} for k, v in headers.items()],
                }
            )
        self._socket.sink = sink
        self._instances = frozenset(i for i, row in enumerate(rows) if row.instance)
        try:
            message = self.service.predict(batch)
        finally:
            self._socket.sink = None
            self._instances = frozenset()
        code, text, answers = decode_predict_response(bytes(message))
        if code != 200:
            raise HandlerFailed(text, code)
        if len(answers) != len(rows):
            raise HandlerFailed("number of batch response mismatched", 503)
        return answers
