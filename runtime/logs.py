"""The server's logging set-up: one handler on stderr, or the user's dictConfig."""

from __future__ import annotations

import json
import logging
import logging.config
from pathlib import Path

from .settings import Settings

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
    handler.setFormatter(logging.Formatter(FORMAT))
    for name in ("runtime", "uvicorn", "uvicorn.error"):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level)
        log.propagate = False
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if settings.access_log else logging.WARNING)
