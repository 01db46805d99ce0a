"""`RedisRolloutStore`: rollout state shared by every replica and kept across restarts.

Keys (`prefix` defaults to "rollout:"):
    <prefix><model>              hash {v: version, s: state JSON}; written only by a CAS Lua script
    <prefix><model>:o:<epoch>    hash "<pool>|<counter>" -> number: the step's pooled outcome windows,
                                 expiring `outcomes_ttl_s` after the last write
It talks through the service's one Redis client (`extproc.limits.resp`, or `extproc.limits.cluster` for a Redis
Cluster: every command names one key), with the policy's credentials and TLS. Every call is off the request path
(background refresh/analysis), bounded by `timeout_ms`; failures raise `RolloutStoreUnavailable` and the
controller keeps its cached weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extproc.limits.cluster import RedisClient, redis_client
from extproc.limits.redis_address import RedisTls
from extproc.limits.resp import Arg, Script
from extproc.limits.types import StoreUnavailable
from extproc.rollout.analysis import PoolWindow
from extproc.rollout.state import RolloutState, RolloutStoreUnavailable

__all__ = ["RedisRolloutStore"]

# KEYS[1] state hash; ARGV: expected version, new version, state JSON.
_CAS = Script("""
local current = redis.call('HGET', KEYS[1], 'v')
if (current and tonumber(current) or 0) ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 's', ARGV[3])
return 1
""")
# KEYS[1] outcome hash; ARGV: TTL seconds, then field, increment pairs. One script: all counters or none.
_ADD = Script("""
for i = 2, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
""")


class RedisRolloutStore:
    SCRIPTS = (_CAS, _ADD)

    def __init__(self, url: str, *, prefix: str = "rollout:", timeout_ms: float = 1000.0,
                 outcomes_ttl_s: int = 7 * 86400, cluster: bool = False, tls: RedisTls | None = None) -> None:
        self._prefix = prefix
        self._ttl_s = outcomes_ttl_s
        self._client: RedisClient = redis_client(url, cluster=cluster, timeout_s=timeout_ms / 1000.0,
                                                 scripts=self.SCRIPTS, tls=tls)

    def _key(self, model: str) -> str:
        return self._prefix + model

    async def _call(self, *args: Arg) -> Any:
        try:
            return await self._client.call(*args)
        except StoreUnavailable as exc:
            raise RolloutStoreUnavailable(f"rollout store: {exc}") from exc

    async def _script(self, script: Script, key: str, args: list[Arg]) -> Any:
        try:
            return await self._client.evalsha(script, [key], args)
        except StoreUnavailable as exc:
            raise RolloutStoreUnavailable(f"rollout store: {exc}") from exc

    async def load(self, model: str) -> RolloutState | None:
        raw = await self._call("HGET", self._key(model), "s")
        return RolloutState.from_json(raw) if raw is not None else None

    async def save(self, state: RolloutState, expected_version: int) -> bool:
        done = await self._script(_CAS, self._key(state.model), [expected_version, state.version, state.to_json()])
        return bool(done)

    async def add_outcomes(self, model: str, epoch: int, windows: Mapping[str, PoolWindow]) -> None:
        increments: list[Arg] = []
        for pool, window in windows.items():
            for name, value in window.to_counters().items():
                if value:
                    increments += [f"{pool}|{name}", repr(float(value))]
        if increments:
            await self._script(_ADD, f"{self._key(model)}:o:{epoch}", [self._ttl_s, *increments])

    async def load_outcomes(self, model: str, epoch: int) -> dict[str, PoolWindow]:
        raw = await self._call("HGETALL", f"{self._key(model)}:o:{epoch}")
        counters: dict[str, dict[str, float]] = {}
        for i in range(0, len(raw) - 1, 2):
            pool, _, name = raw[i].decode().rpartition("|")
            counters.setdefault(pool, {})[name] = float(raw[i + 1])
        return {pool: PoolWindow.from_counters(c) for pool, c in counters.items()}

    async def delete(self, model: str) -> None:
        """Forget a model's rollout state (tests, or an operator cleaning up a retired split)."""
        await self._call("DEL", self._key(model))

    async def close(self) -> None:
        await self._client.close()
