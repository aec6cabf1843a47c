//! The lease machine's shell: requests become [`Event`]s driven on a task of their own, one
//! [`Turn`] at a time; the machine's [`Action`]s are carried out here (the store, the link, the
//! safe state, the `lease` event, logs, counters and the audit notice).
//!
//! A request that asks for a transition awaits its answer for at most [`ANSWER_BOUND`]; the
//! transition goes on whether or not anyone still waits for it, so a client that hangs up never
//! leaves a lease half ended. Waiting in line (`POST lease?waitMs=N`) stays the waiter's: a
//! waiter that went away is skipped, and a lease taken for one that went away in that instant
//! is ended at once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{OwnedMutexGuard, oneshot};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::super::notice::LeaseNotice;
use super::super::{LeaseError, LeaseStoreError, LeaseView, rfc3339};
use super::events::{
    Action, Answer, EndCause, Event, Grantee, ReadBackRound, Record, SafeStopOutcome,
};
use super::state::STORE_CALL_BOUND;
use super::{ControlLease, LeaseAnswer, Waiter, lock};

/// How long a request waits for the transition it asked for; the transition goes on past it.
const ANSWER_BOUND: Duration = Duration::from_secs(60);

/// What the request being served gets.
enum Reply {
    Answer(Answer),
    /// A new lease, for a request that may have gone away by now.
    Granted(LeaseAnswer),
    /// In line: the ticket, and where the lease comes should it be handed over.
    Waiting(u64, oneshot::Receiver<LeaseAnswer>),
}

impl ControlLease {
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
        self.acquire_unless(owner, ttl, presented, wait, std::future::pending())
            .await
    }

    /// [`ControlLease::acquire`], but a wait in line ends, refused as when it runs out, once
    /// `gone` resolves: the client closed its side while it waited, and nothing is taken for
    /// it (else a lease would be granted to a client that had gone, its id received by nobody).
    pub async fn acquire_unless(
        self: &Arc<Self>,
        owner: String,
        ttl: Duration,
        presented: Option<&str>,
        wait: Duration,
        gone: impl Future<Output = ()>,
    ) -> Result<LeaseAnswer, LeaseError> {
        let request = Request::Acquire {
            owner,
            ttl,
            presented: presented.map(str::to_owned),
            wait: !wait.is_zero(),
        };
        let (ticket, mut granted) = match self.ask(request).await? {
            Reply::Granted(answer) | Reply::Answer(Answer::Renewed(answer)) => return Ok(answer),
            Reply::Waiting(ticket, granted) => (ticket, granted),
            other => return Err(mismatched(other)),
        };
        tokio::select! {
            // In order: a deterministic simulation replays the same choice.
            biased;
            answer = &mut granted => answer.map_err(|_| self.held_by_other()),
            () = tokio::time::sleep(wait) => {
                lock(&self.line).waiting.retain(|waiter| waiter.ticket != ticket);
                // Handed over in the instant the wait ran out: it is ours.
                granted.try_recv().map_err(|_| self.held_by_other())
            }
            () = gone => {
                lock(&self.line).waiting.retain(|waiter| waiter.ticket != ticket);
                // Handed over in that instant: its answer goes out as any other's.
                granted.try_recv().map_err(|_| self.held_by_other())
            }
        }
    }

    /// `PUT lease/{id}`: extends the lease `presented` from now by `ttl` (`None`: its TTL).
    /// Only a renewal the store confirms before the lease's local deadline extends it.
    pub async fn renew(
        self: &Arc<Self>,
        presented: &str,
        ttl: Option<Duration>,
    ) -> Result<LeaseAnswer, LeaseError> {
        let presented = presented.to_owned();
        match self.ask(Request::Renew { presented, ttl }).await? {
            Reply::Answer(Answer::Renewed(answer)) => Ok(answer),
            other => Err(mismatched(other)),
        }
    }

    /// `DELETE lease/{id}`: ends the lease `presented`. A release never applies the safe state.
    pub async fn release(self: &Arc<Self>, presented: &str) -> Result<(), LeaseError> {
        let presented = presented.to_owned();
        match self.ask(Request::Release { presented }).await? {
            Reply::Answer(Answer::Released) => Ok(()),
            other => Err(mismatched(other)),
        }
    }

    /// `DELETE api/lease` with the admin token: ends whoever holds it. Returns what was broken.
    pub async fn break_lease(self: &Arc<Self>, peer: SocketAddr) -> Result<LeaseView, LeaseError> {
        let asked_at = Instant::now();
        match self.ask(Request::Break { peer, asked_at }).await? {
            Reply::Answer(Answer::Broken(view)) => Ok(view),
            other => Err(mismatched(other)),
        }
    }

    /// `POST /v1/safe-stop` by `by` (anyone with control): ends the lease held, if any, and
    /// applies the safe state in any case; answered once the station has confirmed it (or a
    /// try has failed: the lease task goes on with it), or at once when none is configured.
    pub async fn safe_stop(
        self: &Arc<Self>,
        by: String,
        reason: String,
    ) -> Result<SafeStopOutcome, LeaseError> {
        match self.ask(Request::SafeStop { by, reason }).await? {
            Reply::Answer(Answer::SafeStopped(outcome)) => Ok(outcome),
            other => Err(mismatched(other)),
        }
    }

    /// Drives `request` on a task of its own, after any lease that ran out has ended; its
    /// answer, awaited for at most [`ANSWER_BOUND`].
    async fn ask(self: &Arc<Self>, request: Request) -> Result<Reply, LeaseError> {
        let (reply, answer) = oneshot::channel();
        let lease = self.clone();
        let transition = async move {
            let mut turn = lease.turn().await;
            turn.drive(Event::Deadline, None).await;
            if let Some(refusal) = turn.not_link_owner(&request) {
                let _ = reply.send(Reply::Answer(Answer::Refused(refusal)));
                return;
            }
            let event = turn.event_for(&request);
            turn.drive(event, Some((request, reply))).await;
        };
        // Hole put back (reintroduce-holes only): the transition lives in the request's future,
        // so a client that hangs up leaves it half done.
        if crate::holes::active("transition-in-request") {
            let (done, answer) = futures::future::join(transition, answer).await;
            let () = done;
            return match answer {
                Ok(Reply::Answer(Answer::Refused(refusal))) => Err(refusal),
                Ok(reply) => Ok(reply),
                Err(_) => Err(self.held_by_other()),
            };
        }
        self.runtime.spawn(transition);
        match tokio::time::timeout(ANSWER_BOUND, answer).await {
            Ok(Ok(Reply::Answer(Answer::Refused(refusal)))) => Err(refusal),
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) | Err(_) => Err(self.held_by_other()),
        }
    }

    /// The right to drive the machine, one transition at a time.
    pub(super) async fn turn(self: &Arc<Self>) -> Turn {
        Turn {
            _turn: self.transitions.clone().lock_owned().await,
            lease: self.clone(),
            handing: None,
        }
    }
}

