//! The control lease as admission and the link's guards see it: free, held (a live lease,
//! or one past its deadline not yet settled) or ending; and the snapshot of it the link's send
//! guards judge.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::super::store::{LeaseGrant, LeaseToken};
use super::super::{LeaseError, LeaseView, SafeStateStepView, SafeStateView, millis, rfc3339};
use super::{LeaseAnswer, OtherHolder};
use crate::link::LeaseSnapshot;
#[cfg(test)]
use crate::link::{GuardRefusal, Guarded};

/// The longest the control lease waits for the store to take or renew a lease (a call not
/// answered by then has failed). A lease's deadline is counted from before the call, so the
/// store's copy of it ends at most this much later than the deadline its holder was told.
pub(super) const STORE_CALL_BOUND: Duration = Duration::from_secs(2);

/// The live lease as this process knows it.
#[derive(Clone)]
pub(super) struct LiveLease {
    pub(super) token: LeaseToken,
    pub(super) owner: String,
    pub(super) fence: u64,
    pub(super) since: SystemTime,
    pub(super) expires_at: Instant,
    /// When its holder was given it (`None`: taken, not yet given): a break asked before
    /// then is not for it.
    pub(super) granted_at: Option<Instant>,
}

impl LiveLease {
    /// `asked_at` is taken before the store was asked, so the local expiry is never later than
    /// the store's.
    pub(super) fn from_grant(grant: LeaseGrant, asked_at: Instant) -> LiveLease {
        LiveLease {
            token: grant.token,
            owner: grant.owner,
            fence: grant.fence,
            since: grant.since,
            expires_at: asked_at + grant.expires_in,
            granted_at: None,
        }
    }

    /// The store's live lease, found at start (`asked_at`: before the store was asked). The
    /// store's copy may end up to [`STORE_CALL_BOUND`] after the deadline its holder was last
    /// told (that call was carried out late), so the lease resumed here ends that much sooner
    /// than the store says: never later than its holder was told, whatever the call took. A
    /// lease with less left than that is resumed past its deadline, and ends as run out.
    pub(super) fn resumed(grant: LeaseGrant, asked_at: Instant) -> LiveLease {
        let expires_in = grant.expires_in.saturating_sub(STORE_CALL_BOUND);
        let mut resumed = LiveLease::from_grant(
            LeaseGrant {
                expires_in,
                ..grant
            },
            asked_at,
        );
        resumed.granted_at = Some(asked_at);
        resumed
    }

    pub(super) fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }

    pub(super) fn expires_in(&self, now: Instant) -> Duration {
        self.expires_at.saturating_duration_since(now)
    }

    pub(super) fn view(&self, now: Instant) -> LeaseView {
        LeaseView {
            held: true,
            owner: Some(self.owner.clone()),
            expires_in_ms: millis(self.expires_in(now)),
            since: Some(rfc3339(self.since)),
            safe_state: None,
            ended: None,
            lock_delay_ms: None,
            lock_delay_reason: None,
        }
    }

    pub(super) fn answer(&self, now: Instant) -> LeaseAnswer {
        LeaseAnswer {
            lease_id: self.token.as_str().to_owned(),
            owner: self.owner.clone(),
            expires_in_ms: millis(self.expires_in(now)),
            held: true,
            since: rfc3339(self.since),
            fence: self.fence,
        }
    }

    pub(super) fn other_holder(&self, now: Instant) -> OtherHolder {
        OtherHolder {
            owner: self.owner.clone(),
            expires_in: self.expires_in(now),
        }
    }

    pub(super) fn ending(&self, safe_state_owed: bool) -> EndingLease {
        EndingLease::new(self.owner.clone(), self.fence, safe_state_owed)
    }
}

