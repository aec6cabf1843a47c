//! Where a lease is had, renewed, released and looked up: the gateway's control lease
//! (`api/lease`), a named lease or semaphore slot through the gateway's `/v1/`, or a backend
//! directly with the crate's own engine. Every answer is turned into the terms of
//! `holding.rs` here, so that the rest never sees HTTP statuses or store errors.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value as Json, json};
use station_lease::LeaseStoreError;
use station_lease::{BackendUrl, Lease, LeaseGuard, LeaseGuardError, LeaseKind, LeaseStore};
use tokio::time::Instant;

use crate::cli::Target;
use crate::holding::{EXIT_DENIED, EXIT_NOT_HAD, EXIT_UNAVAILABLE, EXIT_USAGE, RenewalAnswer};

/// The longest wait one request asks the gateway for (`waitMs`); longer waits ask again.
const MAX_WAIT_PER_REQUEST: Duration = Duration::from_millis(60_000);
/// How long a request may take beyond the wait it asked for.
const REQUEST_SLACK: Duration = Duration::from_secs(10);
/// The pause before asking again when the wait is not over: after a 409 that the gateway's
/// queue waited for (a wait longer than a minute), or a "try again in a moment" (between
/// leases, safe state pending).
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// Why something could not be done, with the exit status it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: u8,
    pub message: String,
}

impl Failure {
    fn new(status: u8, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }
}

/// A lease just had.
#[derive(Debug)]
pub struct Had {
    pub held: HeldLease,
    /// The id the holder proves itself with (`X-Lease-Id` or `X-Lease-Token`).
    pub id: String,
    pub fence: u64,
    pub expires_in: Duration,
    /// When the acquisition that got it was asked.
    pub asked_at: Instant,
}

/// A lease held, to renew and release.
#[derive(Debug)]
pub enum HeldLease {
    GatewayControl {
        gateway: Gateway,
        id: String,
    },
    GatewayNamed {
        gateway: Gateway,
        path: String,
        token: String,
    },
    Backend {
        guard: LeaseGuard,
    },
}

/// The gateway's HTTP side: its base URL and the API key sent with every request.
#[derive(Debug, Clone)]
pub struct Gateway {
    base: String,
    api_key: Option<String>,
    http: reqwest::Client,
}

impl Gateway {
    pub fn new(base: &str, api_key: Option<String>) -> Gateway {
        Gateway {
            base: base.trim_end_matches('/').to_owned(),
            api_key,
            http: reqwest::Client::new(),
        }
    }

    fn request(&self, method: Method, path: &str, timeout: Duration) -> RequestBuilder {
        let mut request = self
            .http
            .request(method, format!("{}/{path}", self.base))
            .timeout(timeout);
        if let Some(key) = &self.api_key {
            request = request.header("X-Api-Key", key);
        }
        request
    }

    /// Sends `request`: the status and the JSON answer (`Null` when it is not JSON), or why
    /// nothing was answered.
    async fn send(&self, request: RequestBuilder) -> Result<(StatusCode, Json), String> {
        let response: Response = request.send().await.map_err(|error| {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            format!("{} did not answer: {text}", self.base)
        })?;
        let status = response.status();
        let body = response.json().await.unwrap_or(Json::Null);
        Ok((status, body))
    }

    /// `DELETE api/lease` with the admin token: the admin break.
    pub async fn break_control(&self, admin_token: &str) -> Result<String, Failure> {
        let request = self
            .request(Method::DELETE, "api/lease", REQUEST_SLACK)
            .bearer_auth(admin_token);
        let (status, body) = self
            .send(request)
            .await
            .map_err(|why| Failure::new(EXIT_UNAVAILABLE, why))?;
        if !status.is_success() {
            return Err(refusal(status, &body, "the admin break"));
        }
        let broken = &body["broken"];
        Ok(match broken["owner"].as_str() {
            Some(owner) => format!("broke the control lease held by {owner}"),
            None => "broke the control lease".to_owned(),
        })
    }
}

/// The message of a gateway's error answer: the first of `error`, `message`, `detail`, `title`.
fn message_of(body: &Json) -> String {
    ["error", "message", "detail", "title"]
        .iter()
        .find_map(|key| body[key].as_str())
        .unwrap_or("no message")
        .to_owned()
}

