//! Named leases and semaphores for lab scripts, outside the REST contract's `api/`:
//! `{prefix}/v1/leases/{name}` and `{prefix}/v1/semaphores/{name}?slots=N`, on the configured
//! lease backend (so several gateways on one Postgres or Redis share them).
//!
//! - `POST` `{ttlMs, owner?, waitMs?}` → 200 `{token, fence, expiresInMs, owner, slot?}`, 409
//!   while held (every slot taken). The token is always the server's (128 random bits). With
//!   the header `X-Lease-Token` it gets back the lease that token holds (a retry of the same
//!   job) instead of being refused; a token that holds nothing is ignored. A semaphore's
//!   `slots` is fixed by its holders while it has any: other slots are a 409 naming it.
//! - `PUT` with `X-Lease-Token`, `{ttlMs?}` → 200 renewed from now; 404 once it ended.
//! - `DELETE` with `X-Lease-Token` → 200; 404 once it ended.
//! - `GET` → who holds it, time left and fence; never the token.
//!
//! Names are kept apart in the store as `lease:NAME` and `semaphore:NAME`, so no script can
//! reach the gateway's control lease (`control:...`) through here.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::http::request::Parts;
use hyper::{Method, Response};
use serde_json::{Value as Json, json};

use super::allow::Allowed;
use super::body::media_type::{self, MediaType};
use super::body::{JsonBody, Whole, read_body};
use super::reply::{Body, error_response, json_response};
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;
use crate::lease::engine::{FIRST_BACKOFF, MAX_BACKOFF};
use crate::lease::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseHolder, LeaseKind, LeaseStoreError, LeaseToken,
    MAX_WAIT, millis,
};
use crate::requests::lease::{NamedLeaseAcquireRequest, NamedLeaseRenewRequest};

/// The header that carries a named lease's token.
pub const LEASE_TOKEN_HEADER: &str = "x-lease-token";
/// Shortest and longest `ttlMs` of a named lease.
pub const MIN_NAMED_TTL: Duration = Duration::from_millis(100);
pub const MAX_NAMED_TTL: Duration = Duration::from_secs(3600);
/// Most slots a semaphore may have.
pub const MAX_SLOTS: u32 = 1000;
const MAX_NAME_CHARS: usize = 200;

/// Why a named-lease request was refused. Its kind is given below, its status by `crate::error::http_status`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NamedLeaseError {
    #[error("a lease name is 1 to 200 of the characters A-Z a-z 0-9 . _ - : @; got {0:?}")]
    BadName(String),
    #[error("ttlMs must be 100 to 3600000 (milliseconds); got {0}")]
    BadTtl(u64),
    #[error("waitMs must be 0 to 60000 (milliseconds); got {0}")]
    BadWait(u64),
    #[error("a semaphore needs ?slots=N with N from 1 to 1000; got {0:?}")]
    BadSlots(String),
    #[error("send the lease's token in the header X-Lease-Token")]
    MissingToken,
    #[error("{what} {name} is held by {} (fence {}) for another {} ms; try again later or wait with waitMs", .holder.owner, .holder.fence, .holder.expires_in.as_millis())]
    Held {
        what: &'static str,
        name: String,
        holder: LeaseHolder,
    },
    #[error(
        "no such {what} on {name}: it ran out or was released (or the token is wrong); acquire it again"
    )]
    Ended { what: &'static str, name: String },
    #[error("{0}")]
    Store(#[from] LeaseStoreError),
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed { method: Method, path: String },
}

/// The methods every named lease's and semaphore's path has (a 405's `Allow`).
pub(crate) fn methods() -> Allowed {
    Allowed::of(&[Method::GET, Method::POST, Method::PUT, Method::DELETE])
}

/// Where a request under `v1/` goes.
struct Target {
    kind: LeaseKind,
    /// The name the client used.
    name: String,
    /// The name in the store: `lease:NAME` or `semaphore:NAME`.
    store_name: String,
}

impl Target {
    fn what(&self) -> &'static str {
        if self.kind.is_semaphore() {
            "semaphore slot"
        } else {
            "lease"
        }
    }
}

/// Whether `path` is one of this module's (`{prefix}/v1/leases/...` or `.../semaphores/...`).
pub fn is_named_lease_path(gateway: &Gateway, path: &str) -> bool {
    below_v1(gateway, path).is_some()
}

fn below_v1<'p>(gateway: &Gateway, path: &'p str) -> Option<(&'static str, &'p str)> {
    let prefix = gateway.config.http.path_prefix.trim_end_matches('/');
    let rest = path.strip_prefix(prefix)?.strip_prefix("/v1/")?;
    let rest = rest.trim_end_matches('/');
    if let Some(name) = rest.strip_prefix("leases/") {
        return Some(("leases", name));
    }
    rest.strip_prefix("semaphores/")
        .map(|name| ("semaphores", name))
}

