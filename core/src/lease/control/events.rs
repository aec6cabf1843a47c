//! What the lease machine is told ([`Event`]) and what it asks the shell to do ([`Action`]),
//! with the answers and records they carry. Plain data: the decisions are in `machine.rs`.

use std::net::SocketAddr;
use std::time::Duration;

use station_protocol::ValueError;
use tokio::time::Instant;

use super::super::store::{AcquireRequest, Acquisition, LeaseGrant, LeaseToken};
use super::super::{LeaseError, LeaseStoreError, LeaseView};
use super::LeaseAnswer;
use super::read_back::Differs;
pub(super) use super::state::ReadBackRound;
use super::state::{StoredEnd, StoredLockDelay};
use crate::link::{LinkError, SettleScope};

/// Who a new lease is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Grantee {
    /// The request being served (`POST lease`); `wait`: it may wait in line.
    Requester { wait: bool },
    /// The one waiting in line with this ticket.
    Waiter(u64),
}

/// Who asked the store to release the lease.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Releasing {
    /// Its holder (`DELETE lease/{id}`).
    Holder,
    /// An admin from `peer`; `broken` is the lease as it was when the break was asked.
    Admin {
        peer: SocketAddr,
        broken: Box<LeaseView>,
    },
}

/// Why a lease ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EndCause {
    /// Its holder released it.
    Released,
    /// An admin broke it.
    Broken { peer: SocketAddr },
    /// It ran out unreleased (its deadline passed, the store ended it first, or a renewal came
    /// too late): the safe state is owed, when one is configured.
    RanOut,
    /// Taken for a client that had stopped waiting: nobody has its id.
    Unclaimed,
    /// Someone with control pressed the safe stop (`POST /v1/safe-stop`): the safe state is
    /// owed, when one is configured.
    SafeStopped { by: String, reason: String },
}

impl EndCause {
    /// Whether a lease that ended so leaves the safe state to apply (when one is configured).
    pub(super) fn owes_safe_state(&self) -> bool {
        matches!(self, EndCause::RanOut | EndCause::SafeStopped { .. })
    }
}

/// What the machine is told.
#[derive(Debug)]
pub(super) enum Event {
    /// `POST lease` (`presented`: the `X-Lease-Id` sent); `line_empty`: nobody waits in line.
    Acquire {
        owner: String,
        ttl: Duration,
        presented: Option<String>,
        wait: bool,
        line_empty: bool,
    },
    /// The free lease may go to the first one still waiting in line.
    NextInLine {
        ticket: u64,
        owner: String,
        ttl: Duration,
    },
    /// `PUT lease/{id}`.
    Renew {
        presented: String,
        ttl: Option<Duration>,
    },
    /// `DELETE lease/{id}`.
    Release { presented: String },
    /// `DELETE lease` by an admin, asked at `asked_at`: it ends the lease held then, not one
    /// granted while it waited for its turn.
    Break { peer: SocketAddr, asked_at: Instant },
    /// `POST /v1/safe-stop` by `by` (anyone with control): the lease ends, if one is held,
    /// and the safe state is applied whether or not one was.
    SafeStop { by: String, reason: String },
    /// Time passed: a lease past its deadline ends; a safe state owed is tried when due.
    Deadline,
    /// The store's answer to `Take`.
    Taken {
        grantee: Option<Grantee>,
        asked_at: Instant,
        answer: Result<Acquisition, LeaseStoreError>,
    },
    /// The store's answer to `Refresh`.
    Refreshed {
        token: LeaseToken,
        asked_at: Instant,
        answer: Result<Option<LeaseGrant>, LeaseStoreError>,
    },
    /// The store's answer to `Release`.
    Released {
        token: LeaseToken,
        releasing: Releasing,
        answer: Result<bool, LeaseStoreError>,
    },
    /// The changes `Settle` waited for have left the station; `lapsed_at`: when the last of
    /// them left doubt unanswered (it outlived `station.max_processing_ms` since it was sent,
    /// whatever became of the link), if one did.
    ChangesSettled { lapsed_at: Option<Instant> },
    /// The station's answer to the safe state: `Err` says why it is not confirmed.
    SafeStateAnswered(Result<(), SafeStateError>),
    /// The safe state's channels read back from the hardware: those that differ from it
    /// (none: it holds), or why they could not be read.
    SafeStateReadBack(Result<Vec<Differs>, SafeStateError>),
    /// The new lease with `fence` could not be delivered: its client had gone away.
    Unclaimed { fence: u64 },
    /// The station link is up (`connected`) or down, in its `generation`.
    Link { connected: bool, generation: u64 },
    /// At start (or a standby's takeover): the store's live lease, if any (asked at
    /// `asked_at`).
    Resumed {
        held: Option<LeaseGrant>,
        asked_at: Instant,
    },
    /// The link met the station and its ledger was read: the owner of a lease that ended unseen
    /// whose safe state is owed, and what the ledger keeps of the last lease's end (the
    /// lock-delay in force, an end nobody recorded). Leases may be granted from now on.
    Adopted {
        owed_after: Option<String>,
        end: StoredEnd,
    },
}

/// The answer to the request being served.
#[derive(Debug)]
pub(super) enum Answer {
    /// Renewed (acquire or renew with the live lease's id).
    Renewed(LeaseAnswer),
    Released,
    Broken(LeaseView),
    Refused(LeaseError),
    /// It waits in line (for at most its wait).
    Queued,
    SafeStopped(SafeStopOutcome),
}

