//! Lease bodies: the control lease's `{Owner, TtlMs?}` and `{TtlMs?}` (`lease`,
//! `lease/{id}`), a named lease's or semaphore's `{ttlMs, waitMs?, owner?}` and `{ttlMs?}`
//! (`v1/leases/...`, `v1/semaphores/...`, camelCase as the lab scripts send them); and the
//! control lease's owner and time to live, checked.

use std::time::Duration;

use serde::Deserialize;

use super::{RequestBody, asked_text};
use crate::body::{Deferred, Whole};
use crate::error::ApiError;
use crate::lease::{LeaseError, MAX_TTL, MIN_TTL};

/// The most of an owner's name kept.
pub const MAX_OWNER_CHARS: usize = 200;

/// `POST lease {Owner, TtlMs?}`: both checked by the handler, after the access rules' say on
/// who may take the lease.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LeaseAcquireRequest {
    pub owner: Deferred<String>,
    /// Checked after the owner.
    pub ttl_ms: Deferred<Option<Whole>>,
}

impl RequestBody for LeaseAcquireRequest {
    /// `owner=bench 3`, as sent.
    fn asked(&self) -> Option<String> {
        asked_text(&[format!("owner={}", self.owner.value()?)])
    }
}

impl RequestBody for LeaseRenewRequest {}

impl LeaseAcquireRequest {
    /// Who takes the lease (trimmed, at most [`MAX_OWNER_CHARS`]) and for how long, when the
    /// body says.
    pub fn owner_and_ttl(self) -> Result<(String, Option<Duration>), ApiError> {
        let owner = self.owner.checked()?;
        let owner = owner.trim();
        if owner.is_empty() {
            return Err(ApiError::bad_request(
                "the field Owner must name who takes the lease, e.g. \"TAT station 3\"",
            ));
        }
        super::refuse_control_characters("Owner", owner)?;
        let owner = owner.chars().take(MAX_OWNER_CHARS).collect();
        Ok((owner, control_ttl(self.ttl_ms.checked()?)?))
    }
}

/// `PUT lease/{id} {TtlMs?}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LeaseRenewRequest {
    pub ttl_ms: Option<Whole>,
}

impl LeaseRenewRequest {
    pub fn ttl(self) -> Result<Option<Duration>, ApiError> {
        control_ttl(self.ttl_ms)
    }
}

/// The control lease's `TtlMs`, when given, in range.
fn control_ttl(ttl_ms: Option<Whole>) -> Result<Option<Duration>, ApiError> {
    let Some(Whole(ttl_ms)) = ttl_ms else {
        return Ok(None);
    };
    let ttl = Duration::from_millis(ttl_ms);
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        return Err(LeaseError::BadTtl(ttl_ms).into());
    }
    Ok(Some(ttl))
}

/// `POST v1/leases/{name}` or `v1/semaphores/{name}?slots=N` with `{ttlMs, waitMs?, owner?}`;
/// the range checks are the named leases' (`named_leases.rs`), each before the next field.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedLeaseAcquireRequest {
    pub ttl_ms: Option<Whole>,
    pub wait_ms: Deferred<Option<Whole>>,
    pub owner: Deferred<Option<String>>,
}

impl NamedLeaseAcquireRequest {
    /// The owner as kept: trimmed, at most [`MAX_OWNER_CHARS`], `anonymous` for none; one
    /// with a control character is refused (400 naming `owner`).
    pub fn owner(owner: Option<String>) -> Result<String, ApiError> {
        let owner = owner.as_deref().unwrap_or_default().trim();
        super::refuse_control_characters("owner", owner)?;
        let owner: String = owner.chars().take(MAX_OWNER_CHARS).collect();
        Ok(if owner.is_empty() {
            "anonymous".to_owned()
        } else {
            owner
        })
    }
}

/// `PUT v1/leases/{name}` (or a semaphore's) with `{ttlMs?}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedLeaseRenewRequest {
    pub ttl_ms: Option<Whole>,
}
