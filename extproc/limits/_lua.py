"""Lua scripts of `RedisStore` (kept in Python so the wheel carries them without package-data rules).

ADMIT mirrors `_rules`: the same bucket refill, lease count and sliding-window estimate, the same
comparisons, so its decision equals `MemoryStore`'s. Floats cross the boundary as strings: Python's
repr and Lua's "%.17g" both round-trip a double exactly (a bare Lua number reply would be truncated
to an integer by Redis).

ADMIT
  KEYS: bucket per rate, lease set per concurrency limit, (current, previous) window per budget,
        then the pending-reservation marker when there are budgets, then the cancellation tombstone.
  ARGV: now, tokens, request_id, n_rates, n_conc, n_budgets, epsilon, force (1: take every dimension
        even if one refuses; the caller already admitted the request, see `extproc.limits.headroom`),
        per rate (rate, burst, ttl_ms), per concurrency limit (limit, lease_ttl_s, ttl_ms),
        per budget (limit, window_s, index, ttl_ms), then marker_ttl_ms.
  Reply: admitted (did every dimension allow it; with force it was taken anyway), per rate level,
         per concurrency limit (ok, live, earliest or ""),
         per budget (previous, current); or {-1} alone when the admission was cancelled already.

CANCEL (undo an admission the client gave up waiting for; it may have run, may run later, or never)
  KEYS: tombstone, lease set per concurrency limit, then (with budgets) marker and charged windows.
  ARGV: request_id, tombstone_ttl_ms, n_conc.
  Writes the tombstone (so a late ADMIT does nothing), removes the leases and, if the reservation
  was made, takes its tokens back out of the windows. Idempotent: a second CANCEL does nothing.

SETTLE
  KEYS: marker, then the charged window of each budget still counting.
  ARGV: actual tokens, then ttl_ms per window (used only if the window key has to be recreated).
  Reply: 1 if applied, 0 if there was no pending reservation.

CHARGE (tokens admitted while Redis was away, replayed by the failover layer once it is back)
  KEYS: window counters.
  ARGV: per window (tokens to add, negative to take back; ttl_ms if the key has to be recreated).
  Every counter stays >= 0. Reply: 1.
"""

from __future__ import annotations

__all__ = ["ADMIT", "CANCEL", "CHARGE", "SETTLE"]

# add(key, delta, ttl_ms): window counter += delta, never below 0; keeps the key's TTL, or sets ttl_ms
# when the key is new (or had expired).
_ADD = r"""
local function add(key, delta, ttl_ms)
  local v = tonumber(redis.call('GET', key) or '0') + delta
  if v < 0 then v = 0 end
  if redis.call('PTTL', key) > 0 then
    redis.call('SET', key, string.format('%d', v), 'KEEPTTL')
  else
    redis.call('SET', key, string.format('%d', v), 'PX', ttl_ms)
  end
end
"""

ADMIT = r"""
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return {-1} end
local now = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local rid = ARGV[3]
local nr, nc, nb = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local eps = tonumber(ARGV[7])
local force = ARGV[8] == '1'
local function fmt(x) return string.format('%.17g', x) end

local ok = true
local a = 9
local levels, stamps = {}, {}
for i = 1, nr do
  local rate, burst = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 3
  local held = redis.call('HMGET', KEYS[i], 't', 's')
  local level, stamp = burst, now
  if held[1] then
    local t, s = tonumber(held[1]), tonumber(held[2])
    if now <= s then
      level, stamp = t, s
    else
      level = math.min(burst, t + (now - s) * rate)
    end
  end
  levels[i], stamps[i] = level, stamp
  if level < 1 - eps then ok = false end
end

local leases_ok = {}
for j = 1, nc do
  local key = KEYS[nr + j]
  local limit = tonumber(ARGV[a + 3 * (j - 1)])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[1])
  local live = redis.call('ZCARD', key)
  leases_ok[j] = live < limit or redis.call('ZSCORE', key, rid) ~= false
  if not leases_ok[j] then ok = false end
end
local ac = a
a = a + 3 * nc

local wb = nr + nc
local windows = {}
for b = 1, nb do
  local limit, w, idx = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 4
  local cur = tonumber(redis.call('GET', KEYS[wb + 2 * b - 1]) or '0')
  local prev = tonumber(redis.call('GET', KEYS[wb + 2 * b]) or '0')
  windows[b] = {prev, cur}
  local estimate = prev * (1 - (now - idx * w) / w) + cur
  if tokens > limit or estimate + tokens > limit + eps then ok = false end
end

if ok or force then
  local ar = 9
  for i = 1, nr do
    redis.call('HSET', KEYS[i], 't', fmt(levels[i] - 1), 's', fmt(stamps[i]))
    redis.call('PEXPIRE', KEYS[i], ARGV[ar + 2])
    ar = ar + 3
  end
  for j = 1, nc do
    local key = KEYS[nr + j]
    local o = ac + 3 * (j - 1)
    redis.call('ZADD', key, fmt(now + tonumber(ARGV[o + 1])), rid)
    if redis.call('PTTL', key) < tonumber(ARGV[o + 2]) then redis.call('PEXPIRE', key, ARGV[o + 2]) end
  end
  local ab = ac + 3 * nc
  for b = 1, nb do
    local key = KEYS[wb + 2 * b - 1]
    redis.call('INCRBY', key, tokens)
    redis.call('PEXPIRE', key, ARGV[ab + 4 * (b - 1) + 3])
  end
  if nb > 0 then
    redis.call('SET', KEYS[wb + 2 * nb + 1], ARGV[2], 'PX', ARGV[a])
  end
end

local reply = {ok and 1 or 0}
for i = 1, nr do reply[#reply + 1] = fmt(levels[i]) end
for j = 1, nc do
  local key = KEYS[nr + j]
  reply[#reply + 1] = leases_ok[j] and 1 or 0
  reply[#reply + 1] = redis.call('ZCARD', key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  reply[#reply + 1] = first[2] or ''
end
for b = 1, nb do
  reply[#reply + 1] = windows[b][1]
  reply[#reply + 1] = windows[b][2]
end
return reply
"""

SETTLE = _ADD + r"""
local reserved = redis.call('GET', KEYS[1])
if not reserved then return 0 end
redis.call('DEL', KEYS[1])
local delta = tonumber(ARGV[1]) - tonumber(reserved)
for i = 2, #KEYS do add(KEYS[i], delta, ARGV[i]) end
return 1
"""

CHARGE = _ADD + r"""
for i = 1, #KEYS do add(KEYS[i], tonumber(ARGV[2 * i - 1]), ARGV[2 * i]) end
return 1
"""

CANCEL = r"""
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) then return 0 end
local nc = tonumber(ARGV[3])
for j = 1, nc do redis.call('ZREM', KEYS[1 + j], ARGV[1]) end
local m = 2 + nc
if KEYS[m] then
  local reserved = redis.call('GET', KEYS[m])
  if reserved then
    redis.call('DEL', KEYS[m])
    for k = m + 1, #KEYS do
      local cur = redis.call('GET', KEYS[k])
      if cur then
        local v = tonumber(cur) - tonumber(reserved)
        if v < 0 then v = 0 end
        redis.call('SET', KEYS[k], string.format('%d', v), 'KEEPTTL')
      end
    end
  end
end
return 1
"""
