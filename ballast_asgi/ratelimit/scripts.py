"""The Lua scripts the shared modes run on Redis (``EVALSHA``), one atomic step each.

Every script reads the time from Redis itself (``TIME``), so the gateways'
own clocks never have to agree. A bucket is one string key holding its
theoretical arrival time ``tat`` (seconds, Redis clock) with a ``PX`` expiry
at the moment it would be full again: an idle key costs no memory. The math
is ``core/gcra.py``'s, line for line. Floats go out as strings (Lua numbers
would be truncated to integers in the reply).
"""

from __future__ import annotations

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local T = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then tat = now end
local function store(v)
  if v > now then
    redis.call('SET', KEYS[1], string.format('%.6f', v), 'PX', math.ceil((v - now) * 1000) + 1)
  end
end
"""

#: GCRA for one request. ARGV: T, tau, cost. Reply: {allowed 0/1, debt_s}.
GCRA = (
    _PRELUDE
    + """
local new = tat + tonumber(ARGV[3]) * T
if new - now <= tau + 1e-9 then
  store(new)
  return {1, string.format('%.6f', new - now)}
end
return {0, string.format('%.6f', tat - now)}
"""
)

#: Demand body: record this gateway's recent rate for a key (``id`` -> ``rate:seen``) in the
#: hash ``hash`` (a negative rate records nothing: the gateway's estimate is too young to
#: divide a limit by), drop entries older than ``stale`` seconds, return the total rate over
#: the entries left and how many there are (the gateways that published demand for the key).
_DEMAND = """
local function demand(hash, id, rate, stale)
  if tonumber(rate) >= 0 then
    redis.call('HSET', hash, id, rate .. ':' .. string.format('%.6f', now))
    redis.call('PEXPIRE', hash, math.ceil(stale * 1000))
  end
  local total, live = 0, 0
  local all = redis.call('HGETALL', hash)
  for i = 1, #all, 2 do
    local sep = string.find(all[i + 1], ':', 1, true)
    local r = tonumber(string.sub(all[i + 1], 1, sep - 1))
    local seen = tonumber(string.sub(all[i + 1], sep + 1))
    if now - seen > stale then
      redis.call('HDEL', hash, all[i])
    else
      total = total + r
      live = live + 1
    end
  end
  return total, live
end
"""

#: GCRA for one request that also publishes this gateway's demand for the key (``redis`` mode,
#: a few times a second per key). KEYS[2]: the key's demand hash. ARGV: T, tau, cost, id,
#: requests/s, stale_s. Reply: {allowed 0/1, debt_s, total_demand, published}.
GCRA_DEMAND = (
    _PRELUDE
    + _DEMAND
    + """
local total, live = demand(KEYS[2], ARGV[4], ARGV[5], tonumber(ARGV[6]))
local new = tat + tonumber(ARGV[3]) * T
if new - now <= tau + 1e-9 then
  store(new)
  return {1, string.format('%.6f', new - now), string.format('%.6f', total), live}
end
return {0, string.format('%.6f', tat - now), string.format('%.6f', total), live}
"""
)

#: Heartbeat body: add gateway ``id`` to the sorted set ``set`` (scored by ``now``), drop the
#: members not seen for ``ttl`` seconds, reply with how many are left (the live gateways).
_BEAT = """
local function beat(set, id, ttl)
  redis.call('ZADD', set, now, id)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now - ttl)
  redis.call('PEXPIRE', set, math.ceil(ttl * 2000))
  return redis.call('ZCARD', set)
end
"""

#: Lease: take up to ARGV[3] whole tokens. With KEYS[2] (the heartbeat set) the call is also
#: this gateway's heartbeat (ARGV[4] id, ARGV[5] ttl_s), so a busy gateway needs no separate
#: heartbeat trip. Reply: {granted, debt_s, live (0 without KEYS[2])}.
LEASE = (
    _PRELUDE
    + _BEAT
    + """
local have = math.floor((tau - (tat - now)) / T + 1e-9)
local g = math.min(tonumber(ARGV[3]), have)
if g < 0 then g = 0 end
if g > 0 then
  tat = tat + g * T
  store(tat)
end
local live = 0
if KEYS[2] then live = beat(KEYS[2], ARGV[4], tonumber(ARGV[5])) end
return {g, string.format('%.6f', tat - now), live}
"""
)

#: Give back ARGV[3] unspent tokens (never below a full bucket). Reply: debt_s.
GIVE_BACK = (
    _PRELUDE
    + """
local back = tat - tonumber(ARGV[3]) * T
if back < now then back = now end
if back > now then store(back) else redis.call('DEL', KEYS[1]) end
return string.format('%.6f', back - now)
"""
)

#: Charge-back: ARGV[3] requests admitted alone since ARGV[4] seconds ago, never refused.
#: Reply: 1 if charged, 0 if the bucket had refilled meanwhile (expired).
CHARGE = (
    _PRELUDE
    + """
local since = now - tonumber(ARGV[4])
local stored = tonumber(redis.call('GET', KEYS[1]) or 0)
local base = stored
if since > base then base = since end
local charged = base + tonumber(ARGV[3]) * T
if charged > now and charged > stored then
  store(charged)
  return 1
end
return 0
"""
)

#: Sync: charge ARGV[3] requests admitted locally, publish this gateway's demand
#: (ARGV[4] id, ARGV[5] requests/s, negative: not yet; entries older than ARGV[6] s are dropped),
#: hand this gateway its part (ARGV[7], a share 0..1) of any excess over the
#: limit as debt; ARGV[8]: seconds since the last sync (the charged requests are spread
#: over it, so after an outage a bucket that refilled meanwhile is not charged twice).
#: KEYS[2] is the demand hash. Reply: {total_demand, live, debt_taken_s}.
SYNC = (
    _PRELUDE
    + _DEMAND
    + """
local since = now - tonumber(ARGV[8])
local stored = tonumber(redis.call('GET', KEYS[1]) or 0)
if since > stored then stored = since end
tat = stored + tonumber(ARGV[3]) * T
if tat < now then tat = now end
local total, live = demand(KEYS[2], ARGV[4], ARGV[5], tonumber(ARGV[6]))
local taken = 0
local excess = (tat - now) - tau
if excess > 0 then
  taken = excess * tonumber(ARGV[7])
  tat = tat - taken
end
store(tat)
return {string.format('%.6f', total), live, string.format('%.6f', taken)}
"""
)

#: Heartbeat: ZSET of gateway ids scored by last-seen time. ARGV: id, ttl_s. Reply: live count.
HEARTBEAT = (
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""
    + _BEAT
    + """
return beat(KEYS[1], ARGV[1], tonumber(ARGV[2]))
"""
)

#: Leave: remove this gateway from the heartbeat set at shutdown. ARGV: id.
LEAVE = "return redis.call('ZREM', KEYS[1], ARGV[1])"

SCRIPTS = {
    "gcra": GCRA,
    "gcra_demand": GCRA_DEMAND,
    "lease": LEASE,
    "give_back": GIVE_BACK,
    "charge": CHARGE,
    "sync": SYNC,
    "heartbeat": HEARTBEAT,
    "leave": LEAVE,
}