/// A request, as the shell keeps it while its transition runs.
enum Request {
    Acquire {
        owner: String,
        ttl: Duration,
        presented: Option<String>,
        wait: bool,
    },
    Renew {
        presented: String,
        ttl: Option<Duration>,
    },
    Release {
        presented: String,
    },
    Break {
        peer: SocketAddr,
        asked_at: Instant,
    },
    SafeStop {
        by: String,
        reason: String,
    },
}

/// The one who may drive the lease machine now: only a `Turn` feeds it events, so no two
/// transitions ever interleave.
pub(super) struct Turn {
    _turn: OwnedMutexGuard<()>,
    lease: Arc<ControlLease>,
    /// The waiter the free lease is being handed to.
    handing: Option<Waiter>,
}

impl Turn {
    /// The refusal of a new lease asked for without waiting while this process does not own
    /// the station's link (a renewal of the live lease goes on): it names who serves it.
    fn not_link_owner(&self, request: &Request) -> Option<LeaseError> {
        let Request::Acquire {
            presented,
            wait: false,
            ..
        } = request
        else {
            return None;
        };
        if self.lease.fence_of(presented.as_deref()).is_some() {
            return None;
        }
        self.lease.owns_link().err().map(LeaseError::from)
    }

    fn event_for(&self, request: &Request) -> Event {
        match request {
            Request::Acquire {
                owner,
                ttl,
                presented,
                wait,
            } => {
                let line_empty = {
                    let mut line = lock(&self.lease.line);
                    line.waiting.retain(|waiter| !waiter.reply.is_closed());
                    line.waiting.is_empty()
                };
                // While this process does not own the station's link, one that waits waits in
                // line (it is handed the lease once it does).
                let line_empty = line_empty && self.lease.owns_link().is_ok();
                Event::Acquire {
                    owner: owner.clone(),
                    ttl: *ttl,
                    presented: presented.clone(),
                    wait: *wait,
                    line_empty,
                }
            }
            Request::Renew { presented, ttl } => Event::Renew {
                presented: presented.clone(),
                ttl: *ttl,
            },
            Request::Release { presented } => Event::Release {
                presented: presented.clone(),
            },
            Request::Break { peer, asked_at } => Event::Break {
                peer: *peer,
                asked_at: *asked_at,
            },
            Request::SafeStop { by, reason } => Event::SafeStop {
                by: by.clone(),
                reason: reason.clone(),
            },
        }
    }

