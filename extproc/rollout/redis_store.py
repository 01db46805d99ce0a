"""`RedisRolloutStore`: rollout state shared by every replica and kept across restarts.

Keys (`prefix` defaults to "rollout:"):
    <prefix><model>              hash {v: version, s: state JSON}; written only by a CAS Lua script
    <prefix><model>:o:<epoch>    hash "<pool>|<counter>" -> number: the step's pooled outcome windows,
                                 expiring `outcomes_ttl_s` after the last write
Every call is off the request path (background refresh/analysis), bounded by `timeout_ms`; failures
raise `RolloutStoreUnavailable` and the controller keeps its cached weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from extproc.rollout.analysis import PoolWindow
from extproc.rollout.state import RolloutState, RolloutStoreUnavailable

__all__ = ["RedisRolloutStore"]

_T = TypeVar("_T")

# KEYS[1] state hash; ARGV: expected version, new version, state JSON.
_CAS = """
local current = redis.call('HGET', KEYS[1], 'v')
if (current and tonumber(current) or 0) ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 's', ARGV[3])
return 1
"""


class RedisRolloutStore:
    def __init__(self, url: str, *, prefix: str = "rollout:", timeout_ms: float = 1000.0,
                 outcomes_ttl_s: int = 7 * 86400) -> None:
        self._timeout_s = timeout_ms / 1000.0
        self._prefix = prefix
        self._ttl_s = outcomes_ttl_s
        self._redis = Redis.from_url(url, socket_timeout=self._timeout_s,
                                     socket_connect_timeout=self._timeout_s)
        self._cas = self._redis.register_script(_CAS)

    async def _call(self, operation: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await operation
        except (RedisError, OSError, TimeoutError) as exc:
            raise RolloutStoreUnavailable(f"rollout store: {exc or type(exc).__name__}") from exc

    def _key(self, model: str) -> str:
        return self._prefix + model

    async def load(self, model: str) -> RolloutState | None:
        raw = await self._call(self._redis.hget(self._key(model), "s"))
        return RolloutState.from_json(raw) if raw is not None else None

    async def save(self, state: RolloutState, expected_version: int) -> bool:
        done = await self._call(self._cas(keys=[self._key(state.model)],
                                          args=[expected_version, state.version, state.to_json()]))
        return bool(done)

    async def add_outcomes(self, model: str, epoch: int, windows: Mapping[str, PoolWindow]) -> None:
        key = f"{self._key(model)}:o:{epoch}"
        pipe = self._redis.pipeline(transaction=True)
        for pool, window in windows.items():
            for name, value in window.to_counters().items():
                if value:
                    pipe.hincrbyfloat(key, f"{pool}|{name}", value)
        pipe.expire(key, self._ttl_s)
        await self._call(pipe.execute())

    async def load_outcomes(self, model: str, epoch: int) -> dict[str, PoolWindow]:
        raw = await self._call(self._redis.hgetall(f"{self._key(model)}:o:{epoch}"))
        counters: dict[str, dict[str, float]] = {}
        for field, value in raw.items():
            text = field.decode() if isinstance(field, bytes) else field
            pool, _, name = text.rpartition("|")
            counters.setdefault(pool, {})[name] = float(value)
        return {pool: PoolWindow.from_counters(c) for pool, c in counters.items()}

    async def delete(self, model: str) -> None:
        """Forget a model's rollout state (tests, or an operator cleaning up a retired split)."""
        await self._call(self._redis.delete(self._key(model)))

    async def close(self) -> None:
        await self._redis.aclose()
