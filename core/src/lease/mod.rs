//! The control lease: who may change the station. What others see of it is a [`LeaseView`].
//!
//! The lease engine is the workspace crate `station-lease` (stores on memory, SQLite,
//! PostgreSQL and Redis, backends by URL, `Lease`, `LeaseGuard`); this module re-exports what
//! the gateway uses of it. [`control`] builds the gateway's one control lease on a store:
//! admission of requests, fencing at the link, waiting, expiry, safe state and events; the
//! named leases of lab scripts are served over HTTP by `http::named_leases`.
//!
//! The control lease on a shared backend (SQLite, Postgres, Redis): `ControlLease` keeps an
//! in-memory state (holder, token, fence, deadline) that admission and the link's send guards
//! read without waiting. It is loaded from the store at start (`resume`) and replaced by the
//! store's answer on every acquire, renew and release through this gateway; it is not re-read on
//! every request. That is sound only with one gateway per station, which [`link_owner`]
//! enforces: a second gateway on the same station and backend refuses to start. A shared
//! backend is for surviving restarts and for the named leases that lab scripts share.

pub mod control;
pub mod lab_identities;
pub mod ledger;
pub mod link_custody;
pub mod link_owner;
pub mod notice;
pub mod owner_state;
pub mod standby;

pub use station_lease::{
    AcquireRequest, Acquisition, BackendUrl, Lease, LeaseBackends, LeaseGrant, LeaseGuard,
    LeaseGuardError, LeaseHolder, LeaseKind, LeaseStore, LeaseStoreError, LeaseToken,
    MemoryLeaseStore, PostgresLeaseStore, RedisLeaseStore, SqliteLeaseStore,
};
pub use station_lease::{backends, engine, store};

pub use control::{Admitted, ControlLease, LeaseAnswer};
pub use notice::{LeaseNotice, LeaseNoticeHook};

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::error_kind::ErrorKind;

/// The lease as anyone may see it (never the lease id): `GET lease` and the `lease` event.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    pub held: bool,
    pub owner: Option<String>,
    pub expires_in_ms: u64,
    /// When the current holder took it (RFC 3339, UTC); `None` while nobody holds it.
    pub since: Option<String>,
    /// Present while a safe state is owed after a lease that ran out and the station has not
    /// confirmed it yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub safe_state: Option<SafeStateView>,
    /// On the event of a lease that a safe stop ended: "safe-stopped by CALLER: REASON".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// While free but within the lock-delay after a lease that did not end cleanly: how long
    /// a new lease still waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
    /// With `lock_delay_ms`: why the lock-delay runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_delay_reason: Option<String>,
}

impl LeaseView {
    pub fn nobody() -> LeaseView {
        LeaseView {
            held: false,
            owner: None,
            expires_in_ms: 0,
            since: None,
            safe_state: None,
            ended: None,
            lock_delay_ms: None,
            lock_delay_reason: None,
        }
    }
}

/// A safe state still owed: after whose lease, how many tries so far and why the last failed,
/// where it is (written, read back), and how often a late change overrode it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SafeStateView {
    pub pending: bool,
    pub after: String,
    pub tries: u32,
    pub last_error: Option<String>,
    pub step: SafeStateStepView,
    /// Times a read back found a late change over the safe state (applied again each time).
    pub overridden: u32,
}

/// Where a safe state owed is: being written, being read back (right after its writes), or
/// read back right once and waiting `station.max_processing_ms` for its second read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SafeStateStepView {
    Writing,
    ReadingBack,
    SecondReadBack,
}

/// What a request needs of the lease; decided per route, enforced in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Changes nothing on the station: open to everyone.
    Open,
    /// Reads that accept cached values: open, but for a non-holder while someone else holds the
    /// lease, channels whose read consumes data come from the cache only.
    CachedRead,
    /// Reads from the hardware: the holder's, or anyone's while nobody holds the lease.
    ForcedRead,
    /// Changes to the station: like forced reads, and fenced at the link.
    Change,
}

/// The shortest and longest time to live a client may ask for, and the default.
pub const MIN_TTL: Duration = Duration::from_millis(1_000);
pub const MAX_TTL: Duration = Duration::from_millis(600_000);
pub const DEFAULT_TTL: Duration = Duration::from_millis(30_000);
/// The longest `waitMs` of `POST lease?waitMs=N`.
pub const MAX_WAIT: Duration = Duration::from_millis(60_000);

