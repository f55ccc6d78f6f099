"""A generation request's parameters, checked: what one stream of a text-generation model asks for.

The parameters come as request parameters (the OIP generate extension's, vLLM's names, and the
OpenAI API's, which its front end passes through): ``max_tokens``, ``min_tokens``,
``temperature`` (0: greedy), ``top_p``, ``top_k`` (0 or -1: off), ``seed``, ``stop`` (a string
or a list), ``stop_token_ids``, ``ignore_eos``, ``logprobs`` (the number of most likely tokens
to list with each token, or true), ``top_logprobs``, ``echo`` (the text answered starts with the
prompt) and ``details`` (OIP generate: the tokens and their log-probabilities in ``details``).
A bad value is refused with ``InvalidInput`` naming the parameter. This module imports neither
torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import InvalidInput

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """How one stream generates; defaults are greedy decoding up to the context's end."""

    max_tokens: int | None = None
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False
    details: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def read_options(parameters: Mapping[str, Any]) -> GenerationOptions:
    """The options that ``parameters`` (a request's parameters) ask for; InvalidInput if bad."""
    p = parameters
    max_tokens = _int(p, "max_tokens", None, minimum=1)
    min_tokens = _int(p, "min_tokens", 0, minimum=0)
    if max_tokens is not None and min_tokens is not None and min_tokens > max_tokens:
        raise InvalidInput(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})")
    temperature = _float(p, "temperature", 1.0)
    if not 0 <= temperature <= 100:
        raise InvalidInput(f"temperature must be between 0 and 100, got {temperature}")
    top_p = _float(p, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise InvalidInput(f"top_p must be in (0, 1], got {top_p}")
    top_k = _int(p, "top_k", 0, minimum=-1)
    n = _int(p, "n", 1, minimum=1)
    if n != 1:
        raise InvalidInput("n must be 1 for a stream of the model (the OpenAI API answers n > 1)")
    stop = p.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise InvalidInput("stop must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS or not all(stops):
        raise InvalidInput(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings")
    stop_ids = p.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) and t >= 0 for t in stop_ids):
        raise InvalidInput("stop_token_ids must be a list of token ids (integers >= 0)")
    logprobs, top = _logprobs(p)
    echo = _bool(p, "echo")
    if echo and logprobs:
        raise InvalidInput(
            "echo with logprobs is not served: the prompt's log-probabilities are not computed"
        )
    return GenerationOptions(
        max_tokens=max_tokens,
        min_tokens=min_tokens or 0,
        temperature=temperature,
        top_p=top_p,
        top_k=0 if top_k in (None, -1) else top_k,
        seed=_int(p, "seed", None, minimum=None),
        stop=stops,
        stop_token_ids=frozenset(stop_ids),
        ignore_eos=_bool(p, "ignore_eos"),
        logprobs=logprobs,
        top_logprobs=top,
        echo=echo,
        details=_bool(p, "details"),
    )


def _logprobs(p: Mapping[str, Any]) -> tuple[bool, int]:
    """(whether to report log-probabilities, how many most likely tokens to list with each)."""
    given = p.get("logprobs")
    top = _int(p, "top_logprobs", 0, minimum=0) or 0
    if given is None or given is False:
        if top:
            raise InvalidInput("top_logprobs needs logprobs")
        return False, 0
    if _is_int(given) and given >= 0:
        top = max(top, int(given))
    elif given is not True:
        raise InvalidInput(f"logprobs must be true, false or an integer >= 0, got {given!r}")
    if top > MAX_TOP_LOGPROBS:
        raise InvalidInput(f"top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {top}")
    return True, top


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(p: Mapping[str, Any], name: str, default: int | None, minimum: int | None) -> int | None:
    value = p.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise InvalidInput(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidInput(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _float(p: Mapping[str, Any], name: str, default: float) -> float:
    value = p.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{name} must be a number, got {value!r}")
    return float(value)


def _bool(p: Mapping[str, Any], name: str) -> bool:
    value = p.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be true or false, got {value!r}")
    return value
