"""The server's logging set-up: one handler on stderr (text, or JSON lines with
``use_structured_logging``), or the user's dictConfig."""

from __future__ import annotations

import json
import logging
import logging.config
from pathlib import Path

from runtime.settings import Settings

FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"


def configure_logging(settings: Settings) -> None:
    level = "DEBUG" if settings.debug else settings.log_level
    config = settings.logging_settings
    if isinstance(config, str):
        config = json.loads(Path(config).read_text())
    if isinstance(config, dict):
        logging.config.dictConfig(config)
        return
    handler = logging.StreamHandler()
    if settings.use_structured_logging:
        from runtime.telemetry.logging import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(FORMAT))
    for name in ("runtime", "uvicorn", "uvicorn.error", "grpc", "opentelemetry"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level)
        log.propagate = False
    # the access log is the server's own (runtime.access: REST, gRPC and streams), not uvicorn's
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