/// Why a lease operation or a request was refused; its kind is [`LeaseError::kind`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    #[error("TtlMs must be 1000 to 600000 (milliseconds); got {0}")]
    BadTtl(u64),
    #[error("waitMs must be 0 to 60000 (milliseconds); got {0}")]
    BadWait(String),
    /// An acquisition while someone else holds it.
    #[error("the lease is held by {owner} for another {}; try again later or wait with ?waitMs=N", seconds_left(*.expires_in))]
    HeldByOther { owner: String, expires_in: Duration },
    /// A change or forced read by someone who does not hold the lease.
    #[error("the station is leased: held by {owner} for another {}; only its holder may change the station or read it from the hardware (cached reads with MaxAgeMs work)", seconds_left(*.expires_in))]
    LockedBy { owner: String, expires_in: Duration },
    /// A request carrying an `X-Lease-Id` that is not the live lease.
    #[error("lease ended: the X-Lease-Id sent is not the live lease (it ran out, was released or was broken){}; acquire the lease again", now_held(.held_by))]
    LeaseEnded { held_by: Option<(String, Duration)> },
    /// A non-holder's cached read while someone else holds the lease, of a channel with
    /// nothing cached: only the holder reads the hardware.
    #[error("{channel} has no cached value, and only the lease holder may read the station's hardware{}: held by {owner} for another {}", if *.consuming { " (reading this channel consumes its data)" } else { "" }, seconds_left(*.expires_in))]
    NotCached {
        channel: String,
        consuming: bool,
        owner: String,
        expires_in: Duration,
    },
    #[error(
        "no such lease: it has ended (ran out, was released or was broken); acquire the lease again"
    )]
    NoSuchLease,
    #[error("nobody holds the lease")]
    NobodyHolds,
    #[error(
        "the admin break is off: set lease.admin_token in the gateway's config to use DELETE api/lease"
    )]
    AdminBreakOff,
    #[error(
        "breaking the lease needs the header Authorization: Bearer <lease.admin_token>; the one sent is missing or wrong"
    )]
    AdminTokenWrong,
    /// A change, forced read or acquisition while a lease is being ended: whose, how long ago
    /// it ended (when known), and the lock-delay new leases wait once it is finished.
    #[error("{}", ending_message(.owner, *.ended_ago, *.lock_delay_left))]
    Ending {
        owner: String,
        ended_ago: Option<Duration>,
        lock_delay_left: Option<Duration>,
    },
    /// A change, forced read or acquisition while the safe state after a lease that ran out is
    /// not yet confirmed by the station.
    #[error(
        "the safe state after {owner}'s lease is not yet confirmed by the station ({tries} tries; last: {last_error}); no change and no new lease until it is; the gateway keeps trying"
    )]
    SafeStatePending {
        owner: String,
        tries: u32,
        last_error: String,
    },
    /// An acquisition within the lock-delay after a lease whose changes the gateway cannot
    /// prove have all landed (one in doubt, or its end not recorded): a change of it may still
    /// land (a station that ignores SPEC.md §4), so the next holder waits. 409 with
    /// `Retry-After`: not now.
    #[error(
        "{after} {why}: a new lease waits the lock-delay (lease.lock_delay_ms), another {} ({} ms), so that no late change can land in the next one; try again then or wait with ?waitMs=N", seconds_left(*.wait), .wait.as_millis()
    )]
    LockDelay {
        /// What the delay follows: `A's lease`, or a change made without a lease.
        after: String,
        why: &'static str,
        wait: Duration,
    },
    /// A change or forced read sent without a lease within that lock-delay: 423 with
    /// `Retry-After`.
    #[error(
        "{after} {why}: no change and no hardware read until the lock-delay (lease.lock_delay_ms) is over, another {} ({} ms), so that no late change can land after this one; try again then", seconds_left(*.wait), .wait.as_millis()
    )]
    ChangeInLockDelay {
        after: String,
        why: &'static str,
        wait: Duration,
    },
    /// An acquisition before this gateway's link has met the station: it does not know yet
    /// what the station is owed (its ledger is read when the link meets it). 503 with
    /// `Retry-After`.
    #[error(
        "this gateway has not reached the station since it began serving it, so it does not know yet what the station is owed (a safe state, a lock-delay or changes in doubt left by whoever served it before): no lease is granted until its link has reached the station; try again in a moment, or wait in line with ?waitMs=N"
    )]
    StationNotMet { retry_in: Duration },
    /// An acquisition at a gateway that does not own the station's link now (a standby, or a
    /// link standing by on the station's identity): it names who serves the station. 503.
    #[error(transparent)]
    NotLinkOwner(#[from] NotLinkOwner),
    #[error("{0}")]
    Store(#[from] LeaseStoreError),
}

/// The kind of a lease backend's error: one that could not answer (unreachable, locked,
/// failed) leaves the lease's state unknown, never "held"; a semaphore asked for with other
/// slots than its holders' is a conflict.
pub fn store_error_kind(error: &LeaseStoreError) -> ErrorKind {
    match error {
        LeaseStoreError::CapacityConflict { .. } => ErrorKind::Conflict,
        _ => ErrorKind::LeaseStoreUnavailable,
    }
}

impl LeaseError {
    /// Its kind: someone else's lease or the lock-delay a conflict for an acquisition, a change
    /// without the lease locked, an unknown lease not found, the store's state unknown.
    pub fn kind(&self) -> ErrorKind {
        match self {
            LeaseError::BadTtl(_) | LeaseError::BadWait(_) => ErrorKind::BadRequest,
            LeaseError::HeldByOther { .. } | LeaseError::LockDelay { .. } => ErrorKind::Conflict,
            LeaseError::LockedBy { .. }
            | LeaseError::LeaseEnded { .. }
            | LeaseError::NotCached { .. }
            | LeaseError::Ending { .. }
            | LeaseError::ChangeInLockDelay { .. } => ErrorKind::Locked,
            LeaseError::SafeStatePending { .. } => ErrorKind::SafeStatePending,
            LeaseError::NoSuchLease | LeaseError::NobodyHolds | LeaseError::AdminBreakOff => {
                ErrorKind::NotFound
            }
            LeaseError::AdminTokenWrong => ErrorKind::Forbidden,
            LeaseError::Store(_) => ErrorKind::LeaseStoreUnavailable,
            LeaseError::StationNotMet { .. } => ErrorKind::StationNotReached,
            LeaseError::NotLinkOwner(not) => not.kind(),
        }
    }

    /// How long a client refused this should wait before it tries again, when that is known
    /// (for `Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LeaseError::LockDelay { wait, .. } | LeaseError::ChangeInLockDelay { wait, .. } => {
                Some(*wait)
            }
            LeaseError::StationNotMet { retry_in } => Some(*retry_in),
            _ => None,
        }
    }
}

