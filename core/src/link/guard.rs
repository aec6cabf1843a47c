//! The send guard: the check the link task runs just before a change goes on the wire, with the
//! lease fence the change was admitted under, and why it refuses ([`GuardRefusal`]).

use std::fmt;
use std::sync::Arc;

/// A check run by the link task just before a change is put on the wire; a [`GuardRefusal`]
/// refuses it with [`LinkError::Refused`](super::LinkError::Refused) and it is never sent. This
/// is where lease fencing happens.
///
/// It carries the lease fence the change was admitted under, so the link knows which changes
/// of a given lease are still at the station.
#[derive(Clone)]
pub struct SendGuard {
    fence: Option<u64>,
    check: Arc<GuardCheck>,
}

type GuardCheck = dyn Fn() -> Result<(), GuardRefusal> + Send + Sync;

/// What a guard guards: a change, or a read of a channel whose read consumes data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarded {
    Change,
    Read,
}

impl fmt::Display for Guarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Guarded::Change => "change",
            Guarded::Read => "read",
        })
    }
}

/// Why a change (or a consuming read) was refused at the link before it was sent. `admitted`
/// is the lease fence it was admitted under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardRefusal {
    /// The lease it was admitted under was replaced by `owner`'s with fence `current`.
    #[error(
        "lease ended: the lease this {what} was admitted under (fence {admitted}) was replaced by {owner}'s (fence {current}) before the {what} reached the station; it was not sent"
    )]
    ChangedHands {
        what: Guarded,
        admitted: u64,
        owner: String,
        current: u64,
    },
    /// The lease it was admitted under ran out, was released or was broken.
    #[error(
        "lease ended: the lease this {what} was admitted under (fence {admitted}) ran out or was released before the {what} reached the station; it was not sent"
    )]
    LeaseEnded { what: Guarded, admitted: u64 },
    /// Admitted while nobody held the lease; `owner` holds it now.
    #[error("the station was leased by {owner} before this {what} reached it; it was not sent")]
    Leased { what: Guarded, owner: String },
    /// Admitted while nobody held the lease; `owner` took it since, and it has just ended.
    #[error(
        "the station was leased by {owner} (whose lease has just ended) before this {what} reached it; it was not sent"
    )]
    LeasedAndEnded { what: Guarded, owner: String },
    /// Admitted while nobody held the lease; `owner`'s lease, taken since, is being finished.
    #[error(
        "the station is between leases: {owner}'s lease has just ended and the gateway is finishing it (changes still at the station, then the safe state if it ran out); try again in a moment; this {what} was not sent"
    )]
    BetweenLeases { what: Guarded, owner: String },
    /// Admitted while nobody held the lease; the lock-delay after `after`'s lease runs now.
    #[error(
        "the station waits the lock-delay after {after}'s lease (one of its changes may still land); no change until it is over; this {what} was not sent"
    )]
    LockDelay { what: Guarded, after: String },
    /// Admitted while nobody held the lease; the safe state after `owner`'s lease, taken
    /// since, is not yet confirmed.
    #[error(
        "the safe state after {owner}'s lease is not yet confirmed by the station ({tries} tries; last: {last_error}); no change and no new lease until it is; the gateway keeps trying; this {what} was not sent"
    )]
    SafeStatePending {
        what: Guarded,
        owner: String,
        tries: u32,
        last_error: String,
    },
    /// The access rules refuse it: an interlock that no longer holds at send time (or a rule,
    /// at admission).
    #[error("{0}")]
    Access(Box<crate::rules::Refusal>),
    /// A read of channels whose read consumes data, asked without a guard at all.
    #[error("reading these channels consumes data, and this read carries no lease check")]
    NoLeaseCheck,
}

impl GuardRefusal {
    /// The lease fence the refused request was admitted under (`None`: while nobody held it,
    /// or with no guard).
    pub fn admitted_fence(&self) -> Option<u64> {
        match self {
            GuardRefusal::ChangedHands { admitted, .. }
            | GuardRefusal::LeaseEnded { admitted, .. } => Some(*admitted),
            _ => None,
        }
    }
}

impl SendGuard {
    /// A guard for a change admitted under the lease with `fence` (`None`: nobody held it).
    pub fn new(
        fence: Option<u64>,
        check: impl Fn() -> Result<(), GuardRefusal> + Send + Sync + 'static,
    ) -> SendGuard {
        SendGuard {
            fence,
            check: Arc::new(check),
        }
    }

    /// The lease fence the change was admitted under.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Whether the change may still be sent; the reason it may not.
    pub fn check(&self) -> Result<(), GuardRefusal> {
        (self.check)()
    }
}

/// Calling a guard runs its check, as when it was a plain closure.
impl std::ops::Deref for SendGuard {
    type Target = GuardCheck;

    fn deref(&self) -> &GuardCheck {
        &*self.check
    }
}
