"""Sequence states in Redis, shared by the replicas of a model (``sequence_store: "redis://host:port/db"``).

One Redis hash per sequence, under ``mlserver:seq:<model>:<version>:<sequence id>``, holds:

- ``state``: the model's state after the last applied step, pickled (binary; numpy arrays and
  tensors travel as their bytes, not as JSON);
- ``step``: how many steps were applied; ``answer``: the pickled answer of the last one when the
  client numbered it (``sequence_step``), so that a retry of it gets that answer again;
- ``owner``, ``token``, ``until``: the lease. ``owner`` is the replica applying the sequence's steps,
  ``until`` (Redis time, ms) when its lease expires, ``token`` the fencing token: it grows each time
  the sequence changes hands (or STARTs again), and every write checks it, so a replica that lost
  the sequence (its lease expired, another took over) cannot write it any more;
- ``ended``: the reason the sequence ended, once it did (the state is dropped then).

``last`` is when its last step was written. A sequence idle for ``max_sequence_idle_ms`` ends
(reason ``idle``): its replica records that; if that replica is gone, the next claim of it does.
An ended sequence's hash (the reason, the step count and the last answer, so that a retry of that
step still gets it) expires ``max_sequence_idle_ms`` after the ending (an hour when the idle timeout
is off), an open one's that long after it would have become idle. Claims and writes are Lua
scripts, so each is atomic: the claims of a batch are one script call (one round trip), and so are
its writes, whose values travel as one blob (``_WRITE``) rather than seven arguments per step.

The states are pickled: the Redis server is trusted infrastructure of the deployment (whoever can
write to it can run code in the replicas), as a model repository is.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import struct
import time
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from runtime.errors import Unavailable
from runtime.ids import new_secret_id
from runtime.sequences.state_pickle import dumps
from runtime.sequences.store import Claim, Commit, SharedStateStore

logger = logging.getLogger(__name__)

T = TypeVar("T")

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: the sequences; ARGV: owner, lease ms, idle ms (0: none), TTL ms of an open sequence's key,
# TTL ms of an ended one's, then per key: start ('1'/'0'), step (0: none)
_CLAIM = (
    _NOW
    + """
local owner, lease, idle, ttl, ended_ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function claim(key, start, step)
  local h = redis.call('HMGET', key, 'owner', 'token', 'until', 'ended', 'step', 'last')
  local holder, token, untl, ended = h[1], tonumber(h[2]) or 0, tonumber(h[3]) or 0, h[4]
  local done = tonumber(h[5]) or 0
  if h[2] and not ended and untl <= now and idle > 0 and now - (tonumber(h[6]) or now) >= idle then
    -- idle for longer than the idle timeout, its lease expired: it ended, as it would have there
    ended = 'idle'
    redis.call('HDEL', key, 'state', 'owner', 'until')
    redis.call('HSET', key, 'ended', ended)
    redis.call('PEXPIRE', key, ended_ttl)
    holder = nil
  end
  if h[2] and step > 0 and step == done then
    local answer = redis.call('HGET', key, 'answer')
    if answer then return {'replay', answer} end
  end
  if holder and holder ~= owner and untl > now then return {'busy', untl - now} end
  if start then
    token = token + 1
    redis.call('DEL', key)
    redis.call('HSET', key, 'owner', owner, 'token', token, 'until', now + lease, 'step', 0, 'last', now)
    if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
    return {'ok', token, false, 0}
  end
  if ended then return {'ended', ended, done} end
  if not h[2] then return {'none'} end
  if step > 0 and step ~= done + 1 then return {'conflict', done} end
  if holder ~= owner then token = token + 1 end
  redis.call('HSET', key, 'owner', owner, 'token', token, 'until', now + lease)
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
  return {'ok', token, redis.call('HGET', key, 'state') or false, done}
