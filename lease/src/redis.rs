//! Leases in Redis (`redis://host:port[/db]`), shared by every gateway and lab script that reaches
//! the server. Every operation is one Lua script, so it is atomic on the server, and every time
//! is Redis's own (`TIME`, `PX`, `PTTL`), so clock skew between hosts does not matter.
//!
//! - An exclusive lease is the string `sm:lease:{NAME}` holding JSON (token, owner, fence, TTL,
//!   since), taken with `SET NX PX`; refresh and release compare the token first (Lua
//!   compare-and-set).
//! - A semaphore is the sorted set `sm:sem:{NAME}` (member: token, score: expiry in ms on Redis's
//!   `TIME`) beside the hash `sm:sem:{NAME}:holders` (token → JSON, with the `capacity` it was
//!   taken with: asking with other slots while it has holders is refused); every script first
//!   drops members whose score has passed.
//! - The fence is `INCR <key>:fence`, with a **floor**: this process remembers the highest fence
//!   it has seen per name and the acquire script sets the counter to at least floor + 1. So a
//!   Redis restart without persistence (this machine's Redis keeps nothing on disk) cannot
//!   make a fence go backwards for a gateway that kept running. What the floor cannot protect:
//!   a Redis restart while no process that saw the old fences is running (nobody remembers
//!   them), and a process that never saw the higher fences taking the name first after the
//!   restart (its fences restart low until a process with a higher floor acquires). Where that
//!   matters, run Redis with persistence (AOF `appendfsync always`) or use a SQL backend, whose
//!   rows keep the fence for the life of the name.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, Script};
use serde::Deserialize;

use crate::plan::duration_to_millis;
use crate::store::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseHolder, LeaseKind, LeaseStore, LeaseStoreError,
    LeaseToken,
};

/// How long connecting, and any one script, may take before it is an error.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

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

/// What an acquire script answered, before it is read as a holder.
#[derive(Debug, Deserialize)]
struct ScriptOutcome {
    outcome: String,
    /// With `conflict`: the semaphore's capacity in force.
    #[serde(default)]
    in_force: Option<f64>,
}

/// What every script answers about one holder (numbers as Lua sends them: doubles).
#[derive(Debug, Deserialize)]
struct ScriptHolder {
    outcome: String,
    #[serde(default)]
    token: Option<String>,
    owner: String,
    fence: f64,
    ttl: f64,
    since: f64,
    slot: f64,
    expires_in: f64,
}

fn whole(number: f64) -> u64 {
    if number.is_finite() && number > 0.0 {
        number.round() as u64
    } else {
        0
    }
}

impl ScriptHolder {
    fn grant(&self) -> LeaseGrant {
        LeaseGrant {
            token: LeaseToken::from_text(self.token.clone().unwrap_or_default()),
            owner: self.owner.clone(),
            fence: whole(self.fence),
            ttl: Duration::from_millis(whole(self.ttl)),
            expires_in: Duration::from_millis(whole(self.expires_in)),
            since: UNIX_EPOCH + Duration::from_millis(whole(self.since)),
            slot: u32::try_from(whole(self.slot)).unwrap_or(0),
        }
    }

    fn acquisition(&self) -> Result<Acquisition, LeaseStoreError> {
        match self.outcome.as_str() {
            "taken" => Ok(Acquisition::Taken(self.grant())),
            "renewed" => Ok(Acquisition::Renewed(self.grant())),
            "held" => Ok(Acquisition::HeldByOther(LeaseHolder::from(self.grant()))),
            other => Err(LeaseStoreError::Backend(format!(
                "Redis script answered an unknown outcome {other:?}"
            ))),
        }
    }
}

fn parse_holder(json: &str) -> Result<ScriptHolder, LeaseStoreError> {
    serde_json::from_str(json).map_err(|error| {
        LeaseStoreError::Backend(format!("Redis script answered unreadable JSON: {error}"))
    })
}

/// The Redis keys of one name.
struct Keys {
    main: String,
    holders: String,
    fence: String,
}

impl Keys {
    fn of(kind: LeaseKind, name: &str) -> Keys {
        let main = match kind {
            LeaseKind::Exclusive => format!("sm:lease:{{{name}}}"),
            LeaseKind::Semaphore { .. } => format!("sm:sem:{{{name}}}"),
        };
        Keys {
            holders: format!("{main}:holders"),
            fence: format!("{main}:fence"),
            main,
        }
    }

    /// The keys a script of `kind` takes, in order.
    fn for_script(&self, kind: LeaseKind, with_fence: bool) -> Vec<&str> {
        let mut keys = vec![self.main.as_str()];
        if kind.is_semaphore() {
            keys.push(&self.holders);
        }
        if with_fence {
            keys.push(&self.fence);
        }
        keys
    }
}

/// The scripts, loaded once (`EVALSHA`, falling back to `EVAL` after a Redis restart).
struct Scripts {
    lease_acquire: Script,
    lease_refresh: Script,
    lease_release: Script,
    lease_holders: Script,
    semaphore_acquire: Script,
    semaphore_refresh: Script,
    semaphore_release: Script,
    semaphore_holders: Script,
}

impl Scripts {
    fn new() -> Scripts {
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

/// Leases in one Redis database.
pub struct RedisLeaseStore {
    client: redis::Client,
    connection: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// The highest fence this process has seen per fence key: the floor of the next one.
    fence_floors: Mutex<HashMap<String, u64>>,
    scripts: Scripts,
}

impl std::fmt::Debug for RedisLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeaseStore")
            .field("server", &self.client.get_connection_info().addr())
            .finish()
    }
}

