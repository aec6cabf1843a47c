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

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use station_protocol::Value;
use tokio::sync::{Notify, broadcast, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::store::{AcquireRequest, Acquisition, LeaseGrant, LeaseStore, LeaseToken};
use super::{Access, LeaseError, LeaseView, SafeStateView, millis, rfc3339};
use crate::config::SafeWrite;
use crate::link::{LinkHandle, SendGuard};

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

/// The live lease as this process knows it.
#[derive(Clone)]
struct LiveLease {
    token: LeaseToken,
    owner: String,
    fence: u64,
    since: SystemTime,
    expires_at: Instant,
}

impl LiveLease {
    /// `asked_at` is taken before the store was asked, so the local expiry is never later than
    /// the store's.
    fn from_grant(grant: LeaseGrant, asked_at: Instant) -> LiveLease {
        LiveLease {
            token: grant.token,
            owner: grant.owner,
            fence: grant.fence,
            since: grant.since,
            expires_at: asked_at + grant.expires_in,
        }
    }

    fn is_live(&self, now: Instant) -> bool {
        self.expires_at > now
    }

    fn expires_in(&self, now: Instant) -> Duration {
        self.expires_at.saturating_duration_since(now)
    }

    fn view(&self, now: Instant) -> LeaseView {
        LeaseView {
            held: true,
            owner: Some(self.owner.clone()),
            expires_in_ms: millis(self.expires_in(now)),
            since: Some(rfc3339(self.since)),
            safe_state: None,
        }
    }

    fn answer(&self, now: Instant) -> LeaseAnswer {
        LeaseAnswer {
            lease_id: self.token.as_str().to_owned(),
            owner: self.owner.clone(),
            expires_in_ms: millis(self.expires_in(now)),
            held: true,
            since: rfc3339(self.since),
            fence: self.fence,
        }
    }

    fn other_holder(&self, now: Instant) -> OtherHolder {
        OtherHolder {
            owner: self.owner.clone(),
            expires_in: self.expires_in(now),
        }
    }

    fn ending(&self, safe_state_owed: bool) -> EndingLease {
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
struct EndingLease {
    owner: String,
    /// The ended lease's fence (0 when it lapsed while the gateway was down and is unknown).
    fence: u64,
    /// It ran out unreleased and the station has not yet confirmed the safe state.
    safe_state_owed: bool,
    /// Tries of the safe state so far, and why the last one failed.
    tries: u32,
    last_error: Option<String>,
}

impl EndingLease {
    fn refusal(&self) -> LeaseError {
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

    fn view(&self) -> LeaseView {
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
enum LeaseState {
    Free,
    /// Held; past its deadline it has ended for admission and the link, even before the
    /// expiry task settles it.
    Held(LiveLease),
    /// Ended and being finished: no change, no forced read, no new lease until it is free.
    Ending(EndingLease),
}

impl LeaseState {
    /// The live lease at `now`, if any.
    fn live(&self, now: Instant) -> Option<&LiveLease> {
        match self {
            LeaseState::Held(live) if live.is_live(now) => Some(live),
            _ => None,
        }
    }

    /// Why nobody may change the station now although nobody holds a live lease: a lease past
    /// its deadline not yet settled, or one being finished.
    fn between_leases(&self, now: Instant) -> Option<LeaseError> {
        match self {
            LeaseState::Held(live) if !live.is_live(now) => Some(LeaseError::Ending {
                owner: live.owner.clone(),
            }),
            LeaseState::Ending(ending) => Some(ending.refusal()),
            _ => None,
        }
    }
}

type SharedState = Arc<Mutex<LeaseState>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The send guard's decision: may a change (or consuming read: `what`) admitted under
/// `admitted_fence` (`None`: while nobody held the lease) be sent at `now`, given `state`?
fn guard_check(
    state: &LeaseState,
    admitted_fence: Option<u64>,
    what: &str,
    now: Instant,
) -> Result<(), String> {
    match (admitted_fence, state) {
        (Some(admitted), LeaseState::Held(current))
            if current.fence == admitted && current.is_live(now) =>
        {
            Ok(())
        }
        (None, LeaseState::Free) => Ok(()),
        (Some(admitted), LeaseState::Held(current)) if current.fence != admitted => Err(format!(
            "lease ended: the lease this {what} was admitted under (fence {admitted}) was replaced by \
             {}'s (fence {}) before the {what} reached the station; it was not sent",
            current.owner, current.fence
        )),
        (Some(admitted), _) => Err(format!(
            "lease ended: the lease this {what} was admitted under (fence {admitted}) ran out or was \
             released before the {what} reached the station; it was not sent"
        )),
        (None, LeaseState::Held(current)) if current.is_live(now) => Err(format!(
            "the station was leased by {} before this {what} reached it; it was not sent",
            current.owner
        )),
        (None, LeaseState::Held(current)) => Err(format!(
            "the station was leased by {} (whose lease has just ended) before this {what} reached it; it was not sent",
            current.owner
        )),
        (None, LeaseState::Ending(ending)) => {
            Err(format!("{}; this {what} was not sent", ending.refusal()))
        }
    }
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
        }
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

    /// The store's name for "a safe state is owed for this lease".
    fn owed_name(&self) -> String {
        format!("{}:safe-state-owed", self.name)
    }

    /// Whether a lease that runs out leaves a safe state to apply.
    fn has_safe_state(&self) -> bool {
        self.safe_state
            .as_ref()
            .is_some_and(|s| !s.writes.is_empty())
    }

    /// Loads the store's live lease, if any (a backend that outlives the process), and a safe
    /// state still owed for a lease that lapsed while the gateway was down.
    pub async fn resume(&self) -> Result<(), LeaseError> {
        let _transition = self.transitions.lock().await;
        let asked_at = Instant::now();
        if let Some(grant) = self.store.current(&self.name).await? {
            info!(owner = %grant.owner, fence = grant.fence, "control lease resumed from the store");
            *lock(&self.state) = LeaseState::Held(LiveLease::from_grant(grant, asked_at));
            self.expiry_changed.notify_one();
            return Ok(());
        }
        let Some(owed) = self.store.current(&self.owed_name()).await? else {
            return Ok(());
        };
        if !self.has_safe_state() {
            self.store.release(&self.owed_name(), &owed.token).await?;
            return Ok(());
        }
        warn!(
            owner = %owed.owner,
            "{}'s control lease lapsed while the gateway was down: the safe state is applied as soon as the station is reached",
            owed.owner
        );
        *lock(&self.state) = LeaseState::Ending(EndingLease {
            owner: owed.owner,
            fence: 0,
            safe_state_owed: true,
            tries: 0,
            last_error: None,
        });
        self.retry_now();
        Ok(())
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

    /// Why the station is not ready while a safe state is owed and not yet confirmed (for
    /// `/readyz` and the status page).
    pub fn safe_state_pending(&self) -> Option<String> {
        match &*lock(&self.state) {
            LeaseState::Ending(ending) if ending.safe_state_owed => Some(format!(
                "the safe state after {}'s lease is not yet confirmed by the station ({} tries{})",
                ending.owner,
                ending.tries,
                ending
                    .last_error
                    .as_deref()
                    .map(|why| format!("; last: {why}"))
                    .unwrap_or_default()
            )),
            _ => None,
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

    /// `POST lease`: takes the lease for `ttl`; with the live lease's id as `presented`, renews
    /// it (same id and fence). While someone else holds it, or a lease is still ending, waits
    /// up to `wait` in line (first come, first served), then refuses.
    pub async fn acquire(
        &self,
        owner: String,
        ttl: Duration,
        presented: Option<&str>,
        wait: Duration,
    ) -> Result<LeaseAnswer, LeaseError> {
        let (ticket, mut granted) = {
            let _transition = self.transitions.lock().await;
            self.settle_expiry().await;
            if let Some(live) = presented.and_then(|p| self.live_lease(p)) {
                let request = AcquireRequest::new(owner, ttl).with_retry_token(live.token.clone());
                return self.renew_by_acquire(request, &live).await;
            }
            let ending = lock(&self.state).between_leases(Instant::now());
            let nobody_waiting = {
                let mut line = lock(&self.line);
                line.waiting.retain(|waiter| !waiter.reply.is_closed());
                line.waiting.is_empty()
            };
            if let Some(refusal) = ending {
                if wait.is_zero() {
                    return Err(refusal);
                }
            } else if nobody_waiting {
                let request = AcquireRequest::new(owner.clone(), ttl);
                match self.try_take(request).await? {
                    Ok(answer) => return Ok(answer),
                    Err(holder) if wait.is_zero() => {
                        return Err(LeaseError::HeldByOther {
                            owner: holder.owner,
                            expires_in: holder.expires_in,
                        });
                    }
                    Err(_) => {}
                }
            } else if wait.is_zero() {
                return Err(self.held_by_other());
            }
            let (reply, granted) = oneshot::channel();
            let mut line = lock(&self.line);
            let ticket = line.next_ticket;
            line.next_ticket += 1;
            line.waiting.push_back(Waiter {
                ticket,
                owner,
                ttl,
                reply,
            });
            (ticket, granted)
        };
        tokio::select! {
            answer = &mut granted => answer.map_err(|_| self.held_by_other()),
            () = tokio::time::sleep(wait) => {
                lock(&self.line).waiting.retain(|waiter| waiter.ticket != ticket);
                // Handed over in the instant the wait ran out: it is ours.
                granted.try_recv().map_err(|_| self.held_by_other())
            }
        }
    }

    /// `PUT lease/{id}`: extends the lease `presented` from now by `ttl` (`None`: its TTL).
    /// Only a renewal the store confirms before the lease's local deadline extends it.
    pub async fn renew(
        &self,
        presented: &str,
        ttl: Option<Duration>,
    ) -> Result<LeaseAnswer, LeaseError> {
        let _transition = self.transitions.lock().await;
        self.settle_expiry().await;
        let held = self.live_lease(presented).ok_or(LeaseError::NoSuchLease)?;
        let asked_at = Instant::now();
        match self.store.refresh(&self.name, &held.token, ttl).await? {
            Some(grant) => {
                let renewed = LiveLease::from_grant(grant, asked_at);
                self.install_renewal(&held, renewed).await
            }
            None => {
                // The store says it ended before our clock did: it ran out.
                self.end_now(&held).await;
                Err(LeaseError::NoSuchLease)
            }
        }
    }

    /// Puts a renewal the store confirmed in place, unless `held`'s deadline passed while the
    /// store was asked: then the lease ended at its deadline (admission and the link already
    /// treated it so), the store's extension is undone, and the renewal is refused.
    async fn install_renewal(
        &self,
        held: &LiveLease,
        renewed: LiveLease,
    ) -> Result<LeaseAnswer, LeaseError> {
        let now = Instant::now();
        {
            let mut state = lock(&self.state);
            if matches!(&*state, LeaseState::Held(live) if live.token == held.token && live.is_live(now))
            {
                let answer = renewed.answer(now);
                *state = LeaseState::Held(renewed);
                drop(state);
                self.expiry_changed.notify_one();
                return Ok(answer);
            }
        }
        warn!(
            owner = %held.owner,
            fence = held.fence,
            "a renewal of {}'s lease was confirmed by the store only after the lease's deadline: the lease ended at its deadline",
            held.owner
        );
        if let Err(error) = self.store.release(&self.name, &held.token).await {
            warn!("the lease store could not end the lease whose renewal came too late: {error}");
        }
        self.end_now(held).await;
        Err(LeaseError::NoSuchLease)
    }

    /// Ends `held` as having run out, if it is still the state's lease. Caller holds
    /// `transitions`.
    async fn end_now(&self, held: &LiveLease) {
        let owed = self.has_safe_state();
        let ended = {
            let mut state = lock(&self.state);
            match &*state {
                LeaseState::Held(live) if live.token == held.token => {
                    let ended = live.clone();
                    *state = LeaseState::Ending(ended.ending(owed));
                    Some(ended)
                }
                _ => None,
            }
        };
        if let Some(ended) = ended {
            self.after_running_out(ended).await;
        }
    }

    /// `DELETE lease/{id}`: ends the lease `presented`. A release never applies the safe state.
    pub async fn release(&self, presented: &str) -> Result<(), LeaseError> {
        let _transition = self.transitions.lock().await;
        self.settle_expiry().await;
        let held = self.live_lease(presented).ok_or(LeaseError::NoSuchLease)?;
        let released = self.store.release(&self.name, &held.token).await?;
        if !released {
            self.end_now(&held).await;
            return Err(LeaseError::NoSuchLease);
        }
        *lock(&self.state) = LeaseState::Ending(held.ending(false));
        info!(owner = %held.owner, fence = held.fence, "control lease released");
        self.counters.released.inc();
        self.settle_changes(Some(held.fence)).await;
        self.finish_ending().await;
        Ok(())
    }

    /// `DELETE api/lease` with the admin token: ends whoever holds it. Returns what was broken.
    pub async fn break_lease(&self, peer: SocketAddr) -> Result<LeaseView, LeaseError> {
        let _transition = self.transitions.lock().await;
        self.settle_expiry().await;
        let live = match &*lock(&self.state) {
            LeaseState::Held(live) => live.clone(),
            _ => return Err(LeaseError::NobodyHolds),
        };
        let broken = live.view(Instant::now());
        self.store.release(&self.name, &live.token).await?;
        *lock(&self.state) = LeaseState::Ending(live.ending(false));
        warn!(
            owner = %live.owner,
            fence = live.fence,
            %peer,
            at = %rfc3339(SystemTime::now()),
            "control lease broken by an admin from {peer}"
        );
        self.counters.broken.inc();
        self.settle_changes(Some(live.fence)).await;
        self.finish_ending().await;
        Ok(broken)
    }

    /// The expiry task: sleeps until the live lease's expiry, a pending safe state's next try,
    /// a reconnect of the station, or a change; then ends a lease that ran out (safe state,
    /// event, next in line) and retries a safe state still owed. Returns on `shutdown`.
    pub async fn run_expiry(self: Arc<Self>, shutdown: CancellationToken) {
        let mut station = self.safe_state.as_ref().map(|s| s.link.watch_info());
        let mut generation = station.as_ref().map(|s| s.borrow().generation);
        loop {
            let wake_at = match &*lock(&self.state) {
                LeaseState::Held(live) => Some(live.expires_at),
                LeaseState::Ending(ending) if ending.safe_state_owed => {
                    Some(lock(&self.retry).next_try)
                }
                _ => None,
            };
            let due = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let reconnected = async {
                match station.as_mut() {
                    Some(station) => {
                        if station.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.expiry_changed.notified() => continue,
                () = reconnected => {
                    let now = station.as_ref().map(|s| {
                        let info = s.borrow();
                        (info.connected, info.generation)
                    });
                    if let Some((true, current)) = now
                        && generation != Some(current)
                    {
                        generation = Some(current);
                        self.retry_now();
                    }
                    continue;
                }
                () = due => {}
            }
            let _transition = self.transitions.lock().await;
            self.settle_expiry().await;
            self.retry_safe_state().await;
        }
    }

    /// The next try of a pending safe state is due now, with the back-off reset.
    fn retry_now(&self) {
        *lock(&self.retry) = SafeStateRetry {
            next_try: Instant::now(),
            backoff: SAFE_STATE_FIRST_BACKOFF,
        };
        self.expiry_changed.notify_one();
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

    /// `POST lease` with the live lease's id: a renewal through the store's acquire. Caller
    /// holds `transitions`.
    async fn renew_by_acquire(
        &self,
        request: AcquireRequest,
        held: &LiveLease,
    ) -> Result<LeaseAnswer, LeaseError> {
        let asked_at = Instant::now();
        match self.store.try_acquire(&self.name, request).await? {
            Acquisition::Renewed(grant) => {
                self.install_renewal(held, LiveLease::from_grant(grant, asked_at))
                    .await
            }
            Acquisition::Taken(grant) => {
                // The store had ended the lease being renewed and made a new one: the old one
                // ran out (safe state first); the new one is nobody's.
                let _ = self.store.release(&self.name, &grant.token).await;
                self.end_now(held).await;
                Err(LeaseError::NoSuchLease)
            }
            Acquisition::HeldByOther(holder) => Err(LeaseError::HeldByOther {
                owner: holder.owner,
                expires_in: holder.expires_in,
            }),
        }
    }

    /// One attempt at the store for a new lease. `Err` names who holds it. Caller holds
    /// `transitions`.
    async fn try_take(
        &self,
        request: AcquireRequest,
    ) -> Result<Result<LeaseAnswer, super::LeaseHolder>, LeaseError> {
        let asked_at = Instant::now();
        let nobody_holds = lock(&self.state).live(asked_at).is_none();
        if nobody_holds && self.has_safe_state() {
            // Before the lease: should the gateway stop with it held, the store still knows a
            // safe state is owed when it lapses.
            self.remember_safe_state_owed(&request.owner).await?;
        }
        let (grant, taken) = match self.store.try_acquire(&self.name, request).await? {
            Acquisition::Taken(grant) => (grant, true),
            Acquisition::Renewed(grant) => (grant, false),
            Acquisition::HeldByOther(holder) => return Ok(Err(holder)),
        };
        let live = LiveLease::from_grant(grant, asked_at);
        if taken {
            info!(owner = %live.owner, fence = live.fence, "control lease taken");
            self.counters.taken.inc();
        }
        *lock(&self.state) = LeaseState::Held(live.clone());
        self.expiry_changed.notify_one();
        if taken {
            // Changes admitted while nobody held it are refused at the link from now on; the
            // holder gets its id (and so can make its first change) once those already sent
            // have left the station.
            self.settle_changes(None).await;
            self.publish(live.view(Instant::now()));
        }
        Ok(Ok(live.answer(Instant::now())))
    }

    /// Marks in the store that a safe state is owed should the lease about to be taken lapse.
    async fn remember_safe_state_owed(&self, owner: &str) -> Result<(), LeaseError> {
        let owed = self.owed_name();
        if self.store.current(&owed).await?.is_none() {
            let request = AcquireRequest::new(owner.to_owned(), SAFE_STATE_OWED_TTL);
            self.store.try_acquire(&owed, request).await?;
        }
        Ok(())
    }

    /// Clears the store's mark that a safe state is owed.
    async fn forget_safe_state_owed(&self) {
        let owed = self.owed_name();
        let cleared = async {
            if let Some(mark) = self.store.current(&owed).await? {
                self.store.release(&owed, &mark.token).await?;
            }
            Ok::<(), super::LeaseStoreError>(())
        };
        if let Err(error) = cleared.await {
            warn!("the lease store could not clear its safe-state mark: {error}");
        }
    }

    /// Ends a lease whose time ran out. Caller holds `transitions`.
    async fn settle_expiry(&self) {
        let now = Instant::now();
        let owed = self.has_safe_state();
        let ended = {
            let mut state = lock(&self.state);
            match &*state {
                LeaseState::Held(live) if !live.is_live(now) => {
                    let ended = live.clone();
                    *state = LeaseState::Ending(ended.ending(owed));
                    Some(ended)
                }
                _ => None,
            }
        };
        if let Some(ended) = ended {
            // End it in the store too, should the store's clock be a hair behind ours.
            if let Err(error) = self.store.release(&self.name, &ended.token).await {
                warn!("the lease store could not end the lease that ran out: {error}");
            }
            self.after_running_out(ended).await;
        }
    }

    /// A lease that ran out (state already "ending"): the safe state, then the event and the
    /// next in line, in that order, before anyone else may take it. Caller holds `transitions`.
    async fn after_running_out(&self, ended: LiveLease) {
        warn!(owner = %ended.owner, fence = ended.fence, "control lease ran out: {} did not renew it in time", ended.owner);
        self.counters.expired.inc();
        self.settle_changes(Some(ended.fence)).await;
        *lock(&self.retry) = SafeStateRetry {
            next_try: Instant::now(),
            backoff: SAFE_STATE_FIRST_BACKOFF,
        };
        self.retry_safe_state().await;
    }

    /// Tries the safe state when one is owed and its try is due; on confirmation, finishes the
    /// lease's end. Caller holds `transitions`.
    async fn retry_safe_state(&self) {
        let (owner, fence) = match &*lock(&self.state) {
            LeaseState::Ending(ending) if ending.safe_state_owed => {
                (ending.owner.clone(), ending.fence)
            }
            LeaseState::Ending(_) => (String::new(), 0),
            _ => return,
        };
        if owner.is_empty() {
            // Nothing owed (no safe state configured): the end is finished at once.
            self.finish_ending().await;
            return;
        }
        if lock(&self.retry).next_try > Instant::now() {
            return;
        }
        match self.apply_safe_state(&owner).await {
            Ok(()) => {
                self.counters.safe_state_applied.inc();
                self.finish_ending().await;
            }
            Err(why) => {
                self.counters.safe_state_failed.inc();
                let (tries, view) = {
                    let mut state = lock(&self.state);
                    let LeaseState::Ending(ending) = &mut *state else {
                        return;
                    };
                    ending.tries += 1;
                    ending.last_error = Some(why.clone());
                    (ending.tries, ending.view())
                };
                let wait = {
                    let mut retry = lock(&self.retry);
                    let wait = retry.backoff;
                    retry.next_try = Instant::now() + wait;
                    retry.backoff = (wait * 2).min(SAFE_STATE_MAX_BACKOFF);
                    wait
                };
                error!(
                    owner = %owner,
                    fence,
                    tries,
                    "the safe state after {owner}'s lease is not confirmed (try {tries}): {why}; trying again in {} ms; no change and no new lease until it is",
                    wait.as_millis()
                );
                self.publish(view);
            }
        }
    }

    /// The end of a lease is finished: free, the event, then the next in line. Caller holds
    /// `transitions`.
    async fn finish_ending(&self) {
        if self.has_safe_state() {
            self.forget_safe_state_owed().await;
        }
        *lock(&self.state) = LeaseState::Free;
        self.publish(LeaseView::nobody());
        self.hand_over().await;
    }

    /// Writes the safe state through the link; `Ok` only when the station confirmed every
    /// write.
    async fn apply_safe_state(&self, after: &str) -> Result<(), String> {
        let Some(safe) = &self.safe_state else {
            return Ok(());
        };
        let channels = safe.link.info().channels.clone();
        let mut items = Vec::with_capacity(safe.writes.len());
        for write in &safe.writes {
            let Some(channel) = channels.get(&write.channel) else {
                return Err(format!(
                    "the station has no channel {} (yet: the link may not have listed its channels)",
                    write.channel
                ));
            };
            match Value::parse_as(channel.value_type, &write.value, &channel.options) {
                Ok(value) => items.push((write.channel.clone(), value)),
                Err(why) => {
                    // A configuration mistake no retry can mend: say so every time.
                    return Err(format!(
                        "bad safe-state value {:?} for {}: {why}",
                        write.value, write.channel
                    ));
                }
            }
        }
        let names: Vec<String> = items.iter().map(|(name, _)| name.clone()).collect();
        let results = safe
            .link
            .write(items, None)
            .await
            .map_err(|why| why.to_string())?;
        let mut refused = Vec::new();
        for (name, result) in names.iter().zip(results) {
            match result {
                Ok(()) => warn!(
                    channel = %name,
                    "safe state applied to {name} after {after}'s lease ran out"
                ),
                Err(why) => refused.push(format!("the station refused {name}: {}", why.message)),
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(refused.join("; "))
        }
    }

    /// Gives a free lease to the first one waiting in line that still waits. Caller holds
    /// `transitions`.
    async fn hand_over(&self) {
        loop {
            let Some(waiter) = lock(&self.line).waiting.pop_front() else {
                return;
            };
            if waiter.reply.is_closed() {
                continue;
            }
            let request = AcquireRequest::new(waiter.owner.clone(), waiter.ttl);
            match self.try_take(request).await {
                Ok(Ok(answer)) => match waiter.reply.send(answer) {
                    Ok(()) => return,
                    Err(unclaimed) => {
                        // It stopped waiting in the same instant: end the lease nobody will use.
                        let unused = std::mem::replace(&mut *lock(&self.state), LeaseState::Free);
                        if let LeaseState::Held(unused) = unused {
                            let _ = self.store.release(&self.name, &unused.token).await;
                        }
                        if self.has_safe_state() {
                            self.forget_safe_state_owed().await;
                        }
                        info!(owner = %unclaimed.owner, "control lease released: its waiter gave up");
                        self.publish(LeaseView::nobody());
                    }
                },
                Ok(Err(_)) | Err(_) => {
                    lock(&self.line).waiting.push_front(waiter);
                    return;
                }
            }
        }
    }

    fn publish(&self, view: LeaseView) {
        // No receiver is fine: nobody listens to the event stream.
        let _ = self.events.send(view);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::MemoryLeaseStore;

    const TTL: Duration = Duration::from_secs(1);

    fn control_lease() -> (Arc<ControlLease>, broadcast::Receiver<LeaseView>) {
        let (events, receiver) = broadcast::channel(64);
        (
            Arc::new(ControlLease::new(
                Arc::new(MemoryLeaseStore::new()),
                "control:test",
                events,
            )),
            receiver,
        )
    }

    /// A memory store whose refresh answers only after `refresh_delay` (a slow database).
    struct SlowRefreshStore {
        inner: MemoryLeaseStore,
        refresh_delay: Duration,
    }

    impl LeaseStore for SlowRefreshStore {
        fn try_acquire_kind<'a>(
            &'a self,
            kind: super::super::store::LeaseKind,
            name: &'a str,
            request: AcquireRequest,
        ) -> futures::future::BoxFuture<'a, Result<Acquisition, super::super::LeaseStoreError>>
        {
            self.inner.try_acquire_kind(kind, name, request)
        }

        fn refresh_kind<'a>(
            &'a self,
            kind: super::super::store::LeaseKind,
            name: &'a str,
            token: &'a LeaseToken,
            ttl: Option<Duration>,
        ) -> futures::future::BoxFuture<'a, Result<Option<LeaseGrant>, super::super::LeaseStoreError>>
        {
            Box::pin(async move {
                tokio::time::sleep(self.refresh_delay).await;
                self.inner.refresh_kind(kind, name, token, ttl).await
            })
        }

        fn release_kind<'a>(
            &'a self,
            kind: super::super::store::LeaseKind,
            name: &'a str,
            token: &'a LeaseToken,
        ) -> futures::future::BoxFuture<'a, Result<bool, super::super::LeaseStoreError>> {
            self.inner.release_kind(kind, name, token)
        }

        fn holders<'a>(
            &'a self,
            kind: super::super::store::LeaseKind,
            name: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Vec<LeaseGrant>, super::super::LeaseStoreError>>
        {
            self.inner.holders(kind, name)
        }
    }

    fn control_lease_with_slow_refresh(delay: Duration) -> Arc<ControlLease> {
        let (events, _) = broadcast::channel(64);
        Arc::new(ControlLease::new(
            Arc::new(SlowRefreshStore {
                inner: MemoryLeaseStore::new(),
                refresh_delay: delay,
            }),
            "control:test",
            events,
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn while_a_renewal_waits_on_the_store_past_the_deadline_nobody_else_may_change_the_station()
     {
        let lease = control_lease_with_slow_refresh(Duration::from_millis(20));
        let held = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        let holders_guard = lease
            .admit(Access::Change, Some(&held.lease_id))
            .unwrap()
            .guard
            .unwrap();
        tokio::time::advance(Duration::from_millis(990)).await;
        let renewal = tokio::spawn({
            let lease = lease.clone();
            let id = held.lease_id.clone();
            async move { lease.renew(&id, None).await }
        });
        tokio::task::yield_now().await;
        // The deadline passes while the store is still being asked.
        tokio::time::advance(Duration::from_millis(15)).await;
        let refusal = lease.admit(Access::Change, None).err();
        assert!(
            matches!(refusal, Some(LeaseError::Ending { ref owner }) if owner == "A"),
            "a non-holder was admitted while A's lease was past its deadline: {refusal:?}"
        );
        assert!(matches!(
            lease.admit(Access::ForcedRead, None),
            Err(LeaseError::Ending { .. })
        ));
        assert!(
            holders_guard().is_err(),
            "the holder's guard passed past the deadline"
        );
        // The renewal is confirmed after the deadline: it does not extend the lease.
        let renewed = renewal.await.unwrap();
        assert!(
            matches!(renewed, Err(LeaseError::NoSuchLease)),
            "a renewal confirmed after the deadline extended the lease: {renewed:?}"
        );
        assert!(!lease.view().held);
        assert!(lease.admit(Access::Change, None).is_ok());
        // And the store agrees: the next one takes it with a new fence.
        let next = lease
            .acquire("B".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        assert!(next.fence > held.fence);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_confirmed_before_the_deadline_extends_the_lease() {
        let lease = control_lease_with_slow_refresh(Duration::from_millis(20));
        let held = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(900)).await;
        let renewed = lease.renew(&held.lease_id, None).await.unwrap();
        assert_eq!(renewed.fence, held.fence);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(lease.view().held);
        assert!(lease.admit(Access::Change, Some(&held.lease_id)).is_ok());
        assert!(matches!(
            lease.admit(Access::Change, None),
            Err(LeaseError::LockedBy { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_admitted_while_free_is_refused_at_the_link_while_a_lease_is_past_its_deadline()
     {
        let (lease, _events) = control_lease();
        let held = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        tokio::time::advance(TTL).await;
        // Nobody has settled the expiry yet: the lease is ending, not free.
        let error = lease.admit(Access::Change, None).err().unwrap();
        assert!(error.to_string().contains("between leases"), "{error}");
        lease.release(&held.lease_id).await.unwrap_err();
        let guard = lease.admit(Access::Change, None).unwrap().guard.unwrap();
        assert!(guard().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_admitted_under_fence_n_is_refused_at_the_link_once_the_lease_moved_on() {
        let (lease, _events) = control_lease();
        let first = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        let admitted = lease.admit(Access::Change, Some(&first.lease_id)).unwrap();
        assert_eq!(admitted.fence, Some(first.fence));
        let guard = admitted.guard.unwrap();
        assert!(guard().is_ok());
        lease.release(&first.lease_id).await.unwrap();
        let second = lease
            .acquire("B".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        let refusal = guard().unwrap_err();
        assert!(
            refusal.contains("lease ended") && refusal.contains("B's"),
            "{refusal}"
        );
        assert!(second.fence > first.fence);
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_past_its_ttl_is_refused_even_before_the_expiry_task_runs() {
        let (lease, _events) = control_lease();
        let first = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        let guard = lease
            .admit(Access::Change, Some(&first.lease_id))
            .unwrap()
            .guard
            .unwrap();
        tokio::time::advance(TTL).await;
        assert!(guard().unwrap_err().contains("ran out"));
        let error = lease
            .admit(Access::Change, Some(&first.lease_id))
            .err()
            .unwrap();
        assert!(error.to_string().starts_with("lease ended"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_admitted_while_nobody_held_it_is_refused_once_someone_takes_it() {
        let (lease, _events) = control_lease();
        let guard = lease.admit(Access::Change, None).unwrap().guard.unwrap();
        assert!(guard().is_ok());
        lease
            .acquire("B".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        assert!(guard().unwrap_err().contains("leased by B"));
    }

    #[tokio::test(start_paused = true)]
    async fn non_holders_are_refused_changes_and_forced_reads_but_not_cached_reads() {
        let (lease, _events) = control_lease();
        let held = lease
            .acquire(
                "TAT station 3".into(),
                Duration::from_secs(12),
                None,
                Duration::ZERO,
            )
            .await
            .unwrap();
        for access in [Access::Change, Access::ForcedRead] {
            let error = lease.admit(access, None).err().unwrap();
            let message = error.to_string();
            assert!(
                message.contains("held by TAT station 3 for another 12 s"),
                "{message}"
            );
        }
        let cached = lease.admit(Access::CachedRead, None).unwrap();
        assert!(cached.refuse_uncached("I2C", true).is_some());
        assert!(cached.guard.is_none(), "a cache-only read needs no guard");
        let holders = lease
            .admit(Access::CachedRead, Some(&held.lease_id))
            .unwrap();
        assert!(holders.refuse_uncached("I2C", true).is_none());
        assert_eq!(holders.fence, Some(held.fence));
        assert!(lease.admit(Access::Open, Some("0123")).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_expiry_task_ends_a_lease_that_was_not_renewed_and_publishes_it() {
        let (lease, mut events) = control_lease();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
        let held = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        assert!(events.recv().await.unwrap().held);
        tokio::time::sleep(Duration::from_millis(600)).await;
        lease.renew(&held.lease_id, None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(lease.view().held, "renewed: still held past the first TTL");
        let ran_out = events.recv().await.unwrap();
        assert_eq!(ran_out, LeaseView::nobody());
        assert!(matches!(
            lease.renew(&held.lease_id, None).await,
            Err(LeaseError::NoSuchLease)
        ));
        assert!(matches!(
            lease.release(&held.lease_id).await,
            Err(LeaseError::NoSuchLease)
        ));
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn reacquiring_with_the_live_id_renews_the_same_lease() {
        let (lease, _events) = control_lease();
        let held = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(700)).await;
        let again = lease
            .acquire("A".into(), TTL, Some(&held.lease_id), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            (&again.lease_id, again.fence, again.expires_in_ms),
            (&held.lease_id, held.fence, 1000)
        );
        // A stale id is just an acquisition like any other.
        lease.release(&held.lease_id).await.unwrap();
        let fresh = lease
            .acquire("A".into(), TTL, Some(&held.lease_id), Duration::ZERO)
            .await
            .unwrap();
        assert_ne!(fresh.lease_id, held.lease_id);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_first_come_first_served() {
        let (lease, _events) = control_lease();
        let held = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        let wait = Duration::from_secs(10);
        let second = tokio::spawn({
            let lease = lease.clone();
            async move { lease.acquire("B".into(), TTL, None, wait).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let third = tokio::spawn({
            let lease = lease.clone();
            async move { lease.acquire("C".into(), TTL, None, wait).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Someone not waiting does not jump the line.
        assert!(matches!(
            lease.acquire("D".into(), TTL, None, Duration::ZERO).await,
            Err(LeaseError::HeldByOther { .. })
        ));
        lease.release(&held.lease_id).await.unwrap();
        let second = second.await.unwrap().unwrap();
        assert_eq!(second.owner, "B");
        assert!(!third.is_finished());
        lease.release(&second.lease_id).await.unwrap();
        assert_eq!(third.await.unwrap().unwrap().owner, "C");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_after_its_wait_with_a_409() {
        let (lease, _events) = control_lease();
        lease
            .acquire("A".into(), Duration::from_secs(30), None, Duration::ZERO)
            .await
            .unwrap();
        let started = Instant::now();
        let error = lease
            .acquire("B".into(), TTL, None, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(error, LeaseError::HeldByOther { ref owner, .. } if owner == "A"),
            "{error}"
        );
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert!(lock(&lease.line).waiting.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_that_ran_out_goes_to_the_next_in_line() {
        let (lease, mut events) = control_lease();
        let shutdown = CancellationToken::new();
        tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
        lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        let next = lease
            .acquire("B".into(), TTL, None, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(next.owner, "B");
        let seen: Vec<Option<String>> = std::iter::from_fn(|| events.try_recv().ok())
            .map(|view| view.owner)
            .collect();
        assert_eq!(seen, [Some("A".to_owned()), None, Some("B".to_owned())]);
        shutdown.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn the_admin_break_ends_whoever_holds_it() {
        let (lease, _events) = control_lease();
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert!(matches!(
            lease.break_lease(peer).await,
            Err(LeaseError::NobodyHolds)
        ));
        let held = lease
            .acquire("A".into(), TTL, None, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(
            lease.break_lease(peer).await.unwrap().owner.as_deref(),
            Some("A")
        );
        assert!(!lease.view().held);
        assert!(matches!(
            lease.renew(&held.lease_id, None).await,
            Err(LeaseError::NoSuchLease)
        ));
    }
}