/// An error answer to `what`, with the exit status it means.
fn refusal(status: StatusCode, body: &Json, what: &str) -> Failure {
    let code = match status.as_u16() {
        400 | 405 | 413 => EXIT_USAGE,
        401 | 403 => EXIT_DENIED,
        404 | 409 | 423 => 1,
        _ => EXIT_UNAVAILABLE,
    };
    Failure::new(
        code,
        format!("{what} was refused ({status}): {}", message_of(body)),
    )
}

/// Whether a refused acquisition may be asked again while the wait lasts: held by someone
/// else (409), between leases (423), the safe state pending or the store unavailable (503).
fn worth_asking_again(status: StatusCode) -> bool {
    matches!(status.as_u16(), 409 | 423 | 503)
}

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn u64_of(body: &Json, key: &str, what: &str) -> Result<u64, Failure> {
    body[key].as_u64().ok_or_else(|| {
        Failure::new(
            EXIT_UNAVAILABLE,
            format!("the gateway's answer to {what} has no {key}: {body}"),
        )
    })
}

fn store_name(name: &str, slots: Option<u32>) -> (LeaseKind, String) {
    match slots {
        Some(slots) => (LeaseKind::Semaphore { slots }, format!("semaphore:{name}")),
        None => (LeaseKind::Exclusive, format!("lease:{name}")),
    }
}

/// The `/v1/` path of a named lease or semaphore (`?slots=N` for a semaphore).
fn named_path(name: &str, slots: Option<u32>) -> String {
    match slots {
        Some(slots) => format!("v1/semaphores/{name}?slots={slots}"),
        None => format!("v1/leases/{name}"),
    }
}

async fn open_backend(url: &str) -> Result<Arc<dyn LeaseStore>, Failure> {
    let parsed =
        BackendUrl::parse(url).map_err(|error| Failure::new(EXIT_USAGE, error.to_string()))?;
    parsed
        .open()
        .await
        .map_err(|error| Failure::new(EXIT_UNAVAILABLE, error.to_string()))
}

/// How a store's error ends an acquisition: a wrong backend URL or semaphore size is the
/// caller's; the rest is the store's.
fn store_failure(error: &LeaseStoreError) -> Failure {
    let status = match error {
        LeaseStoreError::BadBackend { .. } | LeaseStoreError::CapacityConflict { .. } => EXIT_USAGE,
        LeaseStoreError::Unavailable(_) | LeaseStoreError::Backend(_) => EXIT_UNAVAILABLE,
    };
    Failure::new(status, error.to_string())
}