/// A lease that has ended and that the gateway is still finishing (its safe state, when owed).
#[derive(Clone, Debug)]
pub(super) struct EndingLease {
    pub(super) owner: String,
    /// The ended lease's fence (0 when it lapsed while the gateway was down and is unknown).
    pub(super) fence: u64,
    /// It ran out unreleased and the station has not yet confirmed the safe state.
    pub(super) safe_state_owed: bool,
    /// Tries of the safe state so far, and why the last one failed.
    pub(super) tries: u32,
    pub(super) last_error: Option<String>,
    /// Where the safe state owed is: written, read back, or waiting for its second read back.
    pub(super) step: SafeStateStep,
    /// Times a late change overrode the safe state during this end (found by a read back).
    pub(super) overridden: u32,
    /// The lock-delay the next holder waits once this end is finished, when it did not end
    /// cleanly.
    pub(super) lock_delay: Option<LockDelay>,
    /// When it ended (`None`: before this process started), for the refusal's words.
    pub(super) ended_at: Option<Instant>,
    /// Its changes may still be at the station and nothing has waited for them yet (an end
    /// taken over with the station's ledger, its doubts inherited with it): every change in
    /// doubt settles before the safe state is tried.
    pub(super) settle_first: bool,
}

/// Until `until`, after `after`'s lease (`why`: one of its changes may still land), nobody may
/// take a new lease or change the station without one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LockDelay {
    pub(super) until: Instant,
    pub(super) after: String,
    pub(super) why: LockDelayWhy,
}

impl LockDelay {
    pub(super) fn is_running(&self, now: Instant) -> bool {
        self.until > now
    }

    /// What the delay follows, as a refusal names it: `A's lease`, or a change made without
    /// a lease.
    pub(super) fn subject(&self) -> String {
        match self.why {
            LockDelayWhy::LeaselessDoubt => self.after.clone(),
            _ => format!("{}'s lease", self.after),
        }
    }

    /// The refusal of a new lease (409, with how long to wait).
    pub(super) fn refusal(&self, now: Instant) -> LeaseError {
        LeaseError::LockDelay {
            after: self.subject(),
            why: self.why.text(),
            wait: self.until.saturating_duration_since(now),
        }
    }

    /// The refusal of a change or forced read sent without a lease (423, with how long to
    /// wait).
    pub(super) fn change_refusal(&self, now: Instant) -> LeaseError {
        LeaseError::ChangeInLockDelay {
            after: self.subject(),
            why: self.why.text(),
            wait: self.until.saturating_duration_since(now),
        }
    }

    /// Why, in the words of `GET lease`.
    pub(super) fn reason(&self) -> String {
        format!(
            "{} {}: it may still land at the station, so no new lease and no change is taken until the lock-delay (lease.lock_delay_ms) is over",
            self.subject(),
            self.why.text()
        )
    }
}

/// Why the gateway cannot prove that no change of an ended lease can still land, so that the
/// next holder waits the lock-delay. A lease that ran out, was broken or was safe-stopped with
/// every change answered (and its safe state read back) frees at once; `RanOut`,
/// `Broken` and `SafeStopped` are only read from the records of gateways before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LockDelayWhy {
    RanOut,
    Broken,
    SafeStopped,
    /// A change of it left doubt unanswered (it outlived `station.max_processing_ms`, or the
    /// link went down while it was at the station).
    ChangesInDoubt,
    /// A restart or a standby's takeover found it ended in the store with no end recorded:
    /// how it ended (and whether a change of it is still in doubt) is unknown.
    LostTrack,
    /// A change made without a lease (or one a gateway before this one left at the station)
    /// outlived `station.max_processing_ms` unanswered: it delays the next grant as a
    /// holder's would.
    LeaselessDoubt,
}

impl LockDelayWhy {
    pub(super) fn text(self) -> &'static str {
        match self {
            LockDelayWhy::RanOut => "ran out unreleased",
            LockDelayWhy::Broken => "was broken",
            LockDelayWhy::SafeStopped => "was safe-stopped",
            LockDelayWhy::ChangesInDoubt => "ended with changes in doubt",
            LockDelayWhy::LostTrack => {
                "ended while no gateway recorded how (found ended in the store after a restart or a standby's takeover)"
            }
            LockDelayWhy::LeaselessDoubt => "was left in doubt",
        }
    }

    /// Its name in the lease store's record of the lock-delay.
    pub(super) fn code(self) -> &'static str {
        match self {
            LockDelayWhy::RanOut => "ran-out",
            LockDelayWhy::Broken => "broken",
            LockDelayWhy::SafeStopped => "safe-stopped",
            LockDelayWhy::ChangesInDoubt => "changes-in-doubt",
            LockDelayWhy::LostTrack => "lost-track",
            LockDelayWhy::LeaselessDoubt => "leaseless-doubt",
        }
    }

    /// The reason a store record names; one this version does not know is `LostTrack` (the
    /// delay is honoured whatever its reason).
    pub(super) fn from_code(code: &str) -> LockDelayWhy {
        [
            LockDelayWhy::RanOut,
            LockDelayWhy::Broken,
            LockDelayWhy::SafeStopped,
            LockDelayWhy::ChangesInDoubt,
            LockDelayWhy::LeaselessDoubt,
        ]
        .into_iter()
        .find(|why| why.code() == code)
        .unwrap_or(LockDelayWhy::LostTrack)
    }
}