    /// Drives `event`, which no request waits for (a deadline, the link).
    pub(super) async fn feed(&mut self, event: Event) {
        self.drive(event, None).await;
    }

    /// This process owns the station's link again: the first one waiting in line is handed
    /// the lease, if it is free.
    pub(super) async fn hand_over(&mut self) {
        if !lock(&self.lease.machine).state().is_free(Instant::now()) {
            return;
        }
        let mut reply = None;
        if let Some(next) = self.carry_out(Action::HandOver, &None, &mut reply).await {
            self.drive(next, None).await;
        }
    }

    /// Puts the acquisition being served in line; its reply is its place there.
    fn queue(
        &self,
        request: &Option<(Request, oneshot::Sender<Reply>)>,
        reply: &mut Option<Reply>,
    ) {
        let Some((Request::Acquire { owner, ttl, .. }, _)) = request else {
            return;
        };
        let (sender, granted) = oneshot::channel();
        let mut line = lock(&self.lease.line);
        let ticket = line.next_ticket;
        line.next_ticket += 1;
        line.waiting.push_back(Waiter {
            ticket,
            owner: owner.clone(),
            ttl: *ttl,
            reply: sender,
        });
        *reply = Some(Reply::Waiting(ticket, granted));
    }

    /// A lease about to be handed to `grantee` when this process no longer owns the station's
    /// link (it stood by while the lease's changes settled): nobody gets it. One that waits
    /// waits in line (the first again, a waiter), one that does not is refused naming who
    /// serves the station, and the lease, whose id nobody has, ends at once.
    fn withhold(
        &mut self,
        grantee: Grantee,
        answer: &LeaseAnswer,
        why: super::super::link_custody::NotLinkOwner,
        request: &Option<(Request, oneshot::Sender<Reply>)>,
        reply: &mut Option<Reply>,
    ) -> Event {
        warn!(
            owner = %answer.owner,
            "the lease is not granted to {}: {why}",
            answer.owner
        );
        match grantee {
            Grantee::Requester { wait: true } => self.queue(request, reply),
            Grantee::Requester { wait: false } => {
                *reply = Some(Reply::Answer(Answer::Refused(why.into())));
            }
            Grantee::Waiter(ticket) => {
                if let Some(waiter) = self.handing.take().filter(|w| w.ticket == ticket) {
                    lock(&self.lease.line).waiting.push_front(waiter);
                }
            }
        }
        Event::Unclaimed {
            fence: answer.fence,
        }
    }

    /// Feeds `first` and every answer it leads to into the machine until nothing is left to
    /// do; then answers `request`, if any (a new lease its client no longer takes is ended).
    async fn drive(
        &mut self,
        first: Event,
        mut request: Option<(Request, oneshot::Sender<Reply>)>,
    ) {
        let mut events = VecDeque::from([first]);
        let mut reply = None;
        loop {
            while let Some(event) = events.pop_front() {
                let actions = self.lease.on(event, Instant::now());
                for action in actions {
                    if let Some(next) = self.carry_out(action, &request, &mut reply).await {
                        events.push_back(next);
                    }
                }
            }
            let (Some((_, sender)), Some(answer)) = (request.take(), reply.take()) else {
                break;
            };
            if let Err(Reply::Granted(unclaimed)) = sender.send(answer) {
                events.push_back(Event::Unclaimed {
                    fence: unclaimed.fence,
                });
            }
        }
        self.lease.expiry_changed.notify_one();
    }

