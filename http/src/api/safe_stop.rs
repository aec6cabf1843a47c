//! `POST /v1/safe-stop {"Reason": "..."}`: the safe stop anyone with control (and the access
//! rules' `safe_stop`, when a rules file is in force) may press, lease or no lease. The lease held ends and the configured safe state is applied and confirmed
//! (`ControlLease::safe_stop`, on a task nobody cancels); the answer says what was done.

use serde_json::json;

use super::call::{Answer, Call, ok};
use crate::error::ApiError;
use crate::lease::control::{SafeStopOutcome, SafeStopState};
use crate::requests::safe_stop::SafeStopRequest;

/// `POST /v1/safe-stop`: who pressed it is the caller's key or user name, else (access
/// control off) the peer's address.
pub(super) async fn press(call: Call<'_>) -> Answer {
    let reason = call.body.typed::<SafeStopRequest>()?.reason()?;
    let by = call
        .gateway
        .access
        .caller(call.headers)
        .unwrap_or_else(|| format!("a client at {}", call.peer.ip()));
    ok(stop(call.gateway, &call.who(), &by, &reason).await?)
}

/// One station's safe stop, pressed by `who` (named `by` in the lease's end and the answer):
/// the access rules' `safe_stop` right, decided by the station service like every other
/// (refused: 403, the rule named), then the lease's end and the safe state
/// (`ControlLease::safe_stop`, on a task nobody cancels). `POST /v1/safe-stop` of a station
/// and of the lab (`lab/safe_stop.rs`) both come here.
pub(crate) async fn stop(
    gateway: &crate::gateway::Gateway,
    who: &crate::access_rules::Who,
    by: &str,
    reason: &str,
) -> Result<serde_json::Value, ApiError> {
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
/// station confirmed them.
fn answer(
    by: &str,
    reason: &str,
    outcome: &SafeStopOutcome,
    writes: Vec<String>,
) -> serde_json::Value {
    let lease = match &outcome.ended {
        Some((owner, fence)) => format!("ended {owner}'s lease (fence {fence})"),
        None => "no lease was held".to_owned(),
    };
    let (configured, confirmed, error, safe_state) = match &outcome.safe_state {
        SafeStopState::NotConfigured => (
            false,
            false,
            None,
            "no safe state is configured ([lease] safe_state)".to_owned(),
        ),
        SafeStopState::Confirmed => (
            true,
            true,
            None,
            format!("the station confirmed the safe state {}", writes.join(", ")),
        ),
        SafeStopState::AlreadySafe => (
            true,
            true,
            None,
            format!(
                "the safe state {} was already in place (read back right): nothing written",
                writes.join(", ")
            ),
        ),
        SafeStopState::NotConfirmed { tries, why } => (
            true,
            false,
            Some(why.clone()),
            format!(
                "the safe state {} is not confirmed yet (try {tries}: {why}); the gateway keeps trying, and nobody changes the station until it is",
                writes.join(", ")
            ),
        ),
    };
    json!({
        "stopped": true,
        "by": by,
        "reason": reason,
        "leaseEnded": outcome.ended.as_ref().map(|(owner, fence)| json!({"owner": owner, "fence": fence})),
        "safeState": {
            "configured": configured,
            "confirmed": confirmed,
            "writes": writes,
            "error": error,
        },
        "message": format!("safe-stopped by {by}: {reason}: {lease}; {safe_state}"),
    })
}
