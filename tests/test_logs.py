"""The server's logging set-up (``runtime.logs``): one handler on stderr for the server's loggers,
text or JSON lines, the level from the settings (DEBUG with ``debug``), uvicorn's access log
quietened, or the user's dictConfig (inline or from a file) instead."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.logs import configure_logging
from runtime.settings import Settings

NAMES = ("runtime", "uvicorn", "uvicorn.error", "grpc", "opentelemetry", "uvicorn.access", "mine")


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """Each logger as it was before the test (configure_logging changes process-wide state)."""
    saved = {
        name: (list(log.handlers), log.level, log.propagate, log.disabled)
        for name, log in ((n, logging.getLogger(n)) for n in NAMES)
    }
    yield
    for name, (handlers, level, propagate, disabled) in saved.items():
        log = logging.getLogger(name)
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate
        log.disabled = disabled


def test_text_lines_on_stderr_at_the_level_asked(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(log_level="WARNING"))
    log = logging.getLogger("runtime.somewhere")
    log.info("not shown")
    log.warning("shown %d", 7)
    err = capsys.readouterr().err
    assert "not shown" not in err
    (line,) = err.splitlines()
    assert line.endswith("WARNING [runtime.somewhere] shown 7")
    for name in ("runtime", "uvicorn", "grpc"):
        assert len(logging.getLogger(name).handlers) == 1 and not logging.getLogger(name).propagate
    assert logging.getLogger("uvicorn.access").level == logging.WARNING


def test_debug_overrides_the_level(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(log_level="ERROR", debug=True))
    logging.getLogger("runtime.x").debug("a detail")
    assert "DEBUG [runtime.x] a detail" in capsys.readouterr().err


def test_structured_logging_writes_one_json_object_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(Settings(use_structured_logging=True))
    logging.getLogger("runtime.y").info("loaded %s", "m", extra={"model": "m"})
    (line,) = capsys.readouterr().err.splitlines()
    document: dict[str, Any] = json.loads(line)
    assert document["level"] == "INFO" and document["logger"] == "runtime.y"
    assert document["message"] == "loaded m" and document["model"] == "m"


def _config(path: str) -> dict[str, Any]:
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"bare": {"format": "CUSTOM %(name)s %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": path, "formatter": "bare"}},
        "loggers": {"mine": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }


def test_a_dict_config_replaces_the_default_set_up(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    runtime_handlers = list(logging.getLogger("runtime").handlers)
    configure_logging(Settings(logging_settings=_config(str(out))))
    logging.getLogger("mine").info("hello")
    for handler in logging.getLogger("mine").handlers:
        handler.close()
    assert out.read_text() == "CUSTOM mine hello\n"
    assert logging.getLogger("runtime").handlers == runtime_handlers  # the default set-up did not run


def test_a_dict_config_read_from_a_json_file(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    config = tmp_path / "logging.json"
    config.write_text(json.dumps(_config(str(out))))
    configure_logging(Settings(logging_settings=str(config)))
    logging.getLogger("mine").warning("from a file")
    for handler in logging.getLogger("mine").handlers:
        handler.close()
    assert out.read_text() == "CUSTOM mine from a file\n"
