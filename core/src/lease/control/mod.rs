//! The gateway's control lease (`control:<station>`) on top of a [`LeaseStore`]: acquire, renew,
//! release, waiting in line, the admin break, expiry with safe state, change-of-hands events,
//! and the admission check with its link-side fence ([`SendGuard`]).
//!
//! - `machine.rs`: the decisions, pure ([`machine::LeaseMachine::on`]: event and time in,
//!   actions out). Its state (free, held, ending) is what admission reads, under one short
//!   `Mutex`; every transition publishes it, under that lock, as the `LeaseSnapshot` the link's
//!   send guards judge (a `LeaseWatch`). Guards check the deadline themselves, so a holder that
//!   stalled past its TTL can never write, even before the expiry task has run; and a lease
//!   past its deadline is never "free" until the gateway has finished ending it.
//! - `shell.rs`: requests become events driven on a task of their own, one `Turn` at a time,
//!   and the actions are carried out there: a client that hangs up never cancels a transition.
//! - `expiry.rs`: the lease's own task (deadlines, safe-state retries, the link coming back),
//!   resuming at start, and the safe state's writes.
//!
//! - `read_back.rs`: the safe state read back, compared (pure).
//!
//! How a lease ends (expiry, release, break, a safe stop, a renewal confirmed too late) is
//! `LeaseMachine::end` and what follows it: ending (refused from that instant), its changes
//! still at the station settle, the safe state when it ran out unreleased or was safe-stopped (retried with
//! back-off until the station confirms it, kept across a restart in the store as
//! `<name>:safe-state-owed`) and read back right twice (at once and `max_processing_ms` later;
//! a late change found over it is written over again), then free, the `lease` event, the next
//! in line — after the lock-delay (`lease.lock_delay_ms`, default `station.max_processing_ms`)
//! only when a change of it left doubt unanswered or a restart (or a standby's takeover) lost
//! track of its end; a lease whose changes were all answered frees at once, however it ended.
//! Meanwhile an acquire is refused 409 with `Retry-After` (or waits in line), a
//! change without a lease 423 at admission and `GuardRefusal::LockDelay` at the link. A new
//! holder gets its id only after `settle(None)`, so changes admitted while nobody held it have
//! left first. A renewal the store confirms only after the local deadline is undone and
//! refused (404).
//!
//! - `ledger.rs`: the station's ledger of duties (`lease/ledger.rs`) as this control lease
//!   keeps it in the store, under the station's identity: the safe state owed, a lease's end
//!   pending, the lock-delay in force, the changes in doubt; read and taken over when the link
//!   first meets the station ([`ControlLease::adopt_station`]), whoever served it before.

mod events;
mod expiry;
mod ledger;
mod machine;
#[cfg(test)]
mod machine_tests;
mod read_back;
mod shell;
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
use crate::link::{Guarded, LeaseWatch, LinkHandle, SendGuard};
pub use events::{SafeStopOutcome, SafeStopState};
use machine::LeaseMachine;
use state::LeaseState;

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

/// Writes applied through the link when a lease runs out, and how close a number read back
/// must be to what was written.
struct SafeState {
    link: LinkHandle,
    writes: Vec<SafeWrite>,
    tolerance: f64,
}

/// How the end of a lease is timed and checked beyond the lease's own settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseEndTiming {
    /// How long after the first read back of the safe state the second is due
    /// (`station.max_processing_ms`).
    pub read_back_after: Duration,
    /// How close a number read back must be to the safe state's (`lease.safe_state_tolerance`).
    pub tolerance: f64,
    /// How long a new lease waits after one that ran out unreleased, was broken or
    /// safe-stopped, or ended with changes in doubt (`lease.lock_delay_ms`).
    pub lock_delay: Duration,
}

impl Default for LeaseEndTiming {
    fn default() -> Self {
        LeaseEndTiming {
            read_back_after: Duration::ZERO,
            tolerance: 0.0,
            lock_delay: Duration::ZERO,
        }
    }
}

