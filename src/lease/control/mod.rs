//! The gateway's control lease (`control:<station>`) on top of a [`LeaseStore`]: acquire, renew,
//! release, waiting in line, the admin break, expiry with safe state, change-of-hands events,
//! and the admission check with its link-side fence ([`SendGuard`]).
//!
//! Two locks, both short:
//! - `transitions` (async) serialises every change of the lease, so that "ran out, safe state
//!   applied, handed to the next in line" happens as one step before anyone else may take it;
//! - `state` (sync) is what admission and the link's send guards read: free, held (holder,
//!   token, fence, deadline) or ending. Guards check the deadline themselves, so a holder that
//!   stalled past its TTL can never write, even before the expiry task has run; and a lease
//!   past its deadline is never "free" until the gateway has finished ending it.
//!
//! How a lease ends (expiry, release, break), in this order:
//! 1. the state becomes "ending" under the `state` lock: from that instant admission refuses
//!    changes and forced reads of everyone, and the link's guard refuses every change admitted
//!    under the ended lease that is not yet sent;
//! 2. when it ran out unreleased, the safe state is applied through the link; it stays a duty
//!    until the station confirms it: retried with back-off (100 ms doubling to 5 s, at once after
//!    a reconnect), kept across a restart in the store (`<name>:safe-state-owed`), visible in
//!    [`ControlLease::safe_state_pending`] and in the `lease` event. No change and no new lease
//!    while it is pending;
//! 3. only then is the lease free: the `lease` event, then the next in line.
//!
//! A renewal the store confirms only after the local deadline does not extend the lease: it
//! ended at its deadline, as admission and the link already saw it.

mod ending;
mod hands;
mod state;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Notify, broadcast, oneshot};
use tokio::time::Instant;

use super::notice::{LeaseNotice, LeaseNoticeHook};
use super::store::LeaseStore;
use super::{Access, LeaseError, LeaseView};
use crate::config::SafeWrite;
use crate::link::{LinkHandle, SendGuard};
use state::{LeaseState, LiveLease, guard_check};

/// The answer to acquire and renew: what the holder needs, the lease id included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseAnswer {
    pub lease_id: String,
    pub owner: String,
    pub expires_in_ms: u64,
    pub held: bool,
    pub since: String,
    pub fence: u64,
}

/// Someone else's live lease, as a refusal names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherHolder {
    pub owner: String,
    pub expires_in: Duration,
}

/// What admission decided for a request that may go ahead.
#[derive(Clone, Default)]
pub struct Admitted {
    /// The holder's fence, when the request came from the holder (for `X-Lease-Fence`).
    pub fence: Option<u64>,
    /// For changes and reads: the check the link runs right before sending a change or a read
    /// of a channel whose read consumes data (reads of other channels are not guarded).
    pub guard: Option<SendGuard>,
    /// For a non-holder's cached read while someone else holds the lease: every value must
    /// come from the cache (however old, with its true age), none from the hardware.
    pub cache_only: Option<OtherHolder>,
}

impl Admitted {
    /// The refusal for a channel with nothing cached, when reads are cache-only.
    pub fn refuse_uncached(&self, channel: &str, consuming: bool) -> Option<LeaseError> {
        self.cache_only
            .as_ref()
            .map(|holder| LeaseError::NotCached {
                channel: channel.to_owned(),
                consuming,
                owner: holder.owner.clone(),
                expires_in: holder.expires_in,
            })
    }
}

type SharedState = Arc<Mutex<LeaseState>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One `POST lease?waitMs=N` waiting in line.
struct Waiter {
    ticket: u64,
    owner: String,
    ttl: Duration,
    reply: oneshot::Sender<LeaseAnswer>,
}

#[derive(Default)]
struct WaitLine {
    next_ticket: u64,
    waiting: VecDeque<Waiter>,
}

/// Writes applied through the link when a lease runs out.
struct SafeState {
    link: LinkHandle,
    writes: Vec<SafeWrite>,
}

/// When the next try of a pending safe state is due.
struct SafeStateRetry {
    next_try: Instant,
    backoff: Duration,
}