/// The words of [`LeaseError::Ending`]: when the lease ended (never "just" 18 s later), and
/// the lock-delay still to wait after it.
fn ending_message(
    owner: &str,
    ended_ago: Option<Duration>,
    lock_delay_left: Option<Duration>,
) -> String {
    let when = match ended_ago {
        Some(ago) if ago >= Duration::from_secs(1) => {
            format!("ended {} s ago", ago.as_millis() / 1000)
        }
        _ => "has just ended".to_owned(),
    };
    let then = match lock_delay_left {
        Some(left) if !left.is_zero() => format!(
            "; then a new lease waits the lock-delay (lease.lock_delay_ms), another {} ({} ms)",
            seconds_left(left),
            left.as_millis()
        ),
        _ => String::new(),
    };
    format!(
        "the station is between leases: {owner}'s lease {when} and the gateway is finishing it (changes still at the station, then the safe state if it ran out){then}; try again in a moment"
    )
}

/// "12 s", rounded up so a lease with time left never says 0.
pub fn seconds_left(left: Duration) -> String {
    format!("{} s", left.as_millis().div_ceil(1000))
}

fn now_held(held_by: &Option<(String, Duration)>) -> String {
    match held_by {
        Some((owner, left)) => format!(
            "; it is now held by {owner} for another {}",
            seconds_left(*left)
        ),
        None => String::new(),
    }
}

/// Whole milliseconds, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A wall-clock time as RFC 3339 in UTC with milliseconds, e.g. `2024-05-01T12:00:00.123Z`.
pub fn rfc3339(time: SystemTime) -> String {
    crate::timestamp::rfc3339_millis(time)
}

/// Why a door may not act on the station: this process does not own its link now. The message
/// names who does (and where it serves) when that is known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotLinkOwner(pub(crate) String);

impl NotLinkOwner {
    /// 503 on HTTP, as a standby's answer to any request is.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::StandingBy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn rfc3339_formats_utc_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap_day = UNIX_EPOCH + Duration::from_millis(951_782_400_000 + 3_723_456);
        assert_eq!(rfc3339(leap_day), "2000-02-29T01:02:03.456Z");
        let later = UNIX_EPOCH + Duration::from_secs(1_735_689_599);
        assert_eq!(rfc3339(later), "2024-12-31T23:59:59.000Z");
    }

    #[test]
    fn time_left_rounds_up_to_whole_seconds() {
        assert_eq!(seconds_left(Duration::from_millis(11_001)), "12 s");
        assert_eq!(seconds_left(Duration::from_millis(12_000)), "12 s");
        assert_eq!(seconds_left(Duration::from_millis(1)), "1 s");
    }
}