/// The gateway's control lease. Shared as `Arc<ControlLease>`.
pub struct ControlLease {
    store: Arc<dyn LeaseStore>,
    name: String,
    /// The decisions and the state admission reads.
    machine: Mutex<LeaseMachine>,
    /// The machine's state as the send guards judge it, published under `machine`'s lock on
    /// every transition ([`ControlLease::on`]).
    published: LeaseWatch,
    /// The send guard of every read admitted while nobody holds the lease: one check, the same
    /// for each, made once rather than for every cached read (an allocation and a
    /// clone of `machine`'s count a request, for a guard a cached read never uses).
    unfenced_read: SendGuard,
    /// One transition at a time (a `shell::Turn` holds it).
    transitions: Arc<tokio::sync::Mutex<()>>,
    line: Mutex<WaitLine>,
    /// Wakes the expiry task when the expiry instant may have changed.
    expiry_changed: Notify,
    events: broadcast::Sender<LeaseView>,
    safe_state: Option<SafeState>,
    /// The station link, for waiting until an ended lease's changes have left the station.
    link: Option<LinkHandle>,
    /// Changes of hands so far, for metrics.
    pub counters: crate::metrics::LeaseCounters,
    /// Told of every change of hands and safe state (the audit trail).
    notices: Option<LeaseNoticeHook>,
    timing: LeaseEndTiming,
    /// Where each transition runs: the gateway's own runtime, not a request's connection
    /// thread.
    runtime: crate::gateway_runtime::GatewayRuntime,
    /// The station's ledger of duties as this gateway keeps it.
    ledger: Mutex<ledger::Ledger>,
    /// Set once the lease was resumed from the store (a standby's, once it took over): the
    /// station's ledger is read after.
    resumed: tokio::sync::watch::Sender<bool>,
    /// Whether resuming found a live lease of this control lease in the store.
    resumed_live: std::sync::atomic::AtomicBool,
    /// Whether this process owns the station's link, asked at the moment a lease is granted:
    /// none is while it does not (`None`: always owned).
    custody: Option<super::link_custody::LinkCustody>,
}

impl ControlLease {
    /// The lease `name` (e.g. `control:<station>`) in `store`; changes of hands go to `events`.
    pub fn new(
        store: Arc<dyn LeaseStore>,
        name: impl Into<String>,
        events: broadcast::Sender<LeaseView>,
    ) -> Self {
        let machine = LeaseMachine::new(false, Instant::now());
        let published = LeaseWatch::new(machine.state().snapshot());
        ControlLease {
            store,
            name: name.into(),
            unfenced_read: SendGuard::lease(None, Guarded::Read, published.clone()),
            machine: Mutex::new(machine),
            published,
            transitions: Arc::default(),
            line: Mutex::default(),
            expiry_changed: Notify::new(),
            events,
            safe_state: None,
            link: None,
            counters: Default::default(),
            notices: None,
            timing: LeaseEndTiming::default(),
            runtime: crate::gateway_runtime::GatewayRuntime::current(),
            ledger: Mutex::default(),
            resumed: tokio::sync::watch::channel(false).0,
            resumed_live: Default::default(),
            custody: None,
        }
    }

    /// Grants no lease while `custody` says this process does not own the station's link (a
    /// standby, a link standing by on the station's identity): an acquisition that waits in
    /// line waits until it does, one that does not is refused naming who serves the station.
    pub fn with_link_custody(mut self, custody: super::link_custody::LinkCustody) -> Self {
        self.custody = Some(custody);
        self
    }

    /// Whether this process owns the station's link now, as far as granting a lease goes.
    fn owns_link(&self) -> Result<(), super::link_custody::NotLinkOwner> {
        self.custody
            .as_ref()
            .map_or(Ok(()), super::link_custody::LinkCustody::owns_link)
    }