/// Answers one request below `v1/`; every error becomes a JSON error answer.
pub async fn handle(gateway: &Gateway, parts: &Parts, body: Incoming) -> Response<Body> {
    match answer(gateway, parts, body).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    }
}

async fn answer(
    gateway: &Gateway,
    parts: &Parts,
    body: Incoming,
) -> Result<Response<Body>, ApiError> {
    let path = parts.uri.path().to_owned();
    let (collection, name) = below_v1(gateway, &path)
        .ok_or_else(|| ApiError::not_found(format!("no such endpoint: {path}")))?;
    check_name(name)?;
    let query = parts.uri.query().unwrap_or("");
    let kind = match collection {
        "semaphores" => LeaseKind::Semaphore {
            slots: slots(query, parts.method == Method::POST)?,
        },
        _ => LeaseKind::Exclusive,
    };
    let target = Target {
        kind,
        name: name.to_owned(),
        store_name: format!(
            "{}:{name}",
            if kind.is_semaphore() {
                "semaphore"
            } else {
                "lease"
            }
        ),
    };
    let json = if matches!(parts.method, Method::POST | Method::PUT) {
        let bytes = read_body(body, gateway.config.http.max_body_bytes).await?;
        let what = format!("{} {path}", parts.method);
        media_type::check(&parts.headers, MediaType::Json, &bytes, &what)?;
        JsonBody::from_bytes(bytes)?
    } else {
        JsonBody::empty()
    };
    let token = presented_token(&parts.headers);
    let answer = match &parts.method {
        &Method::POST => acquire(gateway, &target, &json, token).await?,
        &Method::PUT => renew(gateway, &target, &json, token).await?,
        &Method::DELETE => release(gateway, &target, token).await?,
        &Method::GET => status(gateway, &target, query).await?,
        method => {
            let method = method.clone();
            return Err(NamedLeaseError::MethodNotAllowed { method, path }.into());
        }
    };
    Ok(json_response(&answer))
}

fn check_name(name: &str) -> Result<(), NamedLeaseError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-:@".contains(c);
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS || !name.chars().all(allowed) {
        return Err(NamedLeaseError::BadName(name.to_owned()));
    }
    Ok(())
}

/// `slots` from the query; required when `needed` (acquiring).
fn slots(query: &str, needed: bool) -> Result<u32, NamedLeaseError> {
    let text = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.eq_ignore_ascii_case("slots"))
        .map(|(_, value)| value);
    match text {
        None if !needed => Ok(1),
        None => Err(NamedLeaseError::BadSlots(String::new())),
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|slots| (1..=MAX_SLOTS).contains(slots))
            .ok_or_else(|| NamedLeaseError::BadSlots(text.to_owned())),
    }
}