/// What a safe stop did: the lease it ended (owner, fence), if any, and the safe state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeStopOutcome {
    pub ended: Option<(String, u64)>,
    pub safe_state: SafeStopState,
}

/// The safe state after a safe stop, when the stop is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SafeStopState {
    /// `[lease] safe_state` is empty: nothing to apply.
    NotConfigured,
    /// The station confirmed every write, and the channels read back right.
    Confirmed,
    /// The safe state was already in place, nothing written and no new lock-delay: read back
    /// right before any write (nobody held the lease), or read back right once already by an
    /// end still being finished.
    AlreadySafe,
    /// Not confirmed yet (`why`, after `tries`): the lease task retries it with back-off, and
    /// nobody changes the station or takes the lease until it is.
    NotConfirmed { tries: u32, why: String },
}

/// Something to record: a log line, a counter and, where one exists, the audit notice.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Record {
    Taken {
        owner: String,
        fence: u64,
    },
    Ended {
        owner: String,
        fence: u64,
        cause: EndCause,
    },
    /// A renewal the store confirmed only after the lease's deadline.
    RenewedTooLate {
        owner: String,
        fence: u64,
    },
    SafeStateApplied {
        owner: String,
        fence: u64,
    },
    /// A safe stop pressed by `by`, and the lease it ended (owner, fence), if any.
    SafeStopped {
        by: String,
        reason: String,
        ended: Option<(String, u64)>,
    },
    SafeStateFailed {
        owner: String,
        fence: u64,
        tries: u32,
        why: String,
        retry_in: Duration,
    },
    /// The safe state read back otherwise than written: a late change overrode it (`round`:
    /// found by the read back right after the writes or by the one after the longest
    /// processing); it is applied again (`retry_in` from now).
    SafeStateOverridden {
        owner: String,
        fence: u64,
        round: ReadBackRound,
        differs: Vec<Differs>,
        retry_in: Duration,
    },
    /// The safe state read back right the second time: it is done.
    SafeStateReadBack {
        owner: String,
        fence: u64,
    },
}

/// What the shell must do, in order.
#[derive(Debug)]
pub(super) enum Action {
    /// Asks the store for the lease (first marking a safe state owed, when `remember_owed`,
    /// and that a lease's end is pending, when `mark_end_pending`); the answer comes back as
    /// [`Event::Taken`]. `grantee` `None`: a renewal by acquire.
    Take {
        grantee: Option<Grantee>,
        request: AcquireRequest,
        asked_at: Instant,
        remember_owed: bool,
        mark_end_pending: bool,
    },
    /// Asks the store to extend `token`; the answer comes back as [`Event::Refreshed`].
    Refresh {
        token: LeaseToken,
        ttl: Option<Duration>,
        asked_at: Instant,
    },
    /// Asks the store to release `token`; the answer comes back as [`Event::Released`].
    Release {
        token: LeaseToken,
        releasing: Releasing,
    },
    /// Ends `token` in the store too, whatever it answers (a failure is logged).
    Forget(LeaseToken),
    /// Clears the store's mark that a safe state is owed.
    ForgetOwed,
    /// Records the end of a lease in the store, on the gateway's task (never a request's):
    /// the lock-delay it owes, if any (kept there until it is over by the store's clock; also
    /// one a restart or takeover found owed), then clears the mark that its end is pending.
    StoreEnd(Option<StoredLockDelay>),
    /// Waits until no change `scope` covers (one lease's fence at its end; every change before
    /// a grant or a safe stop with nobody holding the lease) may still be at the station; then
    /// [`Event::ChangesSettled`].
    Settle(SettleScope),
    /// Writes the safe state owed after `after`'s lease; then [`Event::SafeStateAnswered`].
    SendSafeState {
        after: String,
    },
    /// Reads the safe state's channels from the hardware and compares them with it; then
    /// [`Event::SafeStateReadBack`].
    ReadBackSafeState,
    /// Sends the lease as anyone may see it on the `lease` event.
    Publish(LeaseView),
    Record(Record),
    /// The answer to the request being served (given once the transition is over).
    Answer(Answer),
    /// A new lease for `grantee`; one it cannot take comes back as [`Event::Unclaimed`].
    Grant {
        grantee: Grantee,
        answer: LeaseAnswer,
    },
    /// The free lease may go to the first one waiting in line, if any.
    HandOver,
    /// The waiter with `ticket` goes back to the front of the line (the store did not give it
    /// the lease).
    BackInLine(u64),
}

/// Why the station has not confirmed the safe state.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum SafeStateError {
    #[error("the station has no channel {0} (yet: the link may not have listed its channels)")]
    NoChannel(String),
    /// A configuration mistake no retry can mend: said every time.
    #[error("bad safe-state value {value:?} for {channel}: {why}")]
    BadValue {
        value: String,
        channel: String,
        why: ValueError,
    },
    #[error("{0}")]
    Link(LinkError),
    /// The station refused these channels (name, the station's message).
    #[error("{}", refused_text(.0))]
    Refused(Vec<(String, String)>),
    /// The station would not read these channels back (name, why).
    #[error("{}", unread_text(.0))]
    ReadBack(Vec<(String, String)>),
}

fn unread_text(unread: &[(String, String)]) -> String {
    let unread: Vec<String> = unread
        .iter()
        .map(|(name, why)| format!("the safe state could not be read back from {name}: {why}"))
        .collect();
    unread.join("; ")
}

fn refused_text(refused: &[(String, String)]) -> String {
    let refusals: Vec<String> = refused
        .iter()
        .map(|(name, why)| format!("the station refused {name}: {why}"))
        .collect();
    refusals.join("; ")
}
