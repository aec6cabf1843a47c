//! The control lease's own events as audit lines (`LEASE taken|released|expired|broken|
//! safe-stop|safe-state`), through the lease's notice hook.

use std::time::SystemTime;

use super::AuditLog;
use super::line::{ChangeFields, Outcome, RequestLine};
use crate::lease::{LeaseNotice, LeaseNoticeHook};

/// The hook that writes every [`LeaseNotice`] to `audit` (queued and synced with its batch;
/// the request that caused it waits for its own line, which comes after). Given a station's
/// view ([`AuditLog::for_station`]), every lease line ends with that station's field.
pub fn lease_hook(audit: AuditLog) -> LeaseNoticeHook {
    std::sync::Arc::new(move |notice: LeaseNotice<'_>| {
        audit.note_change(lease_line(&notice, SystemTime::now()))
    })
}

/// The line of one lease event.
pub fn lease_line(notice: &LeaseNotice<'_>, at: SystemTime) -> String {
    let applied = |event, owner: &str, fence| (event, Some((owner.to_owned(), fence)), None);
    let (event, lease, ip) = match *notice {
        LeaseNotice::Taken { owner, fence } => applied("taken", owner, fence),
        LeaseNotice::Released { owner, fence } => applied("released", owner, fence),
        LeaseNotice::RanOut { owner, fence } => applied("expired", owner, fence),
        LeaseNotice::Broken { owner, fence, peer } => {
            ("broken", Some((owner.to_owned(), fence)), Some(peer.ip()))
        }
        LeaseNotice::SafeStopped { lease, .. } => (
            "safe-stop",
            lease.map(|(owner, fence)| (owner.to_owned(), fence)),
            None,
        ),
        LeaseNotice::SafeState { owner, fence, .. } => applied("safe-state", owner, fence),
    };
    let (caller, outcome, why) = match *notice {
        // Who pressed it and why.
        LeaseNotice::SafeStopped { by, reason, .. } => (
            Some(by.to_owned()),
            Outcome::Applied,
            Some(reason.to_owned()),
        ),
        LeaseNotice::SafeState {
            result: Err(why), ..
        } => (None, Outcome::Refused, Some(why.to_owned())),
        _ => (None, Outcome::Applied, None),
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
        caller,
        lease,
        outcome: Some(outcome),
        why,
        ..ChangeFields::default()
    }))
}

/// The line of a failover: this gateway (`me`) took the station over from `previous` (the
/// owner text of the link-owner lease that lapsed), `holder` the control lease's holder it
/// resumed.
pub fn failover_line(
    me: &str,
    previous: Option<&str>,
    holder: Option<&str>,
    at: SystemTime,
) -> String {
    let line = RequestLine {
        at,
        ip: None,
        method: "GATEWAY",
        path: "failover",
        status: None,
        duration: None,
    };
    line.render(Some(&ChangeFields {
        caller: Some(me.to_owned()),
        outcome: Some(Outcome::Applied),
        why: Some(format!(
            "took the station over from {}, whose link-owner lease lapsed; the control lease {}",
            previous.unwrap_or("a gateway that was gone before this one looked"),
            match holder {
                Some(holder) => format!("of {holder} goes on through this gateway"),
                None => "was free".to_owned(),
            }
        )),
        ..ChangeFields::default()
    }))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn a_safe_stop_line_names_the_caller_the_reason_and_the_lease_it_ended() {
        let at = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let line = lease_line(
            &LeaseNotice::SafeStopped {
                by: "bench 3",
                reason: "smoke in rack 2",
                lease: Some(("TAT station 3", 7)),
            },
            at,
        );
        assert!(line.contains("LEASE safe-stop"), "{line}");
        assert!(line.contains("caller=\"bench 3\""), "{line}");
        assert!(line.contains("owner=\"TAT station 3\" fence=7"), "{line}");
        assert!(line.contains("why=\"smoke in rack 2\""), "{line}");
        let nobody = LeaseNotice::SafeStopped {
            by: "bench 3",
            reason: "drill",
            lease: None,
        };
        assert!(lease_line(&nobody, at).contains("owner=- fence=-"));
    }

    #[test]
    fn a_failover_line_names_this_gateway_the_previous_owner_and_the_lease_resumed() {
        let at = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        let line = failover_line(
            "station-gateway pid 2 at http://gw2:5000",
            Some("station-gateway pid 1 at http://gw1:5000"),
            Some("TAT station 3"),
            at,
        );
        assert!(line.contains("GATEWAY failover"), "{line}");
        assert!(
            line.contains("caller=\"station-gateway pid 2 at http://gw2:5000\""),
            "{line}"
        );
        assert!(line.contains("of TAT station 3 goes on"), "{line}");
        assert!(
            line.contains("from station-gateway pid 1 at http://gw1:5000"),
            "{line}"
        );
    }
}
