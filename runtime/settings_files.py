"""Reading settings files: JSON objects, sizes with units, and the keys no setting has.

Shared by the server's ``settings.json`` (``runtime.settings``) and a model's
``model-settings.json`` (``runtime.model_settings``): a misspelt key is warned about, naming the
closest field, instead of being ignored in silence.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

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


SIZE_FIELDS = frozenset({"models_memory_limit"})
"""Settings given in bytes that may be written with a unit ("512MiB"), in a file or as a flag."""


def parse_size(text: str) -> int:
    """Bytes from ``"512MiB"``, ``"4GiB"``, ``"800MB"``, ``"1.5G"`` or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: a number of bytes, or one with a unit (512MiB, 4GiB, 800MB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


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


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ValueError naming the file otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data