/// Acquires what `target` names for `owner`, waiting up to `wait` while someone else holds it.
pub async fn acquire(
    target: &Target,
    api_key: Option<String>,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Had, Failure> {
    let deadline = Instant::now() + wait;
    match target {
        Target::GatewayControl { gateway } => {
            let gateway = Gateway::new(gateway, api_key);
            let body = json!({ "Owner": owner, "TtlMs": ms(ttl) });
            let (had, asked_at) =
                acquire_over_http(&gateway, deadline, "the control lease", |left| {
                    let path = format!("api/lease?waitMs={}", ms(left));
                    (path, body.clone())
                })
                .await?;
            let id = had["leaseId"].as_str().map(str::to_owned).ok_or_else(|| {
                Failure::new(
                    EXIT_UNAVAILABLE,
                    format!("the gateway's answer to POST api/lease has no leaseId: {had}"),
                )
            })?;
            Ok(Had {
                fence: u64_of(&had, "fence", "POST api/lease")?,
                expires_in: Duration::from_millis(u64_of(&had, "expiresInMs", "POST api/lease")?),
                held: HeldLease::GatewayControl {
                    gateway,
                    id: id.clone(),
                },
                id,
                asked_at,
            })
        }
        Target::GatewayNamed {
            gateway,
            name,
            slots,
        } => {
            let gateway = Gateway::new(gateway, api_key);
            let path = named_path(name, *slots);
            let what = match slots {
                Some(_) => format!("a slot of semaphore {name}"),
                None => format!("lease {name}"),
            };
            let (had, asked_at) = acquire_over_http(&gateway, deadline, &what, |left| {
                let body = json!({ "ttlMs": ms(ttl), "owner": owner, "waitMs": ms(left) });
                (path.clone(), body)
            })
            .await?;
            let token = had["token"].as_str().map(str::to_owned).ok_or_else(|| {
                Failure::new(
                    EXIT_UNAVAILABLE,
                    format!("the gateway's answer to POST {path} has no token: {had}"),
                )
            })?;
            Ok(Had {
                fence: u64_of(&had, "fence", &path)?,
                expires_in: Duration::from_millis(u64_of(&had, "expiresInMs", &path)?),
                held: HeldLease::GatewayNamed {
                    gateway,
                    path,
                    token: token.clone(),
                },
                id: token,
                asked_at,
            })
        }
        Target::Backend { url, name, slots } => {
            let store = open_backend(url).await?;
            let (_, store_name) = store_name(name, *slots);
            let lease = match slots {
                Some(slots) => Lease::semaphore(store, store_name, *slots, ttl),
                None => Lease::exclusive(store, store_name, ttl),
            }
            .with_owner(owner);
            let asked_at = Instant::now();
            let guard = lease
                .guard(true, Some(wait))
                .await
                .map_err(|error| match &error {
                    LeaseGuardError::LeaseNotAcquired { .. } => Failure::new(
                        EXIT_NOT_HAD,
                        format!("not had within {} ms: {error}", ms(wait)),
                    ),
                    LeaseGuardError::Store(store) => store_failure(store),
                })?;
            let grant = guard
                .lease()
                .grant()
                .ok_or_else(|| Failure::new(EXIT_UNAVAILABLE, "the backend confirmed no grant"))?;
            Ok(Had {
                id: grant.token.as_str().to_owned(),
                fence: grant.fence,
                expires_in: grant.expires_in,
                held: HeldLease::Backend { guard },
                asked_at,
            })
        }
    }
}

/// `POST`s `(path, body)` made for the wait left until the lease is had or `deadline` passes;
/// each request waits on the gateway's side (its queue) for at most a minute.
async fn acquire_over_http(
    gateway: &Gateway,
    deadline: Instant,
    what: &str,
    ask: impl Fn(Duration) -> (String, Json),
) -> Result<(Json, Instant), Failure> {
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .min(MAX_WAIT_PER_REQUEST);
        let (path, body) = ask(left);
        let asked_at = Instant::now();
        let request = gateway
            .request(Method::POST, &path, left + REQUEST_SLACK)
            .json(&body);
        let (status, answer) = gateway
            .send(request)
            .await
            .map_err(|why| Failure::new(EXIT_UNAVAILABLE, why))?;
        if status.is_success() {
            return Ok((answer, asked_at));
        }
        if !worth_asking_again(status) {
            return Err(refusal(status, &answer, &format!("acquiring {what}")));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::new(
                EXIT_NOT_HAD,
                format!("{what} not had within the wait: {}", message_of(&answer)),
            ));
        }
        // A refusal that came back before its wait (a semaphore asked with other slots, the
        // safe state pending) is not asked again at once.
        tokio::time::sleep(BUSY_PAUSE.min(left)).await;
    }
}

impl HeldLease {
    /// Asks for it to last `ttl` from now; gives up after `timeout`.
    pub async fn renew(&self, ttl: Duration, timeout: Duration) -> RenewalAnswer {
        match self {
            HeldLease::GatewayControl { gateway, id } => {
                let request = gateway
                    .request(Method::PUT, &format!("api/lease/{id}"), timeout)
                    .json(&json!({ "TtlMs": ms(ttl) }));
                renewal_answer(gateway.send(request).await)
            }
            HeldLease::GatewayNamed {
                gateway,
                path,
                token,
            } => {
                let request = gateway
                    .request(Method::PUT, path, timeout)
                    .header("X-Lease-Token", token)
                    .json(&json!({ "ttlMs": ms(ttl) }));
                renewal_answer(gateway.send(request).await)
            }
            HeldLease::Backend { guard } => {
                match tokio::time::timeout(timeout, guard.refresh(Some(ttl))).await {
                    Ok(Ok(true)) => RenewalAnswer::Renewed {
                        expires_in: guard
                            .lease()
                            .grant()
                            .map_or(Duration::ZERO, |grant| grant.expires_in),
                    },
                    Ok(Ok(false)) => RenewalAnswer::Gone {
                        why: format!(
                            "{} ran out or moved on in the backend",
                            guard.lease().name()
                        ),
                    },
                    Ok(Err(error)) => RenewalAnswer::Unanswered {
                        why: error.to_string(),
                    },
                    Err(_) => RenewalAnswer::Unanswered {
                        why: format!("the backend did not answer within {} ms", ms(timeout)),
                    },
                }
            }
        }
    }

