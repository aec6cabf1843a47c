//! The send guard: what a change must still hold when the link task is about to put it on the
//! wire, as data ([`SendGuard`]): the lease fence it was admitted under, the lease state it is
//! judged against ([`LeaseSnapshot`], published by the lease control through a
//! [`LeaseWatch`]) and the interlocks it needs ([`Interlocks`], named by the access rules,
//! judged against the value cache). [`SendGuard::judge`] is the decision, pure, with the
//! snapshots and the time passed in; [`GuardRefusal`] says why it refuses.
//!
//! The link knows no access rule: an interlock that does not hold comes back as
//! [`GuardRefusal::Interlock`] (which condition, what it read), and whoever set the interlocks
//! renders it in the rules' words; a refusal the rules made elsewhere travels as
//! [`GuardRefusal::Forbidden`], its words as given.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::cache::ValueCache;

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

/// The control lease as a send guard judges it: the lease control publishes one whenever its
/// state changes ([`LeaseWatch::publish`], under the same lock as the change), so a guard
/// judged after a transition sees it. Deadlines are instants: whether a lease is still live,
/// or a lock-delay still runs, is decided at the moment of judging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseSnapshot {
    /// Nobody holds it.
    Free,
    /// Nobody holds it; until `until` nobody may change the station without it (the
    /// lock-delay after `after`'s lease).
    LockDelay { after: String, until: Instant },
    /// `owner` holds it under `fence` until `until` (past it, it has ended for the guard even
    /// before the lease control settles it).
    Held {
        owner: String,
        fence: u64,
        until: Instant,
    },
    /// `owner`'s lease ended and is being finished; `safe_state_pending`: its safe state is
    /// owed and was tried (how often, and the last failure).
    Ending {
        owner: String,
        safe_state_pending: Option<(u32, String)>,
    },
}

impl LeaseSnapshot {
    /// The lease half of the guard's decision: may a change (or consuming read: `what`)
    /// admitted under `admitted_fence` (`None`: while nobody held the lease) be sent at `now`?
    pub fn admits(
        &self,
        admitted_fence: Option<u64>,
        what: Guarded,
        now: Instant,
    ) -> Result<(), GuardRefusal> {
        match (admitted_fence, self) {
            (Some(admitted), LeaseSnapshot::Held { fence, until, .. })
                if *fence == admitted && *until > now =>
            {
                Ok(())
            }
            (None, LeaseSnapshot::Free) => Ok(()),
            (None, LeaseSnapshot::LockDelay { until, .. }) if *until <= now => Ok(()),
            (None, LeaseSnapshot::LockDelay { after, .. }) => Err(GuardRefusal::LockDelay {
                what,
                after: after.clone(),
            }),
            (Some(admitted), LeaseSnapshot::Held { owner, fence, .. }) if *fence != admitted => {
                Err(GuardRefusal::ChangedHands {
                    what,
                    admitted,
                    owner: owner.clone(),
                    current: *fence,
                })
            }
            (Some(admitted), _) => Err(GuardRefusal::LeaseEnded { what, admitted }),
            (None, LeaseSnapshot::Held { owner, until, .. }) if *until > now => {
                Err(GuardRefusal::Leased {
                    what,
                    owner: owner.clone(),
                })
            }
            (None, LeaseSnapshot::Held { owner, .. }) => Err(GuardRefusal::LeasedAndEnded {
                what,
                owner: owner.clone(),
            }),
            (
                None,
                LeaseSnapshot::Ending {
                    owner,
                    safe_state_pending: Some((tries, last_error)),
                },
            ) => Err(GuardRefusal::SafeStatePending {
                what,
                owner: owner.clone(),
                tries: *tries,
                last_error: last_error.clone(),
            }),
            (None, LeaseSnapshot::Ending { owner, .. }) => Err(GuardRefusal::BetweenLeases {
                what,
                owner: owner.clone(),
            }),
        }
    }
}