/// The lock-delay as the lease store keeps it (`<lease name>:lock-delay`): after whose lease
/// (and its fence), why, and how long it has left by the store's clock, so that a restart or a
/// standby that takes over honours it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StoredLockDelay {
    pub(super) after: String,
    pub(super) fence: u64,
    pub(super) why: LockDelayWhy,
    pub(super) left: Duration,
}

/// What a restart or a takeover finds in the store about the end of the last lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct StoredEnd {
    /// The lock-delay recorded in force, if any.
    pub(super) lock_delay: Option<StoredLockDelay>,
    /// The owner of a lease taken whose end was never recorded (`<lease name>:end-pending`).
    pub(super) end_pending: Option<String>,
}

/// Which read back of the safe state: right after the station confirmed its writes, or
/// `station.max_processing_ms` later (when any change still at the station has landed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadBackRound {
    First,
    Second,
}

/// Where a safe state owed is: it is done only once written and read back right twice, right
/// after the writes and again `station.max_processing_ms` later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SafeStateStep {
    /// Its channels are to be read back before anything is written (a safe stop pressed while
    /// nobody held the lease): right, nothing is written; otherwise, [`SafeStateStep::Write`].
    Check,
    /// Its writes are to be sent (again).
    Write,
    /// Its channels are to be read back (again).
    ReadBack(ReadBackRound),
    /// Read back right once; the second read back is due at this instant.
    SecondReadBackAt(Instant),
}

impl EndingLease {
    pub(super) fn new(owner: String, fence: u64, safe_state_owed: bool) -> EndingLease {
        EndingLease {
            owner,
            fence,
            safe_state_owed,
            tries: 0,
            last_error: None,
            step: SafeStateStep::Write,
            overridden: 0,
            lock_delay: None,
            ended_at: None,
            settle_first: false,
        }
    }

    pub(super) fn refusal(&self, now: Instant) -> LeaseError {
        if self.safe_state_owed && self.tries > 0 {
            LeaseError::SafeStatePending {
                owner: self.owner.clone(),
                tries: self.tries,
                last_error: self.last_error.clone().unwrap_or_default(),
            }
        } else {
            LeaseError::Ending {
                owner: self.owner.clone(),
                ended_ago: self.ended_at.map(|at| now.saturating_duration_since(at)),
                lock_delay_left: self
                    .lock_delay
                    .as_ref()
                    .map(|locked| locked.until.saturating_duration_since(now)),
            }
        }
    }

    pub(super) fn view(&self) -> LeaseView {
        LeaseView {
            safe_state: self.safe_state_owed.then(|| SafeStateView {
                pending: true,
                after: self.owner.clone(),
                tries: self.tries,
                last_error: self.last_error.clone(),
                step: match self.step {
                    SafeStateStep::Write => SafeStateStepView::Writing,
                    SafeStateStep::Check | SafeStateStep::ReadBack(_) => {
                        SafeStateStepView::ReadingBack
                    }
                    SafeStateStep::SecondReadBackAt(_) => SafeStateStepView::SecondReadBack,
                },
                overridden: self.overridden,
            }),
            ..LeaseView::nobody()
        }
    }
}

/// The control lease as admission and the link's guards see it.
#[derive(Clone)]
pub(super) enum LeaseState {
    Free,
    /// Nobody holds it, and until the lock-delay is over nobody may take it or change the
    /// station without it: a change of the lease that ended last may still land.
    Locked(LockDelay),
    /// Held; past its deadline it has ended for admission and the link, even before the
    /// expiry task settles it.
    Held(LiveLease),
    /// Ended and being finished: no change, no forced read, no new lease until it is free.
    Ending(EndingLease),
}

