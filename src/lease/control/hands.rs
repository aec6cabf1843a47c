//! Taking, renewing and releasing the control lease, the admin break, and the line of
//! those waiting for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{info, warn};

use super::super::notice::LeaseNotice;
use super::super::store::{AcquireRequest, Acquisition};
use super::super::{LeaseError, LeaseView, rfc3339};
use super::state::{LeaseState, LiveLease};
use super::{ControlLease, LeaseAnswer, Waiter, lock};

/// What the part of an acquisition that changes the lease decided.
enum InLine {
    Granted(LeaseAnswer),
    Waiting(u64, oneshot::Receiver<LeaseAnswer>),
}

/// How long a request waits for a transition it asked for; the transition goes on past it.
const ANSWER_BOUND: Duration = Duration::from_secs(60);

impl ControlLease {
    /// Runs `transition` on a task of its own, so that a caller that goes away (a client that
    /// hung up) never leaves a lease half ended; the caller awaits its answer for at most
    /// [`ANSWER_BOUND`].
    async fn on_lease_task<T: Send + 'static>(
        &self,
        transition: impl Future<Output = Result<T, LeaseError>> + Send + 'static,
    ) -> Result<T, LeaseError> {
        match tokio::time::timeout(ANSWER_BOUND, tokio::spawn(transition)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(failed)) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Ok(Err(_)) | Err(_) => Err(self.held_by_other()),
        }
    }

    /// `POST lease`: takes the lease for `ttl`; with the live lease's id as `presented`, renews
    /// it (same id and fence). While someone else holds it, or a lease is still ending, waits
    /// up to `wait` in line (first come, first served), then refuses.
    pub async fn acquire(
        self: &Arc<Self>,
        owner: String,
        ttl: Duration,
        presented: Option<&str>,
        wait: Duration,
    ) -> Result<LeaseAnswer, LeaseError> {
        let this = self.clone();
        let presented = presented.map(str::to_owned);
        let taking = async move {
            this.take_or_queue(owner, ttl, presented.as_deref(), wait)
                .await
        };
        let (ticket, mut granted) = match self.on_lease_task(taking).await? {
            InLine::Granted(answer) => return Ok(answer),
            InLine::Waiting(ticket, granted) => (ticket, granted),
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

    /// The part of an acquisition that changes the lease: takes it, renews it, or queues.
    async fn take_or_queue(
        &self,
        owner: String,
        ttl: Duration,
        presented: Option<&str>,
        wait: Duration,
    ) -> Result<InLine, LeaseError> {
        {
            let _transition = self.transitions.lock().await;
            self.settle_expiry().await;
            if let Some(live) = presented.and_then(|p| self.live_lease(p)) {
                let request = AcquireRequest::new(owner, ttl).with_retry_token(live.token.clone());
                return self
                    .renew_by_acquire(request, &live)
                    .await
                    .map(InLine::Granted);
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
                    Ok(answer) => return Ok(InLine::Granted(answer)),
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
            Ok(InLine::Waiting(ticket, granted))
        }
    }

    /// `PUT lease/{id}`: extends the lease `presented` from now by `ttl` (`None`: its TTL).
    /// Only a renewal the store confirms before the lease's local deadline extends it.
    pub async fn renew(
        self: &Arc<Self>,
        presented: &str,
        ttl: Option<Duration>,
    ) -> Result<LeaseAnswer, LeaseError> {
        let (this, presented) = (self.clone(), presented.to_owned());
        self.on_lease_task(async move { this.renew_now(&presented, ttl).await })
            .await
    }

    async fn renew_now(
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
    pub(super) async fn install_renewal(
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
    pub(super) async fn end_now(&self, held: &LiveLease) {
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
    pub async fn release(self: &Arc<Self>, presented: &str) -> Result<(), LeaseError> {
        let (this, presented) = (self.clone(), presented.to_owned());
        self.on_lease_task(async move { this.release_now(&presented).await })
            .await
    }

    async fn release_now(&self, presented: &str) -> Result<(), LeaseError> {
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
        self.notify(LeaseNotice::Released {
            owner: &held.owner,
            fence: held.fence,
        });
        self.counters.released.inc();
        self.settle_changes(Some(held.fence)).await;
        self.finish_ending().await;
        Ok(())
    }

    /// `DELETE api/lease` with the admin token: ends whoever holds it. Returns what was broken.
    pub async fn break_lease(self: &Arc<Self>, peer: SocketAddr) -> Result<LeaseView, LeaseError> {
        let this = self.clone();
        self.on_lease_task(async move { this.break_now(peer).await })
            .await
    }

    async fn break_now(&self, peer: SocketAddr) -> Result<LeaseView, LeaseError> {
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
        self.notify(LeaseNotice::Broken {
            owner: &live.owner,
            fence: live.fence,
            peer,
        });
        self.settle_changes(Some(live.fence)).await;
        self.finish_ending().await;
        Ok(broken)
    }

    /// `POST lease` with the live lease's id: a renewal through the store's acquire. Caller
    /// holds `transitions`.
    pub(super) async fn renew_by_acquire(
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
    pub(super) async fn try_take(
        &self,
        request: AcquireRequest,
    ) -> Result<Result<LeaseAnswer, super::super::LeaseHolder>, LeaseError> {
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
            self.notify(LeaseNotice::Taken {
                owner: &live.owner,
                fence: live.fence,
            });
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

    /// Gives a free lease to the first one waiting in line that still waits. Caller holds
    /// `transitions`.
    pub(super) async fn hand_over(&self) {
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
                        self.notify(LeaseNotice::Released {
                            owner: &unclaimed.owner,
                            fence: unclaimed.fence,
                        });
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
}
