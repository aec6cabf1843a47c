//! The gateway's control lease (`control:<station>`) on top of a [`LeaseStore`]: acquire, renew,
//! release, waiting in line, the admin break, expiry with safe state, change-of-hands events,
//! and the admission check with its link-side fence ([`SendGuard`]).
//!
//! Two locks, both short:
//! - `transitions` (async) serialises every change of the lease, so that "ran out, safe state
//!   applied, handed to the next in line" happens as one step before anyone else may take it;
//! - `live` (sync) is the snapshot that admission and the link's send guards read: holder,
//!   token, fence and expiry instant. Guards check the expiry themselves, so a holder that
//!   stalled past its TTL can never write, even before the expiry task has run.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{Notify, broadcast, oneshot};
use tokio::time::Instant;
use tracing::{info, warn};

use super::store::{AcquireRequest, Acquisition, LeaseGrant, LeaseStore, LeaseToken};
use super::{Access, LeaseError, LeaseView, millis, rfc3339};
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
    /// For changes: the check the link runs right before sending.
    pub guard: Option<SendGuard>,
    /// For a non-holder's cached read while someone else holds the lease: channels whose read
    /// consumes data must come from the cache only.
    pub consuming_from_cache_only: Option<OtherHolder>,
}

impl Admitted {
    /// The refusal for a consuming channel with nothing cached, when reads of it are cache-only.
    pub fn refuse_consuming(&self, channel: &str) -> Option<LeaseError> {
        self.consuming_from_cache_only
            .as_ref()
            .map(|holder| LeaseError::ConsumingNotCached {
                channel: channel.to_owned(),
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
}

type LiveSnapshot = Arc<Mutex<Option<LiveLease>>>;

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

/// The gateway's control lease. Shared as `Arc<ControlLease>`.
pub struct ControlLease {
    store: Arc<dyn LeaseStore>,
    name: String,
    live: LiveSnapshot,
    transitions: tokio::sync::Mutex<()>,
    line: Mutex<WaitLine>,
    /// Wakes the expiry task when the expiry instant may have changed.
    expiry_changed: Notify,
    events: broadcast::Sender<LeaseView>,
    safe_state: Option<SafeState>,
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
            live: Arc::default(),
            transitions: tokio::sync::Mutex::new(()),
            line: Mutex::default(),
            expiry_changed: Notify::new(),
            events,
            safe_state: None,
            counters: Default::default(),
        }
    }

    /// Applies `writes` through `link` whenever a lease runs out without being released.
    pub fn with_safe_state(mut self, link: LinkHandle, writes: Vec<SafeWrite>) -> Self {
        self.safe_state = Some(SafeState { link, writes });
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Loads the store's live lease, if any (a backend that outlives the process).
    pub async fn resume(&self) -> Result<(), LeaseError> {
        let _transition = self.transitions.lock().await;
        let asked_at = Instant::now();
        if let Some(grant) = self.store.current(&self.name).await? {
            info!(owner = %grant.owner, fence = grant.fence, "control lease resumed from the store");
            *lock(&self.live) = Some(LiveLease::from_grant(grant, asked_at));
            self.expiry_changed.notify_one();
        }
        Ok(())
    }

    /// Who holds it, as anyone may see it.
    pub fn view(&self) -> LeaseView {
        let now = Instant::now();
        lock(&self.live)
            .as_ref()
            .filter(|live| live.is_live(now))
            .map_or_else(LeaseView::nobody, |l| l.view(now))
    }

    /// The fence of the live lease when `presented` is its id.
    pub fn fence_of(&self, presented: Option<&str>) -> Option<u64> {
        let presented = presented?;
        let now = Instant::now();
        let live = lock(&self.live);
        live.as_ref()
            .filter(|l| l.is_live(now) && l.token.matches(presented))
            .map(|l| l.fence)
    }

    /// Admission: may a request that needs `access` and carries `presented` as its `X-Lease-Id`
    /// go ahead? Synchronous and cheap; called once for every request.
    pub fn admit(&self, access: Access, presented: Option<&str>) -> Result<Admitted, LeaseError> {
        let now = Instant::now();
        let live = lock(&self.live);
        let live = live.as_ref().filter(|l| l.is_live(now));
        let holder_fence = live
            .filter(|l| presented.is_some_and(|p| l.token.matches(p)))
            .map(|l| l.fence);
        match access {
            Access::Open => Ok(Admitted {
                fence: holder_fence,
                ..Admitted::default()
            }),
            Access::CachedRead => Ok(Admitted {
                fence: holder_fence,
                consuming_from_cache_only: live
                    .filter(|_| holder_fence.is_none())
                    .map(|l| l.other_holder(now)),
                ..Admitted::default()
            }),
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
                }
                let guard = (access == Access::Change).then(|| self.send_guard(holder_fence));
                Ok(Admitted {
                    fence: holder_fence,
                    guard,
                    consuming_from_cache_only: None,
                })
            }
        }
    }