    /// Times and checks the end of a lease with `timing`.
    pub fn with_end_timing(mut self, timing: LeaseEndTiming) -> Self {
        self.timing = timing;
        if let Some(safe) = &mut self.safe_state {
            safe.tolerance = timing.tolerance;
        }
        self.reset_machine();
        self
    }

    fn reset_machine(&mut self) {
        let mut machine = LeaseMachine::new(self.has_safe_state(), Instant::now())
            .with_read_back_after(self.timing.read_back_after)
            .with_lock_delay(self.timing.lock_delay);
        if self.ledger_kept() {
            machine = machine.with_station_unknown();
        }
        let mut current = lock(&self.machine);
        *current = machine;
        self.published.publish(current.state().snapshot());
    }

    /// Feeds `event` to the machine at `now` and publishes its state for the send guards
    /// before anyone else can see it: a guard judged after this returns sees the transition.
    fn on(&self, event: events::Event, now: Instant) -> Vec<events::Action> {
        let mut machine = lock(&self.machine);
        let actions = machine.on(event, now);
        self.published.publish(machine.state().snapshot());
        actions
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
        let machine = lock(&self.machine);
        machine
            .state()
            .live(Instant::now())
            .filter(|l| l.token.matches(presented))
            .map(|l| (l.owner.clone(), l.fence))
    }

    /// Applies `writes` through `link` whenever a lease runs out without being released.
    /// Orders the ends of leases with the changes on `link`.
    pub fn with_safe_state(mut self, link: LinkHandle, writes: Vec<SafeWrite>) -> Self {
        self.link = Some(link.clone());
        let tolerance = self.timing.tolerance;
        self.safe_state = Some(SafeState {
            link,
            writes,
            tolerance,
        });
        self.reset_machine();
        self
    }

    /// Whether a lease that runs out leaves a safe state to apply.
    fn has_safe_state(&self) -> bool {
        self.safe_state
            .as_ref()
            .is_some_and(|s| !s.writes.is_empty())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many `POST lease?waitMs=N` wait in line now.
    pub fn waiting_in_line(&self) -> usize {
        lock(&self.line).waiting.len()
    }

    /// Who holds it, as anyone may see it.
    pub fn view(&self) -> LeaseView {
        let now = Instant::now();
        let machine = lock(&self.machine);
        match machine.state() {
            LeaseState::Held(live) if live.is_live(now) => live.view(now),
            LeaseState::Ending(ending) => ending.view(),
            _ => machine.free_view(now),
        }
    }

    /// The fence of the live lease when `presented` is its id.
    pub fn fence_of(&self, presented: Option<&str>) -> Option<u64> {
        let presented = presented?;
        let now = Instant::now();
        let machine = lock(&self.machine);
        machine
            .state()
            .live(now)
            .filter(|l| l.token.matches(presented))
            .map(|l| l.fence)
    }

    /// Admission: may a request that needs `access` and carries `presented` as its `X-Lease-Id`
    /// go ahead? Synchronous and cheap; called once for every request.
    pub fn admit(&self, access: Access, presented: Option<&str>) -> Result<Admitted, LeaseError> {
        let now = Instant::now();
        let machine = lock(&self.machine);
        let state = machine.state();
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
                        .then(|| self.send_guard(holder_fence, Guarded::Read)),
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
                    Guarded::Change
                } else {
                    Guarded::Read
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
    fn send_guard(&self, admitted_fence: Option<u64>, what: Guarded) -> SendGuard {
        if (admitted_fence, what) == (None, Guarded::Read) {
            return self.unfenced_read.clone();
        }
        SendGuard::lease(admitted_fence, what, self.published.clone())
    }

    /// The 409 for the live holder (or for a lease promised to the next in line).
    fn held_by_other(&self) -> LeaseError {
        lock(&self.machine).held_by_other(Instant::now())
    }

    fn publish(&self, view: LeaseView) {
        // No receiver is fine: nobody listens to the event stream.
        let _ = self.events.send(view);
    }
}