/// Where the lease control publishes its [`LeaseSnapshot`] and the guards it made read it.
/// Cheap to clone; reading takes no lock.
#[derive(Clone)]
pub struct LeaseWatch(Arc<ArcSwap<LeaseSnapshot>>);

impl LeaseWatch {
    pub fn new(first: LeaseSnapshot) -> LeaseWatch {
        LeaseWatch(Arc::new(ArcSwap::from_pointee(first)))
    }

    /// Replaces the snapshot every guard judges against from now on.
    pub fn publish(&self, snapshot: LeaseSnapshot) {
        self.0.store(Arc::new(snapshot));
    }

    /// The snapshot in force now.
    pub fn current(&self) -> Arc<LeaseSnapshot> {
        self.0.load_full()
    }
}

/// One condition on a change: `channel` must read `value` (a value's rendering, ASCII case
/// ignored), by a value the link read on this connection at most the interlocks' `max_age` ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interlock {
    pub channel: Arc<str>,
    pub value: Arc<str>,
}

/// The conditions a change needs right before it is sent, in order, and how old a value may be
/// to be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interlocks {
    pub conditions: Vec<Interlock>,
    pub max_age: Duration,
}

/// An interlock that does not hold: the condition (its index in [`Interlocks::conditions`])
/// and what its channel reads (`None`: no value read recently enough on this connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterlockBroken {
    pub index: usize,
    pub channel: Arc<str>,
    pub seen: Option<String>,
}

impl Interlocks {
    /// The first condition that does not hold by `values` at `now` (only values of link
    /// generation `generation`, read at most `max_age` before `now`, count).
    pub fn first_broken(
        &self,
        values: &ValueCache,
        generation: u64,
        now: std::time::Instant,
    ) -> Option<InterlockBroken> {
        self.conditions
            .iter()
            .enumerate()
            .find_map(|(index, condition)| {
                let seen = values.get(&condition.channel).filter(|cached| {
                    cached.generation == generation && cached.age(now) <= self.max_age
                });
                match seen {
                    Some(cached)
                        if cached.value.render().eq_ignore_ascii_case(&condition.value) =>
                    {
                        None
                    }
                    seen => Some(InterlockBroken {
                        index,
                        channel: condition.channel.clone(),
                        seen: seen.map(|cached| cached.value.render()),
                    }),
                }
            })
    }
}

/// A refusal made by a rule outside the link (the access rules), carried as its words: `by`
/// names what refused (a rule, for the counters), `message` is the answer's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forbidden {
    pub by: Arc<str>,
    pub message: String,
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Display for InterlockBroken {
    /// Neutral words, for a refusal nobody rendered in the words of whoever set the interlock.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.seen {
            Some(value) => write!(
                f,
                "forbidden: an interlock on {} does not hold (it reads {value}); it was not sent",
                self.channel
            ),
            None => write!(
                f,
                "forbidden: an interlock on {} does not hold (no value read recently enough to trust); it was not sent",
                self.channel
            ),
        }
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
        "the station waits the lock-delay after {after} (a change of it may still land); no change until it is over; this {what} was not sent"
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
    /// An interlock the change needs does not hold at send time; whoever set it renders it
    /// (as a [`GuardRefusal::Forbidden`]) before anyone reads it.
    #[error("{0}")]
    Interlock(InterlockBroken),
    /// A rule outside the link refuses it (the access rules, at admission), in its words.
    #[error("{0}")]
    Forbidden(Box<Forbidden>),
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

/// What a send guard is judged against at the moment of sending: the lease state, the value
/// cache and its link generation, and the time (the lease's clock, and the cache's).
pub struct SendMoment<'a> {
    pub lease: Option<&'a LeaseSnapshot>,
    pub values: &'a ValueCache,
    pub generation: u64,
    pub now: Instant,
    pub values_now: std::time::Instant,
}