end
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = claim(key, ARGV[2 * i + 4] == '1', tonumber(ARGV[2 * i + 5]))
end
return out
"""
)

# KEYS: the sequences; ARGV: owner, lease ms, TTL ms of an open sequence's key, TTL ms of an ended
# one's, then one blob holding every key's write, in order (``_WRITE`` and its three byte strings:
# see ``RedisStateStore._write``): one argument for the batch, not seven per step, so that the
# client encodes a batch's call at the cost of one join. A key whose owner or token differ is not
# written (0).
_COMMIT = (
    _NOW
    + """
local owner, lease, ttl, ended_ttl, blob = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local function commit(key, token, step, flags, ended, state, answer)
  local h = redis.call('HMGET', key, 'owner', 'token')
  if h[1] ~= owner or tonumber(h[2]) ~= token then return 0 end
  local has_answer = flags % 2 == 1
  if ended ~= '' then
    if step >= 0 then
      redis.call('HSET', key, 'step', step)
      if has_answer then redis.call('HSET', key, 'answer', answer) else redis.call('HDEL', key, 'answer') end
    end
    redis.call('HDEL', key, 'state', 'owner', 'until')
    redis.call('HSET', key, 'ended', ended)
    if ended_ttl > 0 then redis.call('PEXPIRE', key, ended_ttl) end
    return 1
  end
  local held = lease
  if flags >= 2 then held = 0 end
  if step < 0 then
    redis.call('HSET', key, 'state', state, 'until', now + held, 'last', now)
  elseif has_answer then
    redis.call('HSET', key, 'step', step, 'answer', answer, 'state', state, 'until', now + held, 'last', now)
  else
    redis.call('HDEL', key, 'answer')
    redis.call('HSET', key, 'step', step, 'state', state, 'until', now + held, 'last', now)
  end
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
  return 1
end
local out = {}
local pos = 1
for i, key in ipairs(KEYS) do
  local token, step, flags, le, ls, la
  token, step, flags, le, ls, la, pos = struct.unpack('>i8i8BHI4I4', blob, pos)
  local ended = string.sub(blob, pos, pos + le - 1)
  pos = pos + le
  local state = string.sub(blob, pos, pos + ls - 1)
  pos = pos + ls
  local answer = string.sub(blob, pos, pos + la - 1)
  pos = pos + la
  out[i] = commit(key, token, step, flags, ended, state, answer)
end
return out
"""
)

_WRITE = struct.Struct(">qqBHII")
"""One key's write in the commit blob: fencing token, step count (-1: leave it and the answer),
flags (1: an answer follows, 2: free the lease), then the lengths of the ending's reason (empty: the
sequence goes on), the state and the answer, whose bytes follow in that order."""

# KEYS: the sequences; ARGV: owner, then each key's token
_RELEASE = """
local out = {}
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, 'owner', 'token')
  if h[1] == ARGV[1] and tonumber(h[2]) == tonumber(ARGV[i + 1]) then
    redis.call('HSET', key, 'until', 0)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

Write = tuple[str, int, str, int, bytes, bytes | None, bool]
"""One key's fenced write: key, token, ending reason ('' goes on), step count (-1 leaves it and the
answer), state, answer (None: none), whether to free the lease."""

LEASE_MARGIN = 0.8
"""Share of the lease this replica counts on: past it, a step claims the sequence again."""

ENDED_TTL_MS = 3_600_000
"""How long an ended sequence is remembered when the idle timeout is off."""


def connect(url: str) -> tuple[Any, type[Exception]]:
    """A client of the Redis at ``url`` (``redis://host:port/db``; it connects at its first call)
    and the error class its calls raise. The one place the server makes a Redis client: the
    sequence store and the response cache both come here."""
    import redis.asyncio as aioredis  # an optional dependency: pip install 'mlserver-like[redis]'
    from redis.exceptions import RedisError

    return aioredis.Redis.from_url(url), RedisError