    /// Ends it. `Ok(false)`: it had already ended.
    pub async fn release(self) -> Result<bool, String> {
        match self {
            HeldLease::GatewayControl { gateway, id } => {
                let request =
                    gateway.request(Method::DELETE, &format!("api/lease/{id}"), REQUEST_SLACK);
                released(gateway.send(request).await)
            }
            HeldLease::GatewayNamed {
                gateway,
                path,
                token,
            } => {
                let request = gateway
                    .request(Method::DELETE, &path, REQUEST_SLACK)
                    .header("X-Lease-Token", token);
                released(gateway.send(request).await)
            }
            HeldLease::Backend { guard } => {
                guard.release().await.map_err(|error| error.to_string())
            }
        }
    }
}

fn renewal_answer(answer: Result<(StatusCode, Json), String>) -> RenewalAnswer {
    match answer {
        Err(why) => RenewalAnswer::Unanswered { why },
        Ok((status, body)) if status.is_success() => match body["expiresInMs"].as_u64() {
            Some(left) => RenewalAnswer::Renewed {
                expires_in: Duration::from_millis(left),
            },
            None => RenewalAnswer::Unanswered {
                why: format!("the renewal's answer has no expiresInMs: {body}"),
            },
        },
        // The store or the gateway could not answer: the lease's state is unknown.
        Ok((status, body)) if status.is_server_error() => RenewalAnswer::Unanswered {
            why: format!("{status}: {}", message_of(&body)),
        },
        // 404 (ended, broken, safe-stopped), or any other refusal: it is not ours any more.
        Ok((status, body)) => RenewalAnswer::Gone {
            why: format!("renewal refused ({status}): {}", message_of(&body)),
        },
    }
}

fn released(answer: Result<(StatusCode, Json), String>) -> Result<bool, String> {
    match answer? {
        (status, _) if status.is_success() => Ok(true),
        (StatusCode::NOT_FOUND, _) => Ok(false),
        (status, body) => Err(format!("{status}: {}", message_of(&body))),
    }
}

/// Who holds what `target` names, as lines for the user.
pub async fn status(target: &Target, api_key: Option<String>) -> Result<String, Failure> {
    match target {
        Target::GatewayControl { gateway } => {
            let gateway = Gateway::new(gateway, api_key);
            let body = get(&gateway, "api/lease", "GET api/lease").await?;
            Ok(describe_holder("the control lease", &body))
        }
        Target::GatewayNamed {
            gateway,
            name,
            slots,
        } => {
            let gateway = Gateway::new(gateway, api_key);
            let path = named_path(name, *slots);
            let body = get(&gateway, &path, &format!("GET {path}")).await?;
            Ok(match body["holders"].as_array() {
                Some(holders) => describe_semaphore(name, *slots, holders),
                None => describe_holder(&format!("lease {name}"), &body),
            })
        }
        Target::Backend { url, name, slots } => {
            let store = open_backend(url).await?;
            let (kind, store_name) = store_name(name, *slots);
            let holders = store
                .holders(kind, &store_name)
                .await
                .map_err(|error| store_failure(&error))?;
            let holders: Vec<Json> = holders
                .into_iter()
                .map(|grant| {
                    json!({
                        "owner": grant.owner,
                        "fence": grant.fence,
                        "expiresInMs": ms(grant.expires_in),
                        "slot": grant.slot,
                    })
                })
                .collect();
            Ok(match slots {
                Some(_) => describe_semaphore(name, *slots, &holders),
                None => describe_holder(
                    &format!("lease {name}"),
                    &holders.first().map_or(json!({ "held": false }), |holder| {
                        let mut holder = holder.clone();
                        holder["held"] = json!(true);
                        holder
                    }),
                ),
            })
        }
    }
}

async fn get(gateway: &Gateway, path: &str, what: &str) -> Result<Json, Failure> {
    let request = gateway.request(Method::GET, path, REQUEST_SLACK);
    let (status, body) = gateway
        .send(request)
        .await
        .map_err(|why| Failure::new(EXIT_UNAVAILABLE, why))?;
    if !status.is_success() {
        return Err(refusal(status, &body, what));
    }
    Ok(body)
}

