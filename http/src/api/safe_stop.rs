//! `POST /v1/safe-stop {"Reason": "..."}`: the safe stop anyone with control (and the access
//! rules' `safe_stop`, when a rules file is in force) may press, lease or no lease. The lease
//! held ends and the configured safe state is applied and confirmed (`ControlLease::safe_stop`,
//! on a task nobody cancels); the answer says what was done, and is 200 only when the safe
//! state was written and read back right (or read back right already): 503 while it is not
//! confirmed yet (the gateway keeps trying), 501 when no safe state is configured (the lease
//! still ends), 503 naming the owner when this process does not own the station's link.

use serde_json::json;

use super::call::{Answer, Call, ok};
use crate::error::{ApiError, ErrorKind};
use crate::lease::control::{SafeStopOutcome, SafeStopState};
use crate::reply::error_response_with;
use crate::requests::safe_stop::SafeStopRequest;

/// `POST /v1/safe-stop`: who pressed it is the caller's key or user name, else (access
/// control off) the peer's address.
pub(super) async fn press(call: Call<'_>, request: SafeStopRequest) -> Answer {
    let reason = request.reason()?;
    let by = call
        .gateway
        .access
        .caller(call.headers)
        .unwrap_or_else(|| format!("a client at {}", call.peer.ip()));
    let stopped = stop(call.gateway, &call.who(), &by, &reason).await?;
    match &stopped.short {
        None => ok(stopped.answer),
        Some(error) => Ok(error_response_with(error, stopped.answer)),
    }
}

/// What a press came to once the lease machine answered: the answer (what was done), and why
/// it is not a 200 when the safe state is not confirmed in place.
pub(crate) struct Stopped {
    pub answer: serde_json::Value,
    /// `None`: the safe state was written and read back right, or already in place.
    pub short: Option<ApiError>,
}

/// One station's safe stop, pressed by `who` (named `by` in the lease's end and the answer):
/// first whether this process owns the station's link now (not: 503 naming who does, nothing
/// done), then the access rules' `safe_stop` right, decided by the station service like every
/// other (refused: 403, the rule named), then the lease's end and the safe state
/// (`ControlLease::safe_stop`, on a task nobody cancels). `POST /v1/safe-stop` of a station and
/// of the lab (`lab/safe_stop.rs`) both come here.
pub(crate) async fn stop(
    gateway: &crate::gateway::Gateway,
    who: &crate::access_rules::Who,
    by: &str,
    reason: &str,
) -> Result<Stopped, ApiError> {
    gateway.owns_link()?;
    gateway.station.may_safe_stop(who).map_err(|refusal| {
        ApiError::from(crate::link::LinkError::Refused(
            crate::link::GuardRefusal::from(refusal),
        ))
    })?;
    let outcome = gateway
        .lease
        .safe_stop(by.to_owned(), reason.to_owned())
        .await?;
    let writes: Vec<String> = gateway
        .config
        .lease
        .safe_state
        .iter()
        .map(|w| format!("{}={}", w.channel, w.value))
        .collect();
    Ok(answer(by, reason, &outcome, writes))
}

/// The answer: the lease ended (or none held), and the safe state's writes and whether the
/// station confirmed them; short of a 200 unless they were confirmed in place.
fn answer(by: &str, reason: &str, outcome: &SafeStopOutcome, writes: Vec<String>) -> Stopped {
    let lease = match &outcome.ended {
        Some((owner, fence)) => format!("ended {owner}'s lease (fence {fence})"),
        None => "no lease was held".to_owned(),
    };
    let (configured, confirmed, error, safe_state, short) = match &outcome.safe_state {
        SafeStopState::NotConfigured => (
            false,
            false,
            None,
            "no safe state is configured ([lease] safe_state), so nothing was written: the station is as it was; configure one for this station to be made safe".to_owned(),
            Some(ErrorKind::NotOffered),
        ),
        SafeStopState::Confirmed => (
            true,
            true,
            None,
            format!(
                "the station confirmed the safe state {}, read back right",
                writes.join(", ")
            ),
            None,
        ),
        SafeStopState::AlreadySafe => (
            true,
            true,
            None,
            format!(
                "the safe state {} was already in place (read back right): nothing written",
                writes.join(", ")
            ),
            None,
        ),
        SafeStopState::NotConfirmed { tries, why } => (
            true,
            false,
            Some(why.clone()),
            format!(
                "the safe state {} is NOT confirmed yet (try {tries}: {why}); the gateway keeps trying, and nobody changes the station until it is",
                writes.join(", ")
            ),
            Some(ErrorKind::SafeStatePending),
        ),
    };
    let message = format!("safe-stopped by {by}: {reason}: {lease}; {safe_state}");
    Stopped {
        answer: json!({
            // Safe-stopped: the safe state confirmed in place (the lease's end is `leaseEnded`).
            "stopped": short.is_none(),
            "by": by,
            "reason": reason,
            "leaseEnded": outcome.ended.as_ref().map(|(owner, fence)| json!({"owner": owner, "fence": fence})),
            "safeState": {
                "configured": configured,
                "confirmed": confirmed,
                "writes": writes,
                "error": error,
            },
            "message": message,
        }),
        short: short.map(|kind| ApiError::new(kind, message)),
    }
}
