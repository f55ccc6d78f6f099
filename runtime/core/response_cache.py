"""The response cache: answers of models with ``"response_cache": true``, kept to answer an equal
request again without calling the model.

The DataPlane asks it for every unary request of such a model, whatever the transport (REST and
gRPC share entries), after the request's checks and before the model is loaded or called. The key
is a digest of the model, its version, the inputs (names, datatypes, shapes, parameters and data
bytes), the requested outputs and the request's parameters; not the request id: a hit is answered
with the new request's id. Requests of a sequence (a ``sequence_id`` or sequence flag) are never
cached, nor are streams (the DataPlane does not ask for them) or errors (only answers are put).

Two stores behind one interface: ``memory`` (an LRU of ``response_cache_size`` answers in this
process, kept as objects) and ``redis://host:port/db`` (pickled answers under
``mlserver:cache:<model>:<version>:<digest>``, expiring after ``response_cache_ttl``, shared by
the replicas; the client comes from the sequence store's ``connect``). A reload of the model drops
its entries (the registry calls ``drop``). A Redis out of reach is a miss, logged, never a failure.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import pickle
from collections import OrderedDict
from typing import Any

import numpy as np
import orjson

from runtime.errors import Unavailable
from runtime.types import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)

SEQUENCE_PARAMETERS = frozenset(("sequence_id", "sequence_start", "sequence_end", "sequence_step"))
"""Request parameters that make a request a sequence step, which is never cached."""

Key = tuple[str, str]


def request_digest(request: InferenceRequest) -> str | None:
    """The digest of what decides a request's answer (its inputs already numpy arrays, as the
    DataPlane's checks leave them); None for a sequence step."""
    params = request.parameters.model_dump(exclude_none=True) if request.parameters is not None else {}
    if SEQUENCE_PARAMETERS.intersection(params):
        return None
    params.pop("headers", None)  # what the transport saw, not what the model is asked
    digest = hashlib.blake2b(digest_size=20)
    head: list[Any] = [params]
    for inp in request.inputs:
        own = inp.parameters.model_dump(exclude_none=True) or None if inp.parameters is not None else None
        head.append((inp.name, str(inp.datatype), list(inp.shape), own))
    head.append(
        [
            (out.name, out.parameters.model_dump(exclude_none=True) or None if out.parameters else None)
            for out in request.outputs or ()
        ]
    )
    digest.update(orjson.dumps(head, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str))
    for inp in request.inputs:
        _add_data(digest, inp.data)
    return digest.hexdigest()


def _add_data(digest: Any, data: Any) -> None:
    if isinstance(data, np.ndarray) and data.dtype != object:
        digest.update(b"\0a")
        digest.update(np.ascontiguousarray(data).data)
        return
    items = data.ravel().tolist() if isinstance(data, np.ndarray) else data
    digest.update(b"\0l")
    for item in items if isinstance(items, list) else [items]:
        raw = item if isinstance(item, (bytes, bytearray)) else str(item).encode()
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)


def answer_from(cached: InferenceResponse) -> InferenceResponse:
    """A copy of a cached answer that a request may own (its id is set by the DataPlane)."""
    copy = cached.model_copy()
    copy.__dict__["outputs"] = list(cached.outputs)
    copy.__dict__["id"] = None
    return copy


class ResponseCache(abc.ABC):
    """Cached answers by model version and request digest, with hits and misses per model."""

    def __init__(self) -> None:
        self.hits: dict[Key, int] = {}
        self.misses: dict[Key, int] = {}

    async def get(self, name: str, version: str | None, digest: str) -> InferenceResponse | None:
        key = (name, version or "")
        found = await self._get(key, digest)
        counts = self.misses if found is None else self.hits
        counts[key] = counts.get(key, 0) + 1
        return found

    @abc.abstractmethod
    async def _get(self, key: Key, digest: str) -> InferenceResponse | None: ...

    @abc.abstractmethod
    async def put(self, name: str, version: str | None, digest: str, response: InferenceResponse) -> None:
        """Keep an answer (only answers: errors are never put)."""

    @abc.abstractmethod
    async def drop(self, name: str, version: str | None) -> None:
        """Forget every answer of one model version (it was reloaded)."""

    async def close(self) -> None:
        """Let go of connections."""


class MemoryCache(ResponseCache):
    """An LRU of at most ``size`` answers in this process."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self._answers: OrderedDict[tuple[str, str, str], InferenceResponse] = OrderedDict()

    async def _get(self, key: Key, digest: str) -> InferenceResponse | None:
        full = (*key, digest)
        found = self._answers.get(full)
        if found is not None:
            self._answers.move_to_end(full)
        return found

    async def put(self, name: str, version: str | None, digest: str, response: InferenceResponse) -> None:
        self._answers[(name, version or "", digest)] = response
        if len(self._answers) > self.size:
            self._answers.popitem(last=False)

    async def drop(self, name: str, version: str | None) -> None:
        key = (name, version or "")
        for full in [k for k in self._answers if k[:2] == key]:
            del self._answers[full]

    def __len__(self) -> int:
        return len(self._answers)


class RedisCache(ResponseCache):
    """Pickled answers in Redis, shared by replicas, each expiring after ``ttl`` seconds."""

    def __init__(self, url: str, ttl: float) -> None:
        from runtime.sequences.redis_store import connect  # the one Redis client setup

        super().__init__()
        self.url = url
        self.ttl_ms = max(1, round(ttl * 1000))
        self.client, self._error = connect(url)

    @staticmethod
    def _prefix(key: Key) -> str:
        return f"mlserver:cache:{key[0]}:{key[1]}:"

    async def _call(self, call: Any) -> Any:
        from runtime.sequences.redis_store import reach

        return await reach(call, self._error, "response cache")

    async def _get(self, key: Key, digest: str) -> InferenceResponse | None:
        try:
            raw = await self._call(self.client.get(self._prefix(key) + digest))
        except Unavailable as exc:
            logger.warning("Response cache lookup missed: %s", exc)
            return None
        if raw is None:
            return None
        found = pickle.loads(raw)
        return found if isinstance(found, InferenceResponse) else None

    async def put(self, name: str, version: str | None, digest: str, response: InferenceResponse) -> None:
        from runtime.sequences.state_pickle import dumps

        key = self._prefix((name, version or "")) + digest
        try:
            await self._call(self.client.set(key, dumps(response), px=self.ttl_ms))
        except Unavailable as exc:
            logger.warning("Response not cached: %s", exc)

    async def drop(self, name: str, version: str | None) -> None:
        pattern = self._prefix((name, version or "")) + "*"
        try:
            keys = [key async for key in self.client.scan_iter(match=pattern, count=500)]
            if keys:
                await self._call(self.client.unlink(*keys))
        except (self._error, OSError, Unavailable) as exc:
            logger.warning("Cached responses of model %r not dropped (they expire): %s", name, exc)

    async def close(self) -> None:
        await self.client.aclose()


def make_cache(where: str, size: int, ttl: float) -> ResponseCache | None:
    """The cache the server setting ``response_cache`` names (None: off)."""
    if not where:
        return None
    if where == "memory":
        return MemoryCache(size)
    return RedisCache(where, ttl)
