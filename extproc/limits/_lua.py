"""Lua scripts of `RedisStore` (kept in Python so the wheel carries them without package-data rules).

ADMIT mirrors `_rules`: the same bucket refill, lease count and sliding-window estimate, the same
comparisons, so its decision equals `MemoryStore`'s. Floats cross the boundary as strings: Python's
repr and Lua's "%.17g" both round-trip a double exactly (a bare Lua number reply would be truncated
to an integer by Redis). Slices (`extproc.limits.slices`): each dimension has a hash of claims,
field = replica, value = "units expiry want"; other replicas' live claims count as used.

ADMIT
  KEYS: bucket per rate, lease set per concurrency limit, (current, previous) window per budget,
        claims hash per dimension (rates, concurrency, budgets), then the pending-reservation marker
        when there are budgets, then the cancellation tombstone.
  ARGV: now, tokens, request_id, n_rates, n_conc, n_budgets, epsilon, recorded (1: the replica admitted
        it from its slices: take every dimension and consume its claims), replica, slice_ttl_s,
        per rate (rate, burst, ttl_ms, want), per concurrency limit (limit, lease_ttl_s, ttl_ms, want),
        per budget (limit, window_s, index, ttl_ms, want), then marker_ttl_ms.
        want < 0: keep this replica's claim (it counts as used); want >= 0: replace it by a new slice
        of at most `want` units (0: give it back), granted only if the request is admitted.
  Reply (decided): admitted, per rate level, per concurrency limit (ok, live, earliest or ""), per
         budget (previous, current), per dimension (units claimed that the decision counted, units
         granted). Reply (recorded): 1, then per dimension 1 if this replica's claim covered it, else 0.
         {-1} alone when the admission was cancelled already.

CANCEL (undo an admission the client gave up waiting for; it may have run, may run later, or never)
  KEYS: tombstone, lease set per concurrency limit, then (with budgets) marker and charged windows.
  ARGV: request_id, tombstone_ttl_ms, n_conc.
  Writes the tombstone (so a late ADMIT does nothing), removes the leases and, if the reservation
  was made, takes its tokens back out of the windows. Idempotent: a second CANCEL does nothing.

SETTLE
  KEYS: marker, then the charged window of each budget still counting.
  ARGV: actual tokens, then ttl_ms per window (used only if the window key has to be recreated).
  Reply: 1 if applied, 0 if there was no pending reservation.
"""

from __future__ import annotations

__all__ = ["ADMIT", "CANCEL", "SETTLE"]

