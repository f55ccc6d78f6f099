"""Structured logs (``runtime.telemetry.logging``): one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from runtime.telemetry.logging import JsonFormatter


def _record(**fields: object) -> logging.LogRecord:
    return logging.makeLogRecord(
        {
            "name": "runtime.test",
            "levelname": "WARNING",
            "msg": "%s left",
            "args": ("m",),
            "created": 0.25,
            **fields,
        }
    )


def test_a_record_is_one_line_of_its_fields_and_its_extras() -> None:
    line = JsonFormatter().format(_record(model="m", path=Path("/a"), _private=1))
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "1970-01-01T00:00:00.250+00:00",
        "level": "WARNING",
        "logger": "runtime.test",
        "message": "m left",
        "model": "m",
        "path": "/a",  # what JSON cannot hold is written as its text
    }


def test_an_exception_and_a_stack_travel_inside_the_line() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        exc_info = sys.exc_info()
    document = json.loads(
        JsonFormatter().format(_record(exc_info=exc_info, stack_info="Stack (most recent call last)"))
    )
    assert document["exception"].startswith("Traceback") and "ValueError: broken" in document["exception"]
    assert document["stack"] == "Stack (most recent call last)"
    assert (
        json.loads(JsonFormatter().format(_record(exc_text="already formatted")))["exception"]
        == "already formatted"
    )