impl LeaseState {
    /// The live lease at `now`, if any.
    pub(super) fn live(&self, now: Instant) -> Option<&LiveLease> {
        match self {
            LeaseState::Held(live) if live.is_live(now) => Some(live),
            _ => None,
        }
    }

    /// Free at `now`: nobody holds it, and no lock-delay runs.
    pub(super) fn is_free(&self, now: Instant) -> bool {
        match self {
            LeaseState::Free => true,
            LeaseState::Locked(delay) => !delay.is_running(now),
            _ => false,
        }
    }

    /// The lock-delay running at `now`, if any.
    pub(super) fn lock_delay(&self, now: Instant) -> Option<&LockDelay> {
        match self {
            LeaseState::Locked(delay) if delay.is_running(now) => Some(delay),
            _ => None,
        }
    }

    /// Why nobody may change the station now although nobody holds a live lease: a lease past
    /// its deadline not yet settled, one being finished, or the lock-delay after one.
    pub(super) fn between_leases(&self, now: Instant) -> Option<LeaseError> {
        match self {
            LeaseState::Locked(delay) if delay.is_running(now) => Some(delay.change_refusal(now)),
            LeaseState::Held(live) if !live.is_live(now) => Some(LeaseError::Ending {
                owner: live.owner.clone(),
                ended_ago: Some(now.saturating_duration_since(live.expires_at)),
                lock_delay_left: None,
            }),
            LeaseState::Ending(ending) => Some(ending.refusal(now)),
            _ => None,
        }
    }
}

impl LeaseState {
    /// The state as the link's send guards judge it ([`LeaseSnapshot`]), published on every
    /// transition.
    pub(super) fn snapshot(&self) -> LeaseSnapshot {
        match self {
            LeaseState::Free => LeaseSnapshot::Free,
            LeaseState::Locked(delay) => LeaseSnapshot::LockDelay {
                after: delay.subject(),
                until: delay.until,
            },
            LeaseState::Held(live) => LeaseSnapshot::Held {
                owner: live.owner.clone(),
                fence: live.fence,
                until: live.expires_at,
            },
            LeaseState::Ending(ending) => LeaseSnapshot::Ending {
                owner: ending.owner.clone(),
                safe_state_pending: (ending.safe_state_owed && ending.tries > 0)
                    .then(|| (ending.tries, ending.last_error.clone().unwrap_or_default())),
            },
        }
    }
}

/// The send guard's decision: may a change (or consuming read: `what`) admitted under
/// `admitted_fence` (`None`: while nobody held the lease) be sent at `now`, given `state`?
#[cfg(test)]
pub(super) fn guard_check(
    state: &LeaseState,
    admitted_fence: Option<u64>,
    what: Guarded,
    now: Instant,
) -> Result<(), GuardRefusal> {
    state.snapshot().admits(admitted_fence, what, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(owed: bool, tries: u32) -> LeaseState {
        let mut ending = EndingLease::new("A".into(), 7, owed);
        ending.tries = tries;
        ending.last_error = (tries > 0).then(|| "the station did not answer".to_owned());
        LeaseState::Ending(ending)
    }

    /// The send guards are told a safe state is pending (and refuse with its tries and last
    /// error) only while one is owed and was tried; owed and not yet tried, or not owed at all,
    /// the station is only between leases.
    #[test]
    fn a_safe_state_is_pending_for_the_guards_only_while_owed_and_tried() {
        let pending = |state: LeaseState| match state.snapshot() {
            LeaseSnapshot::Ending {
                safe_state_pending, ..
            } => safe_state_pending,
            other => panic!("not ending: {other:?}"),
        };
        assert_eq!(
            pending(ending(true, 1)),
            Some((1, "the station did not answer".to_owned()))
        );
        assert_eq!(pending(ending(true, 0)), None);
        assert_eq!(pending(ending(false, 2)), None);
        assert_eq!(pending(ending(false, 0)), None);
    }
}