async def reach(call: Awaitable[T], error: type[Exception], what: str) -> T:
    """Await a Redis call; Redis out of reach is a "try again later" (``Unavailable``, 503) that
    names ``what`` was unreachable, not a server fault."""
    try:
        return await call
    except (error, OSError) as exc:
        raise Unavailable(f"The {what} is unreachable: {type(exc).__name__}: {exc}") from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisStateStore(SharedStateStore):
    """The states of one model version's sequences in Redis; see the module docstring."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str | None,
        *,
        capacity: int,
        ttl_ms: int,
        lease_ms: int,
        replica: str | None = None,
    ) -> None:
        self.url = url
        self.capacity = capacity
        self.idle_ms = ttl_ms
        self.ended_ttl_ms = ttl_ms or ENDED_TTL_MS
        self.ttl_ms = ttl_ms + self.ended_ttl_ms if ttl_ms else 0
        """An open sequence's key outlives its idle timeout by as long as an ending is remembered:
        whichever replica sees it next records its idle ending (and can replay its last answer)."""
        self.lease_ms = lease_ms
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{new_secret_id()[:8]}"
        self.prefix = f"mlserver:seq:{model}:{version or ''}:"
        self.client, self._redis_error = connect(url)
        self._claim = self.client.register_script(_CLAIM)
        self._commit = self.client.register_script(_COMMIT)
        self._release = self.client.register_script(_RELEASE)
        self._held: dict[str, tuple[int, Any]] = {}
        """The sequences this replica holds: key -> (fencing token, last state)."""
        self._fresh: dict[str, float] = {}
        """Key -> (monotonic) time before which this replica's lease cannot have expired."""

    def _renewed(self, key: str, sent: float) -> None:
        # Redis set the lease after ``sent``; a margin covers clocks that run at other rates
        self._fresh[key] = sent + self.lease_ms * LEASE_MARGIN / 1000

    def holding(self, key: str) -> tuple[bool, Any]:
        held = self._held.get(key)
        deadline = self._fresh.get(key)
        if held is None or deadline is None or time.monotonic() >= deadline:
            return False, None
        return True, held[1]

    def key(self, key: str) -> str:
        return self.prefix + key

    # ------------------------------------------------------------------ the step protocol

    async def claim(self, items: Sequence[tuple[str, bool, int | None]]) -> list[Claim]:
        if not items:
            return []
        args: list[Any] = [self.replica, self.lease_ms, self.idle_ms, self.ttl_ms, self.ended_ttl_ms]
        for _key, start, step in items:
            args += (int(start), step or 0)
        sent = time.monotonic()
        replies = await self._run(self._claim, [self.key(key) for key, _, _ in items], args)
        claims: list[Claim] = []
        for (key, _start, _step), reply in zip(items, replies, strict=True):
            kind = _text(reply[0])
            if kind == "ok":
                state = pickle.loads(reply[2]) if reply[2] else None
                self._held[key] = (int(reply[1]), state)
                self._renewed(key, sent)
                claims.append(Claim("ok", state=state, done=int(reply[3])))
            elif kind == "replay":
                claims.append(Claim("replay", answer=pickle.loads(reply[1])))
            elif kind == "conflict":
                claims.append(Claim("conflict", done=int(reply[1])))
            elif kind == "busy":
                claims.append(Claim("busy", retry_ms=int(reply[1])))
            elif kind == "ended":
                self._forget(key)
                claims.append(Claim("ended", reason=_text(reply[1]), done=int(reply[2])))
            else:
                self._forget(key)
                claims.append(Claim("none"))
        return claims

    async def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """Call a script; Redis out of reach is a "try again later" (503), not a server fault."""
        return await reach(script(keys=keys, args=args), self._redis_error, "sequence state store")

    def _forget(self, key: str) -> Any:
        self._fresh.pop(key, None)
        held = self._held.pop(key, None)
        return held[1] if held is not None else None

    async def _write(self, writes: list[Write]) -> list[bool]:
        """One fenced write per key, all in one script call; whether each was written."""
        if not writes:
            return []
        pack = _WRITE.pack
        parts: list[bytes] = []
        for _key, token, ended, step, state, answer, release in writes:
            reason = ended.encode()
            flags = (answer is not None) | (release << 1)
            tail = answer or b""
            parts += (pack(token, step, flags, len(reason), len(state), len(tail)), reason, state, tail)
        args = [self.replica, self.lease_ms, self.ttl_ms, self.ended_ttl_ms, b"".join(parts)]
        replies = await self._run(self._commit, [self.prefix + write[0] for write in writes], args)
        return [bool(reply) for reply in replies]

    async def commit(self, items: Sequence[Commit]) -> list[bool]:
        writes: list[Write] = []
        held_now = self._held
        for item in items:
            held = held_now.get(item.key)
            if held is None:
                continue
            ended = item.ended or ""
            writes.append(
                (
                    item.key,
                    held[0],
                    ended,
                    -1 if item.step is None else item.step,
                    b"" if ended else dumps(item.state),
                    None if item.answer is None else dumps(item.answer),
                    item.release,
                )
            )
        sent = time.monotonic()
        outcome = dict(zip((write[0] for write in writes), await self._write(writes), strict=True))
        written: list[bool] = []
        for item in items:
            ok = outcome.get(item.key, False)
            written.append(ok)
            if ok and not item.ended:
                self._held[item.key] = (self._held[item.key][0], item.state)
                if item.release:
                    self._fresh.pop(item.key, None)
                else:
                    self._renewed(item.key, sent)
            else:
                self._forget(item.key)
        return written

    async def record_end(self, key: str, reason: str) -> bool:
        """Record an ending (best effort: with Redis out of reach the record expires with its TTL)."""
        held = self._held.get(key)
        if held is None:
            return False
        try:
            (written,) = await self._write([(key, held[0], reason, -1, b"", None, False)])
        except Unavailable as exc:
            logger.warning("Could not record that sequence %r ended (%s): %s", key, reason, exc)
            return False
        return written

    async def release(self, keys: Sequence[str]) -> None:
        """Release leases (best effort: with Redis out of reach they expire by themselves)."""
        held = [(key, self._held[key]) for key in keys if key in self._held]
        for key, _held in held:
            self._forget(key)
        if not held:
            return
        try:
            await self._run(
                self._release,
                [self.key(key) for key, _ in held],
                [self.replica, *(token for _, (token, _s) in held)],
            )
        except Unavailable as exc:
            logger.warning("Could not release %d sequence lease(s): %s", len(held), exc)

    # ------------------------------------------------------------------ StateStore (what this replica holds)

    async def load(self, keys: Sequence[str]) -> list[Any]:
        return [held[1] if (held := self._held.get(key)) is not None else None for key in keys]

    async def save(self, items: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Write states of held sequences (fenced), leaving their step counts as they are."""
        states = dict(items)
        writes: list[Write] = [
            (key, self._held[key][0], "", -1, dumps(state), None, False)
            for key, state in states.items()
            if key in self._held
        ]
        sent = time.monotonic()
        for (key, token, *_values), ok in zip(writes, await self._write(writes), strict=True):
            if ok:
                self._held[key] = (token, states[key])
                self._renewed(key, sent)
            else:
                self._forget(key)
        return []

    async def pop(self, key: str) -> Any:
        """Forget a sequence here (its record in Redis stays: ``record_end`` says how it ended)."""
        return self._forget(key)

    async def clear(self) -> list[tuple[str, Any]]:
        """Release every lease this replica holds (the states stay for another replica)."""
        items = [(key, state) for key, (_token, state) in self._held.items()]
        await self.release(list(self._held))
        return items

    def __len__(self) -> int:
        return len(self._held)

    async def close(self) -> None:
        await self.client.aclose()
