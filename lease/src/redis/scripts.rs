//! The Lua scripts of the Redis lease store, one per operation and kind, and [`Scripts`], which
//! loads them once. Key and argument layouts are documented on each script.

use redis::Script;

/// Redis's clock in ms, and `keep_until_last()`: semaphore keys live as long as their last
/// holder (plus a second), never forever.
const SEMAPHORE_PRELUDE: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, gone in ipairs(expired) do redis.call('HDEL', KEYS[2], gone) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local function keep_until_last()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
    redis.call('PEXPIREAT', KEYS[2], tonumber(last[2]) + 1000)
  end
end
";

/// The next fence from `INCR KEYS[fence_key]`, never at or below the floor in ARGV[4].
const NEXT_FENCE: &str = r"
local function next_fence(fence_key)
  local fence = redis.call('INCR', fence_key)
  local floor = tonumber(ARGV[4])
  if fence <= floor then
    fence = floor + 1
    redis.call('SET', fence_key, fence)
  end
  return fence
end
";

/// KEYS: lease, fence. ARGV: fresh token, owner, ttl_ms, floor, slots (unused), retry token or
/// ''. The fresh token (128 random bits) is the one a lease taken anew gets; either renews the
/// lease it holds.
const LEASE_ACQUIRE: &str = r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local token, owner, ttl, retry = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[6]
local current = redis.call('GET', KEYS[1])
if current then
  local held = cjson.decode(current)
  if held.token == token or (retry ~= '' and held.token == retry) then
    held.ttl = ttl
    held.owner = owner
    redis.call('SET', KEYS[1], cjson.encode(held), 'PX', ttl)
    held.outcome = 'renewed'
    held.expires_in = ttl
    return cjson.encode(held)
  end
  held.outcome = 'held'
  held.expires_in = redis.call('PTTL', KEYS[1])
  held.token = nil
  return cjson.encode(held)
end
local held = {token = token, owner = owner, fence = next_fence(KEYS[2]), ttl = ttl, since = now, slot = 0}
if not redis.call('SET', KEYS[1], cjson.encode(held), 'NX', 'PX', ttl) then
  return redis.error_reply('SET NX refused a key this script saw empty')
end
held.outcome = 'taken'
held.expires_in = ttl
return cjson.encode(held)
";

/// KEYS: lease. ARGV: token, ttl_ms or ''.
const LEASE_REFRESH: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then return false end
local held = cjson.decode(current)
if held.token ~= ARGV[1] then return false end
if ARGV[2] ~= '' then held.ttl = tonumber(ARGV[2]) end
redis.call('SET', KEYS[1], cjson.encode(held), 'PX', held.ttl)
held.outcome = 'renewed'
held.expires_in = held.ttl
return cjson.encode(held)
";

/// KEYS: lease. ARGV: token.
const LEASE_RELEASE: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
if cjson.decode(current).token ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// KEYS: lease.
const LEASE_HOLDERS: &str = r"
local current = redis.call('GET', KEYS[1])
if not current then return {} end
local held = cjson.decode(current)
held.outcome = 'held'
held.expires_in = redis.call('PTTL', KEYS[1])
return {cjson.encode(held)}
";

/// KEYS: zset, holders, fence. ARGV: fresh token, owner, ttl_ms, floor, slots, retry token or
/// '' (as for a lease).
const SEMAPHORE_ACQUIRE: &str = r"
local token, owner, ttl, slots = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])
local retry = ARGV[6]
local everyone = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, member in ipairs(everyone) do
  local found = redis.call('HGET', KEYS[2], member)
  if found then
    local capacity = cjson.decode(found).capacity
    if capacity and capacity > 0 and capacity ~= slots then
      return cjson.encode({outcome = 'conflict', in_force = capacity})
    end
  end