    /// Carries out one action; the event its answer is, if any.
    async fn carry_out(
        &mut self,
        action: Action,
        request: &Option<(Request, oneshot::Sender<Reply>)>,
        reply: &mut Option<Reply>,
    ) -> Option<Event> {
        let lease = &self.lease;
        match action {
            Action::Take {
                grantee,
                request,
                asked_at,
                remember_owed,
                mark_end_pending,
            } => {
                let answer = async {
                    lease
                        .mark_taking(&request.owner, remember_owed, mark_end_pending)
                        .await?;
                    lease.store.try_acquire(&lease.name, request).await
                };
                let answer = bounded(answer).await;
                return Some(Event::Taken {
                    grantee,
                    asked_at,
                    answer,
                });
            }
            Action::Refresh {
                token,
                ttl,
                asked_at,
            } => {
                let answer = bounded(lease.store.refresh(&lease.name, &token, ttl)).await;
                return Some(Event::Refreshed {
                    token,
                    asked_at,
                    answer,
                });
            }
            Action::Release { token, releasing } => {
                let answer = lease.store.release(&lease.name, &token).await;
                return Some(Event::Released {
                    token,
                    releasing,
                    answer,
                });
            }
            Action::Forget(token) => {
                if let Err(error) = lease.store.release(&lease.name, &token).await {
                    warn!("the lease store could not end a lease that has ended here: {error}");
                }
            }
            Action::ForgetOwed => lease.forget_safe_state_owed().await,
            Action::StoreEnd(lock_delay) => lease.store_end(lock_delay).await,
            Action::Settle(scope) => {
                // Hole put back (reintroduce-holes only): a lease's end waits for nothing of it.
                if crate::holes::active("end-without-settle")
                    && matches!(scope, crate::link::SettleScope::Fence(_))
                {
                    return Some(Event::ChangesSettled { lapsed_at: None });
                }
                let lapsed_at = match &lease.link {
                    Some(link) => link.settle(scope).await.lapsed_at,
                    None => None,
                };
                return Some(Event::ChangesSettled { lapsed_at });
            }
            Action::SendSafeState { after } => {
                let result = lease.apply_safe_state(&after).await;
                return Some(Event::SafeStateAnswered(result));
            }
            Action::ReadBackSafeState => {
                let result = lease.read_back_safe_state().await;
                return Some(Event::SafeStateReadBack(result));
            }
            Action::Publish(view) => lease.publish(view),
            Action::Record(record) => lease.record(record),
            Action::Answer(Answer::Queued) => self.queue(request, reply),
            Action::Answer(answer) => *reply = Some(Reply::Answer(answer)),
            // Asked at the moment of granting, not only at the door: the link may have begun
            // to stand by (another gateway serves the station) since the lease was taken.
            Action::Grant { grantee, answer } if lease.owns_link().is_err() => {
                let why = lease.owns_link().err()?;
                return Some(self.withhold(grantee, &answer, why, request, reply));
            }
            Action::Grant {
                grantee: Grantee::Requester { .. },
                answer,
            } => *reply = Some(Reply::Granted(answer)),
            Action::Grant {
                grantee: Grantee::Waiter(ticket),
                answer,
            } => {
                let waiter = self.handing.take().filter(|w| w.ticket == ticket)?;
                if let Err(unclaimed) = waiter.reply.send(answer) {
                    // It stopped waiting in the same instant: end the lease nobody will use.
                    return Some(Event::Unclaimed {
                        fence: unclaimed.fence,
                    });
                }
            }
            // Nobody is handed the lease while this process does not own the station's link:
            // the line waits until it does (`Turn::hand_over`).
            Action::HandOver if lease.owns_link().is_err() => {}
            Action::HandOver => loop {
                let waiter = lock(&lease.line).waiting.pop_front()?;
                if waiter.reply.is_closed() {
                    continue;
                }
                let event = Event::NextInLine {
                    ticket: waiter.ticket,
                    owner: waiter.owner.clone(),
                    ttl: waiter.ttl,
                };
                self.handing = Some(waiter);
                return Some(event);
            },
            Action::BackInLine(ticket) => {
                if let Some(waiter) = self.handing.take().filter(|w| w.ticket == ticket) {
                    lock(&lease.line).waiting.push_front(waiter);
                }
            }
        }
        None
    }
}

