"""A model's warm-up requests (``"warmup"`` in model-settings.json; Triton's ``model_warmup``).

Either a list of V2 inference request bodies, or the name of a file in the model's folder holding
one JSON request per line (blank lines skipped). The registry has the DataPlane serve them, in
order, through the model's scheduler after every load and before the model is READY; the first
one that fails fails the load, with its reason (``WarmupError``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from runtime.settings import ModelSettings
from runtime.types import InferenceRequest


class WarmupError(Exception):
    """A warm-up request could not be read, or failed: the load fails with this reason."""


def warmup_requests(settings: ModelSettings) -> list[InferenceRequest]:
    """The warm-up requests of a model, read afresh (a file is read at every load)."""
    given = settings.warmup
    if not given:
        return []
    if isinstance(given, str):
        return _from_file(settings, given)
    requests = []
    for number, body in enumerate(given, 1):
        try:
            requests.append(InferenceRequest.model_validate(body))
        except ValidationError as exc:
            raise WarmupError(
                f"warm-up request {number} is not an inference request: {_first(exc)}"
            ) from None
    return requests


def _from_file(settings: ModelSettings, name: str) -> list[InferenceRequest]:
    folder = settings.folder
    if folder is None:
        raise WarmupError(f"warm-up file {name!r}: the model has no folder")
    path = folder / name
    if not path.resolve().is_relative_to(folder.resolve()):
        raise WarmupError(f"warm-up file {name!r} lies outside the model's folder")
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise WarmupError(f"cannot read the warm-up file {name!r}: {exc.strerror or exc}") from None
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            requests.append(InferenceRequest.model_validate_json(line))
        except ValidationError as exc:
            raise WarmupError(f"{name} line {number} is not an inference request: {_first(exc)}") from None
    return requests


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", ""))