/// "lease X: held by OWNER (fence N) for another N ms", or "lease X: nobody holds it".
fn describe_holder(what: &str, body: &Json) -> String {
    if body["held"] != json!(true) {
        return format!("{what}: nobody holds it");
    }
    let owner = body["owner"].as_str().unwrap_or("an unknown holder");
    let left = body["expiresInMs"].as_u64().unwrap_or(0);
    let fence = match body["fence"].as_u64() {
        Some(fence) => format!(" (fence {fence})"),
        None => String::new(),
    };
    let since = match body["since"].as_str() {
        Some(since) => format!(", since {since}"),
        None => String::new(),
    };
    format!("{what}: held by {owner}{fence} for another {left} ms{since}")
}

fn describe_semaphore(name: &str, slots: Option<u32>, holders: &[Json]) -> String {
    let size = slots.map_or(String::new(), |slots| format!(" ({slots} slots)"));
    let mut lines = vec![format!(
        "semaphore {name}{size}: {} holder{}",
        holders.len(),
        if holders.len() == 1 { "" } else { "s" }
    )];
    for holder in holders {
        lines.push(format!(
            "  slot {}: {} (fence {}) for another {} ms",
            holder["slot"].as_u64().unwrap_or(0),
            holder["owner"].as_str().unwrap_or("an unknown holder"),
            holder["fence"].as_u64().unwrap_or(0),
            holder["expiresInMs"].as_u64().unwrap_or(0),
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_answers_mean_renewed_gone_or_unanswered() {
        assert_eq!(
            renewal_answer(Ok((StatusCode::OK, json!({ "expiresInMs": 2900 })))),
            RenewalAnswer::Renewed {
                expires_in: Duration::from_millis(2900)
            }
        );
        let gone = renewal_answer(Ok((
            StatusCode::NOT_FOUND,
            json!({ "error": "no such lease: it has ended" }),
        )));
        assert!(matches!(gone, RenewalAnswer::Gone { why } if why.contains("no such lease")));
        assert!(matches!(
            renewal_answer(Ok((StatusCode::FORBIDDEN, json!({})))),
            RenewalAnswer::Gone { .. }
        ));
        assert!(matches!(
            renewal_answer(Ok((StatusCode::SERVICE_UNAVAILABLE, json!({ "error": "store" })))),
            RenewalAnswer::Unanswered { why } if why.contains("store")
        ));
        assert!(matches!(
            renewal_answer(Err("refused".into())),
            RenewalAnswer::Unanswered { .. }
        ));
        assert!(matches!(
            renewal_answer(Ok((StatusCode::OK, json!({})))),
            RenewalAnswer::Unanswered { .. }
        ));
    }

    #[test]
    fn refusals_exit_with_the_status_they_mean() {
        let body = json!({ "error": "TtlMs must be 1000 to 600000" });
        let failure = refusal(
            StatusCode::BAD_REQUEST,
            &body,
            "acquiring the control lease",
        );
        assert_eq!(failure.status, EXIT_USAGE);
        assert!(failure.message.contains("TtlMs must be"));
        assert_eq!(
            refusal(StatusCode::UNAUTHORIZED, &body, "x").status,
            EXIT_DENIED
        );
        assert_eq!(
            refusal(StatusCode::BAD_GATEWAY, &body, "x").status,
            EXIT_UNAVAILABLE
        );
        assert!(worth_asking_again(StatusCode::CONFLICT));
        assert!(worth_asking_again(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!worth_asking_again(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn holders_are_described_with_owner_fence_and_time_left() {
        assert_eq!(
            describe_holder(
                "lease x",
                &json!({ "held": true, "owner": "me", "fence": 4, "expiresInMs": 900 })
            ),
            "lease x: held by me (fence 4) for another 900 ms"
        );
        assert_eq!(
            describe_holder("the control lease", &json!({ "held": false })),
            "the control lease: nobody holds it"
        );
        let text = describe_semaphore(
            "ramp",
            Some(2),
            &[json!({ "slot": 1, "owner": "a", "fence": 7, "expiresInMs": 10 })],
        );
        assert_eq!(
            text,
            "semaphore ramp (2 slots): 1 holder\n  slot 1: a (fence 7) for another 10 ms"
        );
        assert_eq!(named_path("ramp", Some(2)), "v1/semaphores/ramp?slots=2");
        assert_eq!(store_name("x", None).1, "lease:x");
    }
}