ADMIT = r"""
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return {-1} end
local now, tokens, rid, eps = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[7])
local nr, nc, nb = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local me, slice_ttl = ARGV[9], tonumber(ARGV[10])
local nd, wb, sl = nr + nc + nb, nr + nc, nr + nc + 2 * nb
local function fmt(x) return string.format('%.17g', x) end

-- per dimension: argument offset, cost, want
local at, cost, want = {}, {}, {}
local a = 11
for d = 1, nd do
  at[d] = a
  if d <= wb then want[d] = tonumber(ARGV[a + 3]); cost[d] = 1; a = a + 4
  else want[d] = tonumber(ARGV[a + 4]); cost[d] = tokens; a = a + 5 end
end

local levels, stamps = {}, {}
for i = 1, nr do
  local rate, burst = tonumber(ARGV[at[i]]), tonumber(ARGV[at[i] + 1])
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
end

local function take()
  for i = 1, nr do
    redis.call('HSET', KEYS[i], 't', fmt(levels[i] - 1), 's', fmt(stamps[i]))
    redis.call('PEXPIRE', KEYS[i], ARGV[at[i] + 2])
  end
  for j = 1, nc do
    local key, o = KEYS[nr + j], at[nr + j]
    redis.call('ZADD', key, fmt(now + tonumber(ARGV[o + 1])), rid)
    if redis.call('PTTL', key) < tonumber(ARGV[o + 2]) then redis.call('PEXPIRE', key, ARGV[o + 2]) end
  end
  for b = 1, nb do
    local key = KEYS[wb + 2 * b - 1]
    redis.call('INCRBY', key, tokens)
    redis.call('PEXPIRE', key, ARGV[at[wb + b] + 3])
  end
  if nb > 0 then redis.call('SET', KEYS[sl + nd + 1], ARGV[2], 'PX', ARGV[#ARGV]) end
end

if ARGV[8] == '1' then  -- recorded: admitted from this replica's slices; consume its claims
  take()
  local reply = {1}
  for d = 1, nd do
    local key, covered = KEYS[sl + d], 0
    local held = redis.call('HGET', key, me)
    if held then
      local u, e, x = string.match(held, '(%S+) (%S+) (%S+)')
      if tonumber(e) > now then
        u = tonumber(u) - cost[d]
        if u >= 0 then covered = 1 else u = 0 end
        redis.call('HSET', key, me, string.format('%d %s %s', u, e, x))
      end
    end
    reply[d + 1] = covered
  end
  return reply
end

-- decided here: other replicas' live claims count as used, and ours unless this call replaces it
local claimed, others, demand, own = {}, {}, {}, {}
for d = 1, nd do
  local key = KEYS[sl + d]
  local fields = redis.call('HGETALL', key)
  others[d], demand[d] = 0, 0
  for i = 1, #fields, 2 do
    local u, e, x = string.match(fields[i + 1], '(%S+) (%S+) (%S+)')
    u, e, x = tonumber(u), tonumber(e), tonumber(x)
    if e <= now then redis.call('HDEL', key, fields[i])
    elseif fields[i] == me then own[d] = u
    else others[d] = others[d] + u; demand[d] = demand[d] + x end
  end
  claimed[d] = others[d]
  if own[d] and want[d] < 0 then claimed[d] = claimed[d] + own[d] end
end

local ok = true
for i = 1, nr do
  if levels[i] - claimed[i] < 1 - eps then ok = false end
end
local leases_ok, live = {}, {}
for j = 1, nc do
  local key, d = KEYS[nr + j], nr + j
  redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[1])
  live[j] = redis.call('ZCARD', key)
  leases_ok[j] = live[j] + claimed[d] < tonumber(ARGV[at[d]]) or redis.call('ZSCORE', key, rid) ~= false
  if not leases_ok[j] then ok = false end
end
local windows, left = {}, {}
for b = 1, nb do
  local d = wb + b
  local limit, w, idx = tonumber(ARGV[at[d]]), tonumber(ARGV[at[d] + 1]), tonumber(ARGV[at[d] + 2])
  local cur = tonumber(redis.call('GET', KEYS[wb + 2 * b - 1]) or '0')
  local prev = tonumber(redis.call('GET', KEYS[wb + 2 * b]) or '0')
  windows[b] = {prev, cur}
  local estimate = prev * (1 - (now - idx * w) / w) + cur
  left[d] = limit - estimate - others[d]
  if tokens > limit or estimate + claimed[d] + tokens > limit + eps then ok = false end
end
if ok then take() end

-- slices: replace ours by at most half of what is left after this admission, split by demand
local granted = {}
for d = 1, nd do
  granted[d] = 0
  if want[d] >= 0 then
    if ok and want[d] > 0 then
      local avail
      if d <= nr then avail = levels[d] - 1 - others[d]
      elseif d <= wb then avail = tonumber(ARGV[at[d]]) - live[d - nr] - 1 - others[d]
      else avail = left[d] - tokens end
      local g = math.floor(math.min(want[d], avail * want[d] / (want[d] + demand[d]) / 2))
      if g >= 2 * math.max(1, cost[d]) then granted[d] = g end
    end
    local key = KEYS[sl + d]
    if granted[d] > 0 then
      redis.call('HSET', key, me, string.format('%d %s %s', granted[d], fmt(now + slice_ttl), fmt(want[d])))
      local ttl_ms = math.ceil(slice_ttl * 1000) + 1000
      if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
    elseif own[d] then
      redis.call('HDEL', key, me)
    end
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
for d = 1, nd do
  reply[#reply + 1] = fmt(claimed[d])
  reply[#reply + 1] = granted[d]
end
return reply
"""

SETTLE = r"""
local reserved = redis.call('GET', KEYS[1])
if not reserved then return 0 end
redis.call('DEL', KEYS[1])
local delta = tonumber(ARGV[1]) - tonumber(reserved)
for i = 2, #KEYS do  -- every counter stays >= 0; a counter that expired is created again with its ttl
  local v = math.max(0, tonumber(redis.call('GET', KEYS[i]) or '0') + delta)
  if redis.call('PTTL', KEYS[i]) > 0 then
    redis.call('SET', KEYS[i], string.format('%d', v), 'KEEPTTL')
  else
    redis.call('SET', KEYS[i], string.format('%d', v), 'PX', ARGV[i])
  end
end
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
