//! The control lease as admission and the link's guards see it: free, held (a live lease,
//! or one past its deadline not yet settled) or ending; and the send guard's decision.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::super::store::{LeaseGrant, LeaseToken};
use super::super::{LeaseError, LeaseView, SafeStateView, millis, rfc3339};
use super::{LeaseAnswer, OtherHolder};
use crate::link::{GuardRefusal, Guarded};

/// The live lease as this process knows it.
#[derive(Clone)]
pub(super) struct LiveLease {
    pub(super) token: LeaseToken,
    pub(super) owner: String,
    pub(super) fence: u64,
    pub(super) since: SystemTime,
    pub(super) expires_at: Instant,
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
        }
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
        EndingLease {
            owner: self.owner.clone(),
            fence: self.fence,
            safe_state_owed,
            tries: 0,
            last_error: None,
        }
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
}

impl EndingLease {
    pub(super) fn refusal(&self) -> LeaseError {
        if self.safe_state_owed && self.tries > 0 {
            LeaseError::SafeStatePending {
                owner: self.owner.clone(),
                tries: self.tries,
                last_error: self.last_error.clone().unwrap_or_default(),
            }
        } else {
            LeaseError::Ending {
                owner: self.owner.clone(),
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
            }),
            ..LeaseView::nobody()
        }
    }
}

/// The control lease as admission and the link's guards see it.
#[derive(Clone)]
pub(super) enum LeaseState {
    Free,
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

    /// Why nobody may change the station now although nobody holds a live lease: a lease past
    /// its deadline not yet settled, or one being finished.
    pub(super) fn between_leases(&self, now: Instant) -> Option<LeaseError> {
        match self {
            LeaseState::Held(live) if !live.is_live(now) => Some(LeaseError::Ending {
                owner: live.owner.clone(),
            }),
            LeaseState::Ending(ending) => Some(ending.refusal()),
            _ => None,
        }
    }
}

/// The send guard's decision: may a change (or consuming read: `what`) admitted under
/// `admitted_fence` (`None`: while nobody held the lease) be sent at `now`, given `state`?
pub(super) fn guard_check(
    state: &LeaseState,
    admitted_fence: Option<u64>,
    what: Guarded,
    now: Instant,
) -> Result<(), GuardRefusal> {
    match (admitted_fence, state) {
        (Some(admitted), LeaseState::Held(current))
            if current.fence == admitted && current.is_live(now) =>
        {
            Ok(())
        }
        (None, LeaseState::Free) => Ok(()),
        (Some(admitted), LeaseState::Held(current)) if current.fence != admitted => {
            Err(GuardRefusal::ChangedHands {
                what,
                admitted,
                owner: current.owner.clone(),
                current: current.fence,
            })
        }
        (Some(admitted), _) => Err(GuardRefusal::LeaseEnded { what, admitted }),
        (None, LeaseState::Held(current)) if current.is_live(now) => Err(GuardRefusal::Leased {
            what,
            owner: current.owner.clone(),
        }),
        (None, LeaseState::Held(current)) => Err(GuardRefusal::LeasedAndEnded {
            what,
            owner: current.owner.clone(),
        }),
        (None, LeaseState::Ending(ending)) if ending.safe_state_owed && ending.tries > 0 => {
            Err(GuardRefusal::SafeStatePending {
                what,
                owner: ending.owner.clone(),
                tries: ending.tries,
                last_error: ending.last_error.clone().unwrap_or_default(),
            })
        }
        (None, LeaseState::Ending(ending)) => Err(GuardRefusal::BetweenLeases {
            what,
            owner: ending.owner.clone(),
        }),
    }
}
