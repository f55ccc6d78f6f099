"""Structured logs: one JSON object per line (``use_structured_logging``)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import orjson

# attributes every LogRecord has; anything else on a record came in ``extra=`` and is a field
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extra fields, "exception"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(document, default=str).decode()
