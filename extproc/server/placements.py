"""Prefix placements shared between service replicas through Redis.

`prefix-affinity-scorer` learns where each prompt prefix was sent. Envoy spreads requests over the service
replicas, so without sharing each replica would learn only its own share and place the same prefix anew, on
an endpoint of its own choosing: the prefix would be cached (and prefilled) up to once per replica, and a
conversation's next turn, decided by another replica, would not find the endpoint holding its history.

Every `scheduling.placement_sync_ms` each replica appends what its plugins placed since the last exchange
(`SharedState.export_shared`: text lines per plugin name) to one Redis stream (`PLACEMENTS_KEY`, trimmed to
about `STREAM_LIMIT` entries) and reads, in the same script call, every entry after the last one it read;
entries of the other replicas go to the plugins of the same name (`import_shared`). With the in-flight exchange on
(`extproc.server.fleet`, the default with Redis) this call goes in the same write as its round (`carry`): one
system call and one reply read per round for both. Two replicas that place
a new prefix within one interval both keep their placements: the prefix then has two homes, which the
scorer spreads its requests over. A replica that starts reads the retained stream first (a batch per
interval), so it knows the fleet's recent placements. Nothing here runs on the request path; a failed
exchange is retried at the next interval with the placements it could not send (not the request lines below,
whose age was fixed at export: after an outage they would replay as fresh). Each exchange also tells the
plugins this replica's index among the live replicas (from the in-flight exchange, when it runs), so that they
can divide work between the replicas (`SharedState.replica_slot`).

The scorer also sends a line per request it routed, which the others replay (`extproc.scheduling.prefix_sent`):
by default pushed as it is routed (`extproc.server.request_push`, which this exchange tells the plugins and the
Redis server's clock), else with the next exchange. The prefill backlog a second home is chosen by is younger than
50 ms: on the exchange, 3 replicas at uniform 80% in virtual time had TTFT p90 48.8 ms every 10 ms and 50.3 every
50, one replica 46.1 (reports/i15-s16/mirror); pushed, within 1% of one replica (reports/i15-s17/vt). Each line's
age travels with it: its age at export plus its entry's age on the Redis server's clock.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from extproc.limits.cluster import RedisClient
from extproc.limits.resp import Script, ScriptCall
from extproc.scheduling import Scheduler
from extproc.server.fleet import ReplicaExchange, replica_name
from extproc.server.request_push import RequestPush

__all__ = ["PLACEMENTS_KEY", "STREAM_LIMIT", "PlacementSync"]

_log = logging.getLogger(__name__)

PLACEMENTS_KEY = "sched:placements"
STREAM_LIMIT = 20_000  # entries kept (approximately): a starting replica reads at most this many
_READ_BATCH = 500  # entries read per exchange
_SEND_LIMIT = 2_000  # lines sent per exchange per plugin (older ones beyond it are dropped)
_KEY_TTL_MS = 3_600_000  # the stream expires an hour after the last replica stopped writing

# KEYS[1] the stream; ARGV: replica id, payload ('' = nothing to add), trim length, cursor, batch, TTL ms.
# Returns {last id read or the cursor, server time ms, id, replica, payload, id, replica, payload, ...}: an entry's
# id starts with the server time it was added at, so its age needs no agreement between the replicas' clocks.
# XRANGE is inclusive of the cursor, so the entry equal to it (already read) is skipped.
_EXCHANGE = Script(r"""
if ARGV[2] ~= '' then
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'r', ARGV[1], 'p', ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
local entries = redis.call('XRANGE', KEYS[1], ARGV[4], '+', 'COUNT', tonumber(ARGV[5]) + 1)
local time = redis.call('TIME')
local out = {ARGV[4], tostring(tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))}
for _, entry in ipairs(entries) do
  if entry[1] ~= ARGV[4] then
    local fields = entry[2]
    local replica, payload = '', ''
    for i = 1, #fields, 2 do
      if fields[i] == 'r' then replica = fields[i + 1] elseif fields[i] == 'p' then payload = fields[i + 1] end
    end
    out[#out + 1] = entry[1]
    out[#out + 1] = replica
    out[#out + 1] = payload
  end
end
if #out > 2 then out[1] = out[#out - 2] end
return out
""")


class PlacementSync(ReplicaExchange):
    SCRIPTS = (_EXCHANGE,)
    WHAT = "prefix placement sync"

    def __init__(self, client: RedisClient, scheduler: Callable[[], Scheduler], interval_s: float, *,
                 replica_id: str | None = None, slot: Callable[[], tuple[int, int]] | None = None,
                 clock: Callable[[], float] = time.monotonic, push: RequestPush | None = None) -> None:
        """`slot`: this replica's index among the live replicas and their number (`FleetSync.slot`), told to the
        plugins every exchange (`SharedState.replica_slot`); without it they place as if alone. `clock`: the
        scheduling clock (`SchedulingRequest.now`'s). `push`: sends the plugins' request lines as they come (else
        they go with the next exchange); this exchange tells it the plugins and the Redis server's clock."""
        super().__init__(client, interval_s)
        self._clock = clock
        self._scheduler = scheduler  # the current one: a policy reload replaces it (and its plugins' state)
        self._slot = slot
        self.replica_id = replica_id or replica_name()
        self._cursor = "0-0"
        self._unsent: dict[str, list[str]] = {}  # placements a failed exchange could not send
        self.push = push
        self._sending = 0  # lines in the script call of the round in progress
        self.sent_lines = 0
        self.learned_lines = 0

    async def start(self) -> None:
        await super().start()
        if self.push is not None:
            self.push.attach(self._scheduler().shared())
            await self.push.start()

    async def stop(self) -> None:
        if self.push is not None:
            await self.push.stop()
        await super().stop()

    def request(self) -> ScriptCall:
        """Append what the plugins placed since the last exchange; read the entries after the last one read."""
        slot = self._slot() if self._slot is not None else None
        plugins, now = self._scheduler().shared(), self._clock()
        if self.push is not None:
            self.push.attach(plugins)
        sent: dict[str, list[str]] = {}
        for name, source in plugins.items():
            if slot is not None:
                source.replica_slot(*slot)
            lines = self._unsent.setdefault(name, [])
            lines += source.export_shared(now)
            del lines[: max(0, len(lines) - _SEND_LIMIT)]
            # Request lines go with this exchange when not pushed, and are never kept for the next one (their age
            # is fixed at export: after an outage they would replay as fresh).
            sent[name] = lines + (source.export_perishable(now) if self.push is None else [])
        sent = {name: lines for name, lines in sent.items() if lines}
        self._sending = sum(len(lines) for lines in sent.values())
        payload = json.dumps(sent, separators=(",", ":")) if sent else ""
        return _EXCHANGE, [PLACEMENTS_KEY], [
            self.replica_id, payload, STREAM_LIMIT, self._cursor, _READ_BATCH, _KEY_TTL_MS]

    def settle(self, reply: Any) -> None:
        """The placements sent are kept; the other replicas' entries go to the plugins of the same name."""
        self.sent_lines += self._sending
        self._unsent = {}
        self._cursor = reply[0].decode()
        server_ms, now = int(reply[1]), self._clock()
        if self.push is not None:
            self.push.server_offset_s = server_ms / 1000.0 - now
        plugins = self._scheduler().shared()
        for i in range(2, len(reply) - 2, 3):
            if reply[i + 1].decode() == self.replica_id:
                continue
            age_s = max(0.0, server_ms - int(reply[i].decode().partition("-")[0])) / 1000.0
            try:
                placed = json.loads(reply[i + 2])
            except ValueError:
                _log.debug("ignoring malformed placement entry %s", reply[i])
                continue
            if not isinstance(placed, dict):
                continue
            for name, lines in placed.items():
                target = plugins.get(name)
                if target is not None and isinstance(lines, list):
                    self.learned_lines += target.import_shared([x for x in lines if isinstance(x, str)], now,
                                                               age_s)