impl ControlLease {
    /// Logs, counts and notifies (the audit trail) what the machine recorded.
    fn record(&self, record: Record) {
        match record {
            Record::Taken { owner, fence } => {
                info!(owner = %owner, fence, "control lease taken");
                self.counters.taken.inc();
                self.notify(LeaseNotice::Taken {
                    owner: &owner,
                    fence,
                });
            }
            Record::Ended {
                owner,
                fence,
                cause,
            } => self.record_end(&owner, fence, cause),
            Record::RenewedTooLate { owner, fence } => warn!(
                owner = %owner,
                fence,
                "a renewal of {owner}'s lease was confirmed by the store only after the lease's deadline: the lease ended at its deadline"
            ),
            Record::SafeStateApplied { owner, fence } => {
                self.counters.safe_state_applied.inc();
                self.notify(LeaseNotice::SafeState {
                    owner: &owner,
                    fence,
                    result: Ok(()),
                });
            }
            Record::SafeStopped { by, reason, ended } => {
                warn!(
                    by = %by,
                    at = %rfc3339(SystemTime::now()),
                    "safe stop pressed by {by}: {reason}"
                );
                self.notify(LeaseNotice::SafeStopped {
                    by: &by,
                    reason: &reason,
                    lease: ended
                        .as_ref()
                        .map(|(owner, fence)| (owner.as_str(), *fence)),
                });
            }
            Record::SafeStateFailed {
                owner,
                fence,
                tries,
                why,
                retry_in,
            } => {
                self.counters.safe_state_failed.inc();
                self.notify(LeaseNotice::SafeState {
                    owner: &owner,
                    fence,
                    result: Err(&why),
                });
                error!(
                    owner = %owner,
                    fence,
                    tries,
                    "the safe state after {owner}'s lease is not confirmed (try {tries}): {why}; trying again in {} ms; no change and no new lease until it is",
                    retry_in.as_millis()
                );
            }
            Record::SafeStateOverridden {
                owner,
                fence,
                round,
                differs,
                retry_in,
            } => {
                self.counters.safe_state_overridden.inc();
                let listed: Vec<String> = differs.iter().map(ToString::to_string).collect();
                let why = format!(
                    "a late change overrode the safe state: {}",
                    listed.join("; ")
                );
                self.notify(LeaseNotice::SafeState {
                    owner: &owner,
                    fence,
                    result: Err(&why),
                });
                let when = match round {
                    ReadBackRound::First => "right after its writes",
                    ReadBackRound::Second => "after the longest processing",
                };
                error!(
                    owner = %owner,
                    fence,
                    "{why} (read back {when}, after {owner}'s lease); applying it again in {} ms",
                    retry_in.as_millis()
                );
            }
            Record::SafeStateReadBack { owner, fence } => info!(
                owner = %owner,
                fence,
                "the safe state after {owner}'s lease read back right twice: done"
            ),
        }
    }

    fn record_end(&self, owner: &str, fence: u64, cause: EndCause) {
        match cause {
            EndCause::Released => {
                info!(owner = %owner, fence, "control lease released");
                self.counters.released.inc();
                self.notify(LeaseNotice::Released { owner, fence });
            }
            EndCause::Broken { peer } => {
                warn!(
                    owner = %owner,
                    fence,
                    %peer,
                    at = %rfc3339(SystemTime::now()),
                    "control lease broken by an admin from {peer}"
                );
                self.counters.broken.inc();
                self.notify(LeaseNotice::Broken { owner, fence, peer });
            }
            EndCause::RanOut => {
                warn!(owner = %owner, fence, "control lease ran out: {owner} did not renew it in time");
                self.counters.expired.inc();
                self.notify(LeaseNotice::RanOut { owner, fence });
            }
            EndCause::SafeStopped { by, reason } => {
                // Its audit line is the safe stop's own (`Record::SafeStopped`).
                warn!(owner = %owner, fence, "control lease safe-stopped by {by}: {reason}");
            }
            EndCause::Unclaimed => {
                info!(owner = %owner, "control lease released: its waiter gave up");
                self.notify(LeaseNotice::Released { owner, fence });
            }
        }
    }
}

/// A store call that takes or renews a lease, failed once it has gone on for
/// [`STORE_CALL_BOUND`]: the store's copy of a lease granted or renewed then ends at most that
/// much after the deadline its holder is told (counted from before the call), and a lease
/// resumed after a restart ends that much sooner than the store says (`LiveLease::resumed`).
async fn bounded<T>(
    call: impl Future<Output = Result<T, LeaseStoreError>>,
) -> Result<T, LeaseStoreError> {
    tokio::time::timeout(STORE_CALL_BOUND, call)
        .await
        .unwrap_or_else(|_| {
            Err(LeaseStoreError::Unavailable(format!(
                "the lease store did not answer within {} ms",
                STORE_CALL_BOUND.as_millis()
            )))
        })
}

/// A reply of another kind than the request asked for: never (the machine answers each
/// request with its kind of answer, refusals are errors already), so refused, never trusted.
fn mismatched(reply: Reply) -> LeaseError {
    debug_assert!(
        false,
        "the lease machine answered a request with another kind of answer"
    );
    drop(reply);
    LeaseError::NoSuchLease
}
