//! The control lease's own events as audit lines (`LEASE taken|released|expired|broken|
//! safe-state`), through the lease's notice hook.

use std::time::SystemTime;

use super::AuditLog;
use super::line::{ChangeFields, Outcome, RequestLine};
use crate::lease::{LeaseNotice, LeaseNoticeHook};

/// The hook that writes every [`LeaseNotice`] to `audit` (queued and synced with its batch;
/// the request that caused it waits for its own line, which comes after).
pub fn lease_hook(audit: AuditLog) -> LeaseNoticeHook {
    std::sync::Arc::new(move |notice: LeaseNotice<'_>| {
        audit.note_change(lease_line(&notice, SystemTime::now()))
    })
}

/// The line of one lease event.
pub fn lease_line(notice: &LeaseNotice<'_>, at: SystemTime) -> String {
    let (event, owner, fence, ip, outcome, why) = match *notice {
        LeaseNotice::Taken { owner, fence } => {
            ("taken", owner, fence, None, Outcome::Applied, None)
        }
        LeaseNotice::Released { owner, fence } => {
            ("released", owner, fence, None, Outcome::Applied, None)
        }
        LeaseNotice::RanOut { owner, fence } => {
            ("expired", owner, fence, None, Outcome::Applied, None)
        }
        LeaseNotice::Broken { owner, fence, peer } => (
            "broken",
            owner,
            fence,
            Some(peer.ip()),
            Outcome::Applied,
            None,
        ),
        LeaseNotice::SafeState {
            owner,
            fence,
            result,
        } => match result {
            Ok(()) => ("safe-state", owner, fence, None, Outcome::Applied, None),
            Err(why) => (
                "safe-state",
                owner,
                fence,
                None,
                Outcome::Refused,
                Some(why.to_owned()),
            ),
        },
    };
    let line = RequestLine {
        at,
        ip,
        method: "LEASE",
        path: event,
        status: None,
        duration: None,
    };
    line.render(Some(&ChangeFields {
        caller: None,
        lease: Some((owner.to_owned(), fence)),
        outcome: Some(outcome),
        why,
        ..ChangeFields::default()
    }))
}