    /// The link-side fence for a change admitted under the lease with `admitted_fence`, or
    /// under "nobody holds it" (`None`): it refuses once the lease changed hands or ran out.
    fn send_guard(&self, admitted_fence: Option<u64>) -> SendGuard {
        let live = self.live.clone();
        Arc::new(move || {
            let now = Instant::now();
            let live = lock(&live);
            let current = live.as_ref().filter(|l| l.is_live(now));
            match (admitted_fence, current) {
                (Some(admitted), Some(current)) if current.fence == admitted => Ok(()),
                (None, None) => Ok(()),
                (Some(admitted), Some(current)) => Err(format!(
                    "lease ended: the lease this change was admitted under (fence {admitted}) was replaced by \
                     {}'s (fence {}) before the change reached the station; it was not sent",
                    current.owner, current.fence
                )),
                (Some(admitted), None) => Err(format!(
                    "lease ended: the lease this change was admitted under (fence {admitted}) ran out or was \
                     released before the change reached the station; it was not sent"
                )),
                (None, Some(current)) => Err(format!(
                    "the station was leased by {} before this change reached it; it was not sent",
                    current.owner
                )),
            }
        })
    }

    /// `POST lease`: takes the lease for `ttl`; with the live lease's id as `presented`, renews
    /// it (same id and fence). While someone else holds it, waits up to `wait` in line (first
    /// come, first served), then refuses.
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
            if let Some(token) = presented.and_then(|p| self.live_token(p)) {
                let request = AcquireRequest {
                    owner,
                    ttl,
                    token: Some(token),
                };
                return match self.try_take(request).await? {
                    Ok(answer) => Ok(answer),
                    Err(holder) => Err(LeaseError::HeldByOther {
                        owner: holder.owner,
                        expires_in: holder.expires_in,
                    }),
                };
            }
            let nobody_waiting = {
                let mut line = lock(&self.line);
                line.waiting.retain(|waiter| !waiter.reply.is_closed());
                line.waiting.is_empty()
            };
            if nobody_waiting {
                let request = AcquireRequest {
                    owner: owner.clone(),
                    ttl,
                    token: None,
                };
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
    pub async fn renew(
        &self,
        presented: &str,
        ttl: Option<Duration>,
    ) -> Result<LeaseAnswer, LeaseError> {
        let _transition = self.transitions.lock().await;
        self.settle_expiry().await;
        let token = self.live_token(presented).ok_or(LeaseError::NoSuchLease)?;
        let asked_at = Instant::now();
        match self.store.refresh(&self.name, &token, ttl).await? {
            Some(grant) => {
                let live = LiveLease::from_grant(grant, asked_at);
                let answer = live.answer(Instant::now());
                *lock(&self.live) = Some(live);
                self.expiry_changed.notify_one();
                Ok(answer)
            }
            None => {
                // The store says it ended before our clock did: it ran out.
                let ended = lock(&self.live).take();
                if let Some(ended) = ended {
                    self.after_running_out(ended).await;
                }
                Err(LeaseError::NoSuchLease)
            }
        }
    }

    /// `DELETE lease/{id}`: ends the lease `presented`. A release never applies the safe state.
    pub async fn release(&self, presented: &str) -> Result<(), LeaseError> {
        let _transition = self.transitions.lock().await;
        self.settle_expiry().await;
        let token = self.live_token(presented).ok_or(LeaseError::NoSuchLease)?;
        let released = self.store.release(&self.name, &token).await?;
        let ended = lock(&self.live).take();
        let Some(ended) = ended else {
            return Err(LeaseError::NoSuchLease);
        };
        if !released {
            self.after_running_out(ended).await;
            return Err(LeaseError::NoSuchLease);
        }
        info!(owner = %ended.owner, fence = ended.fence, "control lease released");
        self.counters.released.inc();
        self.publish(LeaseView::nobody());
        self.hand_over().await;
        Ok(())
    }

    /// `DELETE api/lease` with the admin token: ends whoever holds it. Returns what was broken.
    pub async fn break_lease(&self, peer: SocketAddr) -> Result<LeaseView, LeaseError> {
        let _transition = self.transitions.lock().await;
        self.settle_expiry().await;
        let Some(live) = lock(&self.live).clone() else {
            return Err(LeaseError::NobodyHolds);
        };
        let broken = live.view(Instant::now());
        self.store.release(&self.name, &live.token).await?;
        *lock(&self.live) = None;
        warn!(
            owner = %live.owner,
            fence = live.fence,
            %peer,
            at = %rfc3339(SystemTime::now()),
            "control lease broken by an admin from {peer}"
        );
        self.counters.broken.inc();
        self.publish(LeaseView::nobody());
        self.hand_over().await;
        Ok(broken)
    }

    /// The live lease's token when `presented` is it.
    fn live_token(&self, presented: &str) -> Option<LeaseToken> {
        let now = Instant::now();
        let live = lock(&self.live);
        live.as_ref()
            .filter(|l| l.is_live(now) && l.token.matches(presented))
            .map(|l| l.token.clone())
    }

    /// The 409 for the live holder (or for a lease promised to the next in line).
    fn held_by_other(&self) -> LeaseError {
        let now = Instant::now();
        match lock(&self.live).as_ref().filter(|l| l.is_live(now)) {
            Some(live) => LeaseError::HeldByOther {
                owner: live.owner.clone(),
                expires_in: live.expires_in(now),
            },
            None => LeaseError::HeldByOther {
                owner: "a client that waited for it".into(),
                expires_in: Duration::ZERO,
            },
        }
    }

    /// One attempt at the store. `Err` names who holds it. Caller holds `transitions`.
    async fn try_take(
        &self,
        request: AcquireRequest,
    ) -> Result<Result<LeaseAnswer, super::LeaseHolder>, LeaseError> {
        let asked_at = Instant::now();
        let (grant, taken) = match self.store.try_acquire(&self.name, request).await? {
            Acquisition::Taken(grant) => (grant, true),
            Acquisition::Renewed(grant) => (grant, false),
            Acquisition::HeldByOther(holder) => return Ok(Err(holder)),
        };
        let live = LiveLease::from_grant(grant, asked_at);
        let now = Instant::now();
        let answer = live.answer(now);
        let view = live.view(now);
        if taken {
            info!(owner = %live.owner, fence = live.fence, "control lease taken");
            self.counters.taken.inc();
        }
        *lock(&self.live) = Some(live);
        self.expiry_changed.notify_one();
        if taken {
            self.publish(view);
        }
        Ok(Ok(answer))
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
            let request = AcquireRequest {
                owner: waiter.owner.clone(),
                ttl: waiter.ttl,
                token: None,
            };
            match self.try_take(request).await {
                Ok(Ok(answer)) => match waiter.reply.send(answer) {
                    Ok(()) => return,
                    Err(unclaimed) => {
                        // It stopped waiting in the same instant: end the lease nobody will use.
                        let unused = lock(&self.live).take();
                        if let Some(unused) = unused {
                            let _ = self.store.release(&self.name, &unused.token).await;
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

mod expiry;
#[cfg(test)]
mod tests;