/// What a change must still hold right before the link task puts it on the wire; refused, it
/// is answered [`LinkError::Refused`](super::LinkError::Refused) and never sent. This is where
/// lease fencing happens.
///
/// It carries the lease fence the change was admitted under, so the link knows which changes
/// of a given lease are still at the station.
#[derive(Clone)]
pub struct SendGuard {
    fence: Option<u64>,
    what: Guarded,
    /// The lease state it is judged against (`None`: no lease check, only the interlocks).
    lease: Option<LeaseWatch>,
    /// The interlocks it needs at send time, if any.
    interlocks: Option<Arc<Interlocks>>,
}

impl SendGuard {
    /// A guard for a change (or a consuming read: `what`) admitted under the lease with
    /// `fence` (`None`: nobody held it), judged against the lease state `lease` publishes.
    pub fn lease(fence: Option<u64>, what: Guarded, lease: LeaseWatch) -> SendGuard {
        SendGuard {
            fence,
            what,
            lease: Some(lease),
            interlocks: None,
        }
    }

    /// `admitted`'s guard (or one without a lease check) that also needs `interlocks`, checked
    /// after the lease.
    pub fn with_interlocks(admitted: Option<SendGuard>, interlocks: Interlocks) -> SendGuard {
        let base = admitted.unwrap_or(SendGuard {
            fence: None,
            what: Guarded::Change,
            lease: None,
            interlocks: None,
        });
        SendGuard {
            interlocks: Some(Arc::new(interlocks)),
            ..base
        }
    }

    /// A guard with neither a lease check nor interlocks, for a test that needs one that
    /// passes (and carries `fence`).
    #[cfg(test)]
    pub(crate) fn passing(fence: Option<u64>) -> SendGuard {
        SendGuard {
            fence,
            what: Guarded::Change,
            lease: None,
            interlocks: None,
        }
    }

    /// The lease fence the change was admitted under.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The interlocks it needs, if any.
    pub fn interlocks(&self) -> Option<&Interlocks> {
        self.interlocks.as_deref()
    }

    /// The lease state it is judged against now (`None`: it has no lease check).
    pub fn lease_now(&self) -> Option<Arc<LeaseSnapshot>> {
        self.lease.as_ref().map(LeaseWatch::current)
    }

    /// The decision, pure: may the change be sent at `moment`? The lease first (`moment.lease`
    /// is this guard's [`SendGuard::lease_now`]), then the interlocks in order.
    pub fn judge(&self, moment: &SendMoment<'_>) -> Result<(), GuardRefusal> {
        // Hole put back (reintroduce-holes only): a change admitted under a lease is sent after
        // that lease ended (the guard judges only the admission).
        if let Some(lease) = moment
            .lease
            .filter(|_| !crate::holes::active("change-after-end"))
        {
            lease.admits(self.fence, self.what, moment.now)?;
        }
        match &self.interlocks {
            Some(interlocks) => {
                match interlocks.first_broken(moment.values, moment.generation, moment.values_now) {
                    Some(broken) => Err(GuardRefusal::Interlock(broken)),
                    None => Ok(()),
                }
            }
            None => Ok(()),
        }
    }

    /// The decision at this instant, against the lease state published now and `values`
    /// (of link generation `generation`): what the link task runs right before sending.
    pub fn check(&self, values: &ValueCache, generation: u64) -> Result<(), GuardRefusal> {
        let lease = self.lease_now();
        self.judge(&SendMoment {
            lease: lease.as_deref(),
            values,
            generation,
            now: Instant::now(),
            values_now: std::time::Instant::now(),
        })
    }

    /// The lease half alone, against the state published now: what the lease control's
    /// guards decide (they need no interlocks).
    pub fn lease_check(&self, now: Instant) -> Result<(), GuardRefusal> {
        match self.lease_now() {
            Some(lease) => lease.admits(self.fence, self.what, now),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