fn presented_token(headers: &HeaderMap) -> Option<LeaseToken> {
    headers
        .get(LEASE_TOKEN_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .map(LeaseToken::from_text)
}

fn ttl(ttl_ms: Option<Whole>, required: bool) -> Result<Option<Duration>, ApiError> {
    let ttl_ms = match ttl_ms {
        Some(Whole(ttl_ms)) => ttl_ms,
        None if required => return Err(ApiError::bad_request("the field ttlMs is missing")),
        None => return Ok(None),
    };
    let ttl = Duration::from_millis(ttl_ms);
    if !(MIN_NAMED_TTL..=MAX_NAMED_TTL).contains(&ttl) {
        return Err(NamedLeaseError::BadTtl(ttl_ms).into());
    }
    Ok(Some(ttl))
}

fn grant_json(target: &Target, grant: &LeaseGrant, with_token: bool) -> Json {
    let mut answer = json!({
        "name": target.name,
        "owner": grant.owner,
        "fence": grant.fence,
        "expiresInMs": millis(grant.expires_in),
    });
    if with_token {
        answer["token"] = json!(grant.token.as_str());
    }
    if target.kind.is_semaphore() {
        answer["slot"] = json!(grant.slot);
    }
    answer
}

/// `POST`: one attempt, or attempts with jittered back-off for up to `waitMs`.
async fn acquire(
    gateway: &Gateway,
    target: &Target,
    body: &JsonBody,
    token: Option<LeaseToken>,
) -> Result<Json, ApiError> {
    let asked: NamedLeaseAcquireRequest = body.typed()?;
    let ttl = ttl(asked.ttl_ms, true)?.unwrap_or(MIN_NAMED_TTL);
    let wait_ms = asked.wait_ms.checked()?.map_or(0, |Whole(ms)| ms);
    let wait = Duration::from_millis(wait_ms);
    if wait > MAX_WAIT {
        return Err(NamedLeaseError::BadWait(wait_ms).into());
    }
    let owner = NamedLeaseAcquireRequest::owner(asked.owner.checked()?)?;
    // Its fresh token is drawn once, so that every attempt of a wait is one caller; the
    // client's token only gets back the lease it already holds.
    let mut request = AcquireRequest::new(owner, ttl);
    request.retry_token = token;
    let store = gateway.leases.default_store();
    let deadline = tokio::time::Instant::now() + wait;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let holder = match store
            .try_acquire_kind(target.kind, &target.store_name, request.clone())
            .await
            .map_err(NamedLeaseError::from)?
        {
            Acquisition::Taken(grant) | Acquisition::Renewed(grant) => {
                return Ok(grant_json(target, &grant, true));
            }
            Acquisition::HeldByOther(holder) => holder,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(NamedLeaseError::Held {
                what: target.what(),
                name: target.name.clone(),
                holder,
            }
            .into());
        }
        let pause = backoff / 2 + (backoff / 2).mul_f64(rand::random::<f64>());
        tokio::time::sleep(pause.min(left)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// `PUT` with `X-Lease-Token`.
async fn renew(
    gateway: &Gateway,
    target: &Target,
    body: &JsonBody,
    token: Option<LeaseToken>,
) -> Result<Json, ApiError> {
    let token = token.ok_or(NamedLeaseError::MissingToken)?;
    let ttl = ttl(body.typed::<NamedLeaseRenewRequest>()?.ttl_ms, false)?;
    let grant = gateway
        .leases
        .default_store()
        .refresh_kind(target.kind, &target.store_name, &token, ttl)
        .await
        .map_err(NamedLeaseError::from)?
        .ok_or_else(|| NamedLeaseError::Ended {
            what: target.what(),
            name: target.name.clone(),
        })?;
    Ok(grant_json(target, &grant, false))
}

/// `DELETE` with `X-Lease-Token`.
async fn release(
    gateway: &Gateway,
    target: &Target,
    token: Option<LeaseToken>,
) -> Result<Json, ApiError> {
    let token = token.ok_or(NamedLeaseError::MissingToken)?;
    let released = gateway
        .leases
        .default_store()
        .release_kind(target.kind, &target.store_name, &token)
        .await
        .map_err(NamedLeaseError::from)?;
    if !released {
        return Err(NamedLeaseError::Ended {
            what: target.what(),
            name: target.name.clone(),
        }
        .into());
    }
    Ok(json!({ "name": target.name, "released": true }))
}

/// `GET`: a lease's holder, or a semaphore's holders (each with its slot); never a token.
async fn status(gateway: &Gateway, target: &Target, query: &str) -> Result<Json, ApiError> {
    let holders = gateway
        .leases
        .default_store()
        .holders(target.kind, &target.store_name)
        .await
        .map_err(NamedLeaseError::from)?;
    if !target.kind.is_semaphore() {
        return Ok(match holders.first() {
            Some(grant) => json!({
                "name": target.name,
                "held": true,
                "owner": grant.owner,
                "expiresInMs": millis(grant.expires_in),
                "fence": grant.fence,
            }),
            None => json!({
                "name": target.name,
                "held": false,
                "owner": null,
                "expiresInMs": 0,
                "fence": null,
            }),
        });
    }
    let listed: Vec<Json> = holders
        .iter()
        .map(|grant| grant_json(target, grant, false))
        .collect();
    let mut answer = json!({
        "name": target.name,
        "held": !holders.is_empty(),
        "holders": listed,
    });
    if query.to_ascii_lowercase().contains("slots=") {
        let slots = slots(query, true)?;
        answer["slots"] = json!(slots);
        answer["free"] =
            json!(slots.saturating_sub(u32::try_from(holders.len()).unwrap_or(u32::MAX)));
    }
    Ok(answer)
}

/// Each refusal's kind in the gateway's one vocabulary (`ErrorKind`; `crate::error` gives it
/// its status), given here so that `crate::error` needs no HTTP handler module.
impl From<NamedLeaseError> for ApiError {
    fn from(error: NamedLeaseError) -> ApiError {
        let kind = match &error {
            NamedLeaseError::BadName(_)
            | NamedLeaseError::BadTtl(_)
            | NamedLeaseError::BadWait(_)
            | NamedLeaseError::BadSlots(_)
            | NamedLeaseError::MissingToken => ErrorKind::BadRequest,
            NamedLeaseError::Held { .. } => ErrorKind::Conflict,
            NamedLeaseError::Ended { .. } => ErrorKind::NotFound,
            NamedLeaseError::Store(store) => return ApiError::from(store.clone()),
            NamedLeaseError::MethodNotAllowed { .. } => {
                return ApiError::method_not_allowed(error.to_string(), methods());
            }
        };
        ApiError::new(kind, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_slots_are_checked_with_readable_errors() {
        assert!(check_name("dataset-42:import@lab.a_b").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(201)] {
            assert!(
                check_name(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("lease name")
            );
        }
        assert_eq!(slots("slots=2", true).unwrap(), 2);
        assert_eq!(slots("x=1&SLOTS=7", true).unwrap(), 7);
        assert_eq!(slots("", false).unwrap(), 1);
        for bad in ["", "slots=0", "slots=1001", "slots=two"] {
            assert!(
                slots(bad, true)
                    .unwrap_err()
                    .to_string()
                    .contains("slots=N")
            );
        }
    }
}