/// The first wait between tries of the safe state, and the longest.
const SAFE_STATE_FIRST_BACKOFF: Duration = Duration::from_millis(100);
const SAFE_STATE_MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long the store remembers that a safe state is owed (a gateway down longer than this
/// forgets it).
const SAFE_STATE_OWED_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The gateway's control lease. Shared as `Arc<ControlLease>`.
pub struct ControlLease {
    store: Arc<dyn LeaseStore>,
    name: String,
    state: SharedState,
    transitions: tokio::sync::Mutex<()>,
    line: Mutex<WaitLine>,
    /// Wakes the expiry task when the expiry instant may have changed.
    expiry_changed: Notify,
    events: broadcast::Sender<LeaseView>,
    safe_state: Option<SafeState>,
    /// The station link, for waiting until an ended lease's changes have left the station.
    link: Option<LinkHandle>,
    retry: Mutex<SafeStateRetry>,
    /// Changes of hands so far, for metrics.
    pub counters: crate::metrics::LeaseCounters,
    /// Told of every change of hands and safe state (the audit trail).
    notices: Option<LeaseNoticeHook>,
}

impl ControlLease {
    /// The lease `name` (e.g. `control:<station>`) in `store`; changes of hands go to `events`.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        name: impl Into<String>,
        events: broadcast::Sender<LeaseView>,
    ) -> Self {
        ControlLease {
            store,
            name: name.into(),
            state: Arc::new(Mutex::new(LeaseState::Free)),
            transitions: tokio::sync::Mutex::new(()),
            line: Mutex::default(),
            expiry_changed: Notify::new(),
            events,
            safe_state: None,
            link: None,
            retry: Mutex::new(SafeStateRetry {
                next_try: Instant::now(),
                backoff: SAFE_STATE_FIRST_BACKOFF,
            }),
            counters: Default::default(),
            notices: None,
        }
    }

    /// Tells `hook` of every acquisition, release, expiry, break and safe state.
    pub fn with_notices(mut self, hook: LeaseNoticeHook) -> Self {
        self.notices = Some(hook);
        self
    }

    fn notify(&self, notice: LeaseNotice<'_>) {
        if let Some(hook) = &self.notices {
            hook(notice);
        }
    }

    /// The owner and fence of the live lease when `presented` is its id.
    pub fn holder_of(&self, presented: Option<&str>) -> Option<(String, u64)> {
        let presented = presented?;
        let state = lock(&self.state);
        state
            .live(Instant::now())
            .filter(|l| l.token.matches(presented))
            .map(|l| (l.owner.clone(), l.fence))
    }

    /// Applies `writes` through `link` whenever a lease runs out without being released.
    /// Orders the ends of leases with the changes on `link`.
    pub fn with_safe_state(mut self, link: LinkHandle, writes: Vec<SafeWrite>) -> Self {
        self.link = Some(link.clone());
        self.safe_state = Some(SafeState { link, writes });
        self
    }

    /// Waits until no change admitted under `fence` (`None`: while nobody held the lease) may
    /// still be at the station. The state must already refuse such changes at the link.
    async fn settle_changes(&self, fence: Option<u64>) {
        if let Some(link) = &self.link {
            link.settle(fence).await;
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who holds it, as anyone may see it.
    pub fn view(&self) -> LeaseView {
        let now = Instant::now();
        match &*lock(&self.state) {
            LeaseState::Held(live) if live.is_live(now) => live.view(now),
            LeaseState::Ending(ending) => ending.view(),
            _ => LeaseView::nobody(),
        }
    }

    /// The fence of the live lease when `presented` is its id.
    pub fn fence_of(&self, presented: Option<&str>) -> Option<u64> {
        let presented = presented?;
        let now = Instant::now();
        let state = lock(&self.state);
        state
            .live(now)
            .filter(|l| l.token.matches(presented))
            .map(|l| l.fence)
    }

    /// Admission: may a request that needs `access` and carries `presented` as its `X-Lease-Id`
    /// go ahead? Synchronous and cheap; called once for every request.
    pub fn admit(&self, access: Access, presented: Option<&str>) -> Result<Admitted, LeaseError> {
        let now = Instant::now();
        let state = lock(&self.state);
        let live = state.live(now);
        let holder_fence = live
            .filter(|l| presented.is_some_and(|p| l.token.matches(p)))
            .map(|l| l.fence);
        match access {
            Access::Open => Ok(Admitted {
                fence: holder_fence,
                ..Admitted::default()
            }),
            Access::CachedRead => {
                let cache_only = live
                    .filter(|_| holder_fence.is_none())
                    .map(|l| l.other_holder(now));
                Ok(Admitted {
                    fence: holder_fence,
                    // Reading only from the cache, it never reaches the station.
                    guard: cache_only
                        .is_none()
                        .then(|| self.send_guard(holder_fence, "read")),
                    cache_only,
                })
            }
            Access::ForcedRead | Access::Change => {
                if holder_fence.is_none() {
                    if presented.is_some() {
                        let held_by = live.map(|l| (l.owner.clone(), l.expires_in(now)));
                        return Err(LeaseError::LeaseEnded { held_by });
                    }
                    if let Some(l) = live {
                        return Err(LeaseError::LockedBy {
                            owner: l.owner.clone(),
                            expires_in: l.expires_in(now),
                        });
                    }
                    if let Some(refusal) = state.between_leases(now) {
                        return Err(refusal);
                    }
                }
                let what = if access == Access::Change {
                    "change"
                } else {
                    "read"
                };
                Ok(Admitted {
                    fence: holder_fence,
                    guard: Some(self.send_guard(holder_fence, what)),
                    cache_only: None,
                })
            }
        }
    }

    /// The link-side fence for a change (or a read that consumes data: `what` says which, for
    /// the refusal) admitted under the lease with `admitted_fence`, or under "nobody holds it"
    /// (`None`): it refuses once the lease changed hands, ran out, or (for `None`) while a
    /// lease is held or still ending. It reads the same state admission reads.
    fn send_guard(&self, admitted_fence: Option<u64>, what: &'static str) -> SendGuard {
        let state = self.state.clone();
        SendGuard::new(admitted_fence, move || {
            guard_check(&lock(&state), admitted_fence, what, Instant::now())
        })
    }

    /// The live lease when `presented` is its id.
    fn live_lease(&self, presented: &str) -> Option<LiveLease> {
        let now = Instant::now();
        lock(&self.state)
            .live(now)
            .filter(|l| l.token.matches(presented))
            .cloned()
    }

    /// The 409 for the live holder (or for a lease promised to the next in line).
    fn held_by_other(&self) -> LeaseError {
        let now = Instant::now();
        let state = lock(&self.state);
        match state.live(now) {
            Some(live) => LeaseError::HeldByOther {
                owner: live.owner.clone(),
                expires_in: live.expires_in(now),
            },
            None => match state.between_leases(now) {
                Some(refusal) => refusal,
                None => LeaseError::HeldByOther {
                    owner: "a client that waited for it".into(),
                    expires_in: Duration::ZERO,
                },
            },
        }
    }

    fn publish(&self, view: LeaseView) {
        // No receiver is fine: nobody listens to the event stream.
        let _ = self.events.send(view);
    }
}