impl RedisLeaseStore {
    /// A store for `url`. Connects on first use, and again after the connection broke.
    pub fn new(url: &str) -> Result<RedisLeaseStore, LeaseStoreError> {
        let client = redis::Client::open(url).map_err(|error| LeaseStoreError::BadBackend {
            url: url.to_owned(),
            message: error.to_string(),
        })?;
        Ok(RedisLeaseStore {
            client,
            connection: tokio::sync::Mutex::new(None),
            fence_floors: Mutex::default(),
            scripts: Scripts::new(),
        })
    }

    async fn connection(&self) -> Result<MultiplexedConnection, LeaseStoreError> {
        let mut cached = self.connection.lock().await;
        if let Some(connection) = cached.as_ref() {
            return Ok(connection.clone());
        }
        let connection = tokio::time::timeout(
            OPERATION_TIMEOUT,
            self.client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| {
            LeaseStoreError::Unavailable(format!(
                "Redis could not be reached within {} s",
                OPERATION_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|error| redis_error(&error))?;
        *cached = Some(connection.clone());
        Ok(connection)
    }

    /// Runs `script`; a broken or silent connection is dropped so that the next call reconnects.
    async fn invoke<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<T, LeaseStoreError> {
        let mut connection = self.connection().await?;
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(arg.as_str());
        }
        match tokio::time::timeout(OPERATION_TIMEOUT, invocation.invoke_async(&mut connection))
            .await
        {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                if is_connection_trouble(&error) {
                    *self.connection.lock().await = None;
                }
                Err(redis_error(&error))
            }
            Err(_) => {
                *self.connection.lock().await = None;
                Err(LeaseStoreError::Unavailable(format!(
                    "Redis did not answer within {} s",
                    OPERATION_TIMEOUT.as_secs()
                )))
            }
        }
    }

    fn floor(&self, fence_key: &str) -> u64 {
        self.fence_floors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(fence_key)
            .copied()
            .unwrap_or(0)
    }

    fn saw_fence(&self, fence_key: &str, fence: u64) {
        let mut floors = self
            .fence_floors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let floor = floors.entry(fence_key.to_owned()).or_default();
        *floor = (*floor).max(fence);
    }

    fn scripts_of(&self, kind: LeaseKind) -> [&Script; 4] {
        let s = &self.scripts;
        if kind.is_semaphore() {
            [
                &s.semaphore_acquire,
                &s.semaphore_refresh,
                &s.semaphore_release,
                &s.semaphore_holders,
            ]
        } else {
            [
                &s.lease_acquire,
                &s.lease_refresh,
                &s.lease_release,
                &s.lease_holders,
            ]
        }
    }
}

fn is_connection_trouble(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || error.is_unrecoverable_error()
}

fn redis_error(error: &redis::RedisError) -> LeaseStoreError {
    if is_connection_trouble(error) {
        LeaseStoreError::Unavailable(format!("Redis: {error}"))
    } else {
        LeaseStoreError::Backend(format!("Redis: {error}"))
    }
}

fn ttl_arg(ttl: Option<Duration>) -> String {
    ttl.map(|ttl| duration_to_millis(ttl).to_string())
        .unwrap_or_default()
}

impl LeaseStore for RedisLeaseStore {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        Box::pin(async move {
            let keys = Keys::of(kind, name);
            let retry = request
                .retry_token
                .as_ref()
                .map(|token| token.as_str().to_owned())
                .unwrap_or_default();
            let args = [
                request.fresh_token().as_str().to_owned(),
                request.owner,
                duration_to_millis(request.ttl).max(1).to_string(),
                self.floor(&keys.fence).to_string(),
                kind.slots().to_string(),
                retry,
            ];
            let [acquire, ..] = self.scripts_of(kind);
            let answer: String = self
                .invoke(acquire, &keys.for_script(kind, true), &args)
                .await?;
            let outcome: ScriptOutcome = serde_json::from_str(&answer).map_err(|error| {
                LeaseStoreError::Backend(format!("Redis script answered unreadable JSON: {error}"))
            })?;
            if outcome.outcome == "conflict" {
                return Err(LeaseStoreError::CapacityConflict {
                    in_force: u32::try_from(whole(outcome.in_force.unwrap_or(0.0)))
                        .unwrap_or(u32::MAX),
                    asked: kind.slots(),
                });
            }
            let holder = parse_holder(&answer)?;
            self.saw_fence(&keys.fence, whole(holder.fence));
            holder.acquisition()
        })
    }

    fn refresh_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move {
            let keys = Keys::of(kind, name);
            let [_, refresh, ..] = self.scripts_of(kind);
            let args = [token.as_str().to_owned(), ttl_arg(ttl)];
            let answer: Option<String> = self
                .invoke(refresh, &keys.for_script(kind, false), &args)
                .await?;
            answer
                .map(|json| Ok(parse_holder(&json)?.grant()))
                .transpose()
        })
    }

    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>> {
        Box::pin(async move {
            let keys = Keys::of(kind, name);
            let [_, _, release, _] = self.scripts_of(kind);
            let ended: i64 = self
                .invoke(
                    release,
                    &keys.for_script(kind, false),
                    &[token.as_str().to_owned()],
                )
                .await?;
            Ok(ended == 1)
        })
    }

    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move {
            let keys = Keys::of(kind, name);
            let [.., holders] = self.scripts_of(kind);
            let answers: Vec<String> = self
                .invoke(holders, &keys.for_script(kind, false), &[])
                .await?;
            let mut grants = answers
                .iter()
                .map(|json| Ok(parse_holder(json)?.grant()))
                .collect::<Result<Vec<LeaseGrant>, LeaseStoreError>>()?;
            for grant in &grants {
                self.saw_fence(&keys.fence, grant.fence);
            }
            grants.sort_by_key(|grant| grant.slot);
            Ok(grants)
        })
    }
}