end
local own = token
if retry ~= '' and redis.call('ZSCORE', KEYS[1], retry) then own = retry end
local mine = redis.call('HGET', KEYS[2], own)
if mine and redis.call('ZSCORE', KEYS[1], own) then
  local held = cjson.decode(mine)
  held.ttl = ttl
  held.owner = owner
  redis.call('ZADD', KEYS[1], now + ttl, own)
  redis.call('HSET', KEYS[2], own, cjson.encode(held))
  keep_until_last()
  held.outcome = 'renewed'
  held.expires_in = ttl
  return cjson.encode(held)
end
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local used, count, soonest = {}, 0, nil
for i = 1, #live, 2 do
  local found = redis.call('HGET', KEYS[2], live[i])
  if found then
    local other = cjson.decode(found)
    used[other.slot] = true
    count = count + 1
    if not soonest then
      soonest = other
      soonest.expires_in = tonumber(live[i + 1]) - now
    end
  end
end
local slot = nil
if count < slots then
  for s = 0, slots - 1 do
    if not used[s] then slot = s break end
  end
end
if not slot then
  if not soonest then return redis.error_reply('semaphore full without a holder') end
  soonest.outcome = 'held'
  soonest.token = nil
  return cjson.encode(soonest)
end
local held = {token = token, owner = owner, fence = next_fence(KEYS[3]), ttl = ttl, since = now, slot = slot, capacity = slots}
redis.call('ZADD', KEYS[1], now + ttl, token)
redis.call('HSET', KEYS[2], token, cjson.encode(held))
keep_until_last()
held.outcome = 'taken'
held.expires_in = ttl
return cjson.encode(held)
";

/// KEYS: zset, holders. ARGV: token, ttl_ms or ''.
const SEMAPHORE_REFRESH: &str = r"
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return false end
local found = redis.call('HGET', KEYS[2], ARGV[1])
if not found then return false end
local held = cjson.decode(found)
if ARGV[2] ~= '' then held.ttl = tonumber(ARGV[2]) end
redis.call('ZADD', KEYS[1], now + held.ttl, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(held))
keep_until_last()
held.outcome = 'renewed'
held.expires_in = held.ttl
return cjson.encode(held)
";

/// KEYS: zset, holders. ARGV: token.
const SEMAPHORE_RELEASE: &str = r"
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
";

/// KEYS: zset, holders.
const SEMAPHORE_HOLDERS: &str = r"
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local answer = {}
for i = 1, #live, 2 do
  local found = redis.call('HGET', KEYS[2], live[i])
  if found then
    local held = cjson.decode(found)
    held.outcome = 'held'
    held.expires_in = tonumber(live[i + 1]) - now
    table.insert(answer, cjson.encode(held))
  end
end
return answer
";

/// The scripts, loaded once (`EVALSHA`, falling back to `EVAL` after a Redis restart).
pub(super) struct Scripts {
    pub(super) lease_acquire: Script,
    pub(super) lease_refresh: Script,
    pub(super) lease_release: Script,
    pub(super) lease_holders: Script,
    pub(super) semaphore_acquire: Script,
    pub(super) semaphore_refresh: Script,
    pub(super) semaphore_release: Script,
    pub(super) semaphore_holders: Script,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        let semaphore = |body: &str| Script::new(&format!("{SEMAPHORE_PRELUDE}{NEXT_FENCE}{body}"));
        Scripts {
            lease_acquire: Script::new(&format!("{NEXT_FENCE}{LEASE_ACQUIRE}")),
            lease_refresh: Script::new(LEASE_REFRESH),
            lease_release: Script::new(LEASE_RELEASE),
            lease_holders: Script::new(LEASE_HOLDERS),
            semaphore_acquire: semaphore(SEMAPHORE_ACQUIRE),
            semaphore_refresh: semaphore(SEMAPHORE_REFRESH),
            semaphore_release: semaphore(SEMAPHORE_RELEASE),
            semaphore_holders: semaphore(SEMAPHORE_HOLDERS),
        }
    }
}
