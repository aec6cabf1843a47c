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

use self::scripts::Scripts;
use crate::store::plan::duration_to_millis;
use crate::store::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseHolder, LeaseKind, LeaseStore, LeaseStoreError,
    LeaseToken,
};

/// How long connecting, and any one script, may take before it is an error.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

mod scripts;

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
