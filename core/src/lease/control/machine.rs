//! The control lease as a pure state machine: [`LeaseMachine::on`] takes an [`Event`] (a request,
//! the store's answer, the link's, a deadline) and the time, changes the lease state admission and
//! the send guards read, and returns the [`Action`]s the shell (`control/shell.rs`) carries out, in
//! order (both in `events.rs`). No I/O, no clock, no runtime: unit-tested with plain `#[test]`s.
//!
//! An action that asks something of the store, the link or the station (`Take`, `Refresh`,
//! `Release`, `Settle`, `SendSafeState`, `ReadBackSafeState`) is always the last of its batch; its
//! answer comes back as the next event. A lease ends in one place: [`LeaseMachine::end`]. The safe
//! state's read back is decided in `machine/read_back.rs`, the safe stop in `machine/safe_stop.rs`;
//! the lock-delay after a lease that did not end cleanly here ([`LeaseMachine::finish`]).

use std::time::Duration;

use tokio::time::Instant;

use super::super::store::{AcquireRequest, Acquisition, LeaseGrant, LeaseToken};
use super::super::{LeaseError, LeaseStoreError, LeaseView};
use super::events::{
    Action, Answer, EndCause, Event, Grantee, ReadBackRound, Record, Releasing, SafeStateError,
    SafeStopState,
};
use super::state::{
    LeaseState, LiveLease, LockDelay, LockDelayWhy, SafeStateStep, StoredLockDelay,
};
use crate::link::SettleScope;

mod adopt;
mod read_back;
mod safe_stop;
mod taking;

/// What a lock-delay follows when the change left in doubt was no lease's (or one a gateway
/// before this one left at the station): what a refusal names.
pub(super) const LEASELESS_CHANGE: &str = "a change made without a lease";

/// What a refusal before the station's ledger is read tells the client to wait.
const STATION_NOT_MET_RETRY: Duration = Duration::from_secs(1);

/// The first wait between tries of the safe state, and the longest.
pub(super) const SAFE_STATE_FIRST_BACKOFF: Duration = Duration::from_millis(100);
pub(super) const SAFE_STATE_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// When the next try of a pending safe state is due, and the wait after a failed one.
#[derive(Debug, Clone, Copy)]
struct SafeStateRetry {
    next_try: Instant,
    backoff: Duration,
}

/// The control lease's decisions. The state it keeps is what admission and the send guards
/// read ([`LeaseMachine::state`]).
pub(super) struct LeaseMachine {
    state: LeaseState,
    /// A lease that runs out leaves a safe state to apply.
    has_safe_state: bool,
    retry: SafeStateRetry,
    /// A lease just taken and waiting for the changes admitted while nobody held it, for whom.
    granting: Option<Grantee>,
    /// The link generation last seen up.
    generation: Option<u64>,
    /// A safe stop waiting for its answer, and the lease it ended (owner, fence), if any.
    stopping: Option<Option<(String, u64)>>,
    /// How long after the first read back of the safe state the second is due
    /// (`station.max_processing_ms`: any change still at the station has landed by then).
    read_back_after: Duration,
    /// How long a new lease (and a change without one) waits after a lease one of whose
    /// changes may still land (`lease.lock_delay_ms`).
    lock_delay: Duration,
    /// Whether the station's ledger has been read (or none is kept): until then no lease is
    /// granted, for what the station is owed is not known.
    station_known: bool,
    /// The id the store gives the lease being taken, should it take it.
    taking: Option<LeaseToken>,
    /// When the line is handed over again, its first not served by the store.
    hand_over_at: Option<Instant>,
}

impl LeaseMachine {
    pub(super) fn new(has_safe_state: bool, now: Instant) -> LeaseMachine {
        LeaseMachine {
            state: LeaseState::Free,
            has_safe_state,
            retry: SafeStateRetry {
                next_try: now,
                backoff: SAFE_STATE_FIRST_BACKOFF,
            },
            granting: None,
            generation: None,
            stopping: None,
            read_back_after: Duration::ZERO,
            lock_delay: Duration::ZERO,
            station_known: true,
            taking: None,
            hand_over_at: None,
        }
    }

    /// The machine, granting no lease until the station's ledger is read
    /// ([`Event::Adopted`]).
    pub(super) fn with_station_unknown(mut self) -> LeaseMachine {
        self.station_known = false;
        self
    }

    /// The machine, with a new lease waiting `lock_delay` after one one of whose changes may
    /// still land.
    pub(super) fn with_lock_delay(mut self, lock_delay: Duration) -> LeaseMachine {
        self.lock_delay = lock_delay;
        self
    }

    /// The machine, with the second read back of a safe state due `read_back_after` after the
    /// first.
    pub(super) fn with_read_back_after(mut self, read_back_after: Duration) -> LeaseMachine {
        self.read_back_after = read_back_after;
        self
    }

    pub(super) fn state(&self) -> &LeaseState {
        &self.state
    }

    /// When the expiry task must next feed [`Event::Deadline`]: the live lease's deadline, or
    /// the next try of a safe state owed.
    pub(super) fn next_wake(&self) -> Option<Instant> {
        match &self.state {
            LeaseState::Held(live) => Some(live.expires_at),
            LeaseState::Ending(ending) if ending.safe_state_owed => match ending.step {
                SafeStateStep::SecondReadBackAt(at) => Some(at),
                _ => Some(self.retry.next_try),
            },
            LeaseState::Locked(delay) => Some(delay.until),
            LeaseState::Free => self.hand_over_at,
            _ => None,
        }
    }

    /// The refusal for a client that may not take the lease now: who holds it, why nobody
    /// may, or the client who waited for it.
    pub(super) fn held_by_other(&self, now: Instant) -> LeaseError {
        match self.state.live(now) {
            Some(live) => LeaseError::HeldByOther {
                owner: live.owner.clone(),
                expires_in: live.expires_in(now),
            },
            None => self
                .station_unknown()
                .or(self.lock_delay_at(now))
                .or(self.state.between_leases(now))
                .unwrap_or(LeaseError::HeldByOther {
                    owner: "a client that waited for it".into(),
                    expires_in: Duration::ZERO,
                }),
        }
    }

    /// Decides what `event` at `now` changes and what the shell must do.
    pub(super) fn on(&mut self, event: Event, now: Instant) -> Vec<Action> {
        match event {
            Event::Acquire {
                owner,
                ttl,
                presented,
                wait,
                line_empty,
            } => self.acquire(owner, ttl, presented.as_deref(), wait, line_empty, now),
            Event::NextInLine { ticket, .. }
                if self.lock_delay_at(now).is_some() || !self.station_known =>
            {
                vec![Action::BackInLine(ticket)]
            }
            Event::NextInLine { ticket, owner, ttl } => self.take(
                Grantee::Waiter(ticket),
                AcquireRequest::new(owner, ttl),
                now,
            ),
            Event::Renew { presented, ttl } => match self.live_lease(&presented, now) {
                Some(live) => vec![Action::Refresh {
                    token: live.token.clone(),
                    ttl,
                    asked_at: now,
                }],
                None => refuse(LeaseError::NoSuchLease),
            },
            Event::Release { presented } => match self.live_lease(&presented, now) {
                Some(live) => vec![Action::Release {
                    token: live.token.clone(),
                    releasing: Releasing::Holder,
                }],
                None => refuse(LeaseError::NoSuchLease),
            },
            Event::Break { peer, asked_at } => match &self.state {
                LeaseState::Held(live) if live.granted_at.is_some_and(|at| at <= asked_at) => {
                    vec![Action::Release {
                        token: live.token.clone(),
                        releasing: Releasing::Admin {
                            peer,
                            broken: Box::new(live.view(now)),
                        },
                    }]
                }
                _ => refuse(LeaseError::NobodyHolds),
            },
            Event::SafeStop { by, reason } => self.safe_stop(by, reason, now),
            Event::Deadline => self.deadline(now),
            Event::Taken {
                grantee,
                asked_at,
                answer,
            } => match grantee {
                Some(grantee) => self.taken(grantee, asked_at, answer, now),
                None => self.renewed_by_acquire(asked_at, answer, now),
            },
            Event::Refreshed {
                token,
                asked_at,
                answer,
            } => match answer {
                Err(error) => refuse(error.into()),
                Ok(Some(grant)) => self.install_renewal(&token, grant, asked_at, now),
                Ok(None) => {
                    // The store says it ended before our clock did: it ran out.
                    let mut actions = self.end_held(&token, EndCause::RanOut, now);
                    actions.push(Action::Answer(Answer::Refused(LeaseError::NoSuchLease)));
                    actions
                }
            },
            Event::Released {
                token,
                releasing,
                answer,
            } => self.released(&token, releasing, answer, now),
            Event::ChangesSettled { lapsed_at } => self.changes_settled(lapsed_at, now),
            Event::SafeStateAnswered(result) => self.safe_state_answered(result, now),
            Event::SafeStateReadBack(result) => self.safe_state_read_back(result, now),
            Event::Unclaimed { fence } => match &self.state {
                LeaseState::Held(live) if live.fence == fence => {
                    let token = live.token.clone();
                    let mut actions = vec![Action::Forget(token.clone())];
                    actions.extend(self.end_held(&token, EndCause::Unclaimed, now));
                    actions
                }
                _ => Vec::new(),
            },
            Event::Link {
                connected,
                generation,
            } => match self.generation {
                // The first seen is where the expiry task started from.
                None => {
                    self.generation = Some(generation);
                    Vec::new()
                }
                Some(seen) if !connected || seen == generation => Vec::new(),
                Some(_) => {
                    // A station that came back is tried at once, with the back-off reset.
                    self.generation = Some(generation);
                    self.retry_now(now);
                    self.try_safe_state(now)
                }
            },
            Event::Resumed { held, asked_at } => self.resumed(held, asked_at),
            Event::Adopted { owed_after, end } => self.adopted(owed_after, end, now),
        }
    }

    fn acquire(
        &mut self,
        owner: String,
        ttl: Duration,
        presented: Option<&str>,
        wait: bool,
        line_empty: bool,
        now: Instant,
    ) -> Vec<Action> {
        if let Some(live) = presented.and_then(|p| self.live_lease(p, now)) {
            // A renewal: the lease keeps its holder's name, whatever this request calls it.
            return vec![Action::Take {
                grantee: None,
                request: AcquireRequest::new(live.owner.clone(), ttl)
                    .with_retry_token(live.token.clone()),
                asked_at: now,
                remember_owed: false,
                mark_end_pending: false,
            }];
        }
        let refusal = match self
            .station_unknown()
            .or(self.lock_delay_at(now))
            .or(self.state.between_leases(now))
        {
            Some(refusal) => refusal,
            None if line_empty => {
                return self.take(
                    Grantee::Requester { wait },
                    AcquireRequest::new(owner, ttl),
                    now,
                );
            }
            None => self.held_by_other(now),
        };
        match wait {
            true => vec![Action::Answer(Answer::Queued)],
            false => refuse(refusal),
        }
    }

    /// Asks the store for a new lease for `grantee`.
    fn take(&mut self, grantee: Grantee, request: AcquireRequest, now: Instant) -> Vec<Action> {
        // Before the lease: should the gateway stop with it held, the store still knows a safe
        // state is owed when it lapses.
        let remember_owed = self.has_safe_state && self.state.live(now).is_none();
        // Likewise: should the gateway stop (or a standby take over) before this lease's end
        // is recorded, the store knows one is pending, and the next holder waits the
        // lock-delay.
        let mark_end_pending = !self.lock_delay.is_zero() && self.state.live(now).is_none();
        self.taking = Some(request.fresh_token().clone());
        vec![Action::Take {
            grantee: Some(grantee),
            request,
            asked_at: now,
            remember_owed,
            mark_end_pending,
        }]
    }

    /// The store's answer to `POST lease` with the live lease's id.
    fn renewed_by_acquire(
        &mut self,
        asked_at: Instant,
        answer: Result<Acquisition, LeaseStoreError>,
        now: Instant,
    ) -> Vec<Action> {
        let Some(held) = self.held_token() else {
            return refuse(LeaseError::NoSuchLease);
        };
        match answer {
            Err(error) => refuse(error.into()),
            Ok(Acquisition::Renewed(grant)) => self.install_renewal(&held, grant, asked_at, now),
            Ok(Acquisition::Taken(grant)) => {
                // The store had ended the lease being renewed and made a new one: the old one
                // ran out (safe state first); the new one is nobody's.
                let mut actions = vec![Action::Forget(grant.token)];
                actions.extend(self.end_held(&held, EndCause::RanOut, now));
                actions.push(Action::Answer(Answer::Refused(LeaseError::NoSuchLease)));
                actions
            }
            Ok(Acquisition::HeldByOther(holder)) => refuse(LeaseError::HeldByOther {
                owner: holder.owner,
                expires_in: holder.expires_in,
            }),
        }
    }

    /// Puts a renewal of `token` the store confirmed in place, unless the lease's deadline
    /// passed while the store was asked: then it ended at its deadline (admission and the link
    /// already treated it so), the store's extension is undone, and the renewal is refused.
    fn install_renewal(
        &mut self,
        token: &LeaseToken,
        grant: LeaseGrant,
        asked_at: Instant,
        now: Instant,
    ) -> Vec<Action> {
        let held = match &self.state {
            LeaseState::Held(live) if live.token == *token => live,
            _ => return refuse(LeaseError::NoSuchLease),
        };
        // Hole put back (reintroduce-holes only): a renewal confirmed after the deadline extends.
        if held.is_live(now) || crate::holes::active("renewal-confirmed-late") {
            let renewed = LiveLease {
                granted_at: held.granted_at,
                ..LiveLease::from_grant(grant, asked_at)
            };
            let answer = renewed.answer(now);
            self.state = LeaseState::Held(renewed);
            return vec![Action::Answer(Answer::Renewed(answer))];
        }
        let mut actions = vec![
            Action::Record(Record::RenewedTooLate {
                owner: held.owner.clone(),
                fence: held.fence,
            }),
            Action::Forget(token.clone()),
        ];
        actions.extend(self.end_held(token, EndCause::RanOut, now));
        actions.push(Action::Answer(Answer::Refused(LeaseError::NoSuchLease)));
        actions
    }

    /// The store's answer to a release by the holder or an admin.
    fn released(
        &mut self,
        token: &LeaseToken,
        releasing: Releasing,
        answer: Result<bool, LeaseStoreError>,
        now: Instant,
    ) -> Vec<Action> {
        let released = match answer {
            Ok(released) => released,
            Err(error) => return refuse(error.into()),
        };
        let (cause, answer) = match releasing {
            Releasing::Holder if released => (EndCause::Released, Answer::Released),
            Releasing::Holder => (EndCause::RanOut, Answer::Refused(LeaseError::NoSuchLease)),
            Releasing::Admin { peer, broken } => {
                (EndCause::Broken { peer }, Answer::Broken(*broken))
            }
        };
        let mut actions = self.end_held(token, cause, now);
        actions.push(Action::Answer(answer));
        actions
    }

    /// Time passed: a held lease past its deadline runs out; a safe state owed is tried when due.
    fn deadline(&mut self, now: Instant) -> Vec<Action> {
        match &self.state {
            LeaseState::Held(live) if !live.is_live(now) => {
                // End it in the store too, should the store's clock be a hair behind ours.
                let token = live.token.clone();
                let mut actions = vec![Action::Forget(token.clone())];
                actions.extend(self.end_held(&token, EndCause::RanOut, now));
                actions
            }
            LeaseState::Ending(ending) if !ending.safe_state_owed => self.finish(now),
            LeaseState::Locked(delay) if delay.is_running(now) => Vec::new(),
            LeaseState::Locked(_) => {
                // The lock-delay is over: the first one waiting in line may take it.
                self.state = LeaseState::Free;
                vec![Action::HandOver]
            }
            LeaseState::Free => self.hand_over_due(now),
            _ => self.try_safe_state(now),
        }
    }

    /// Ends the held lease `token`, if it is still the state's.
    fn end_held(&mut self, token: &LeaseToken, cause: EndCause, now: Instant) -> Vec<Action> {
        match &self.state {
            LeaseState::Held(live) if live.token == *token => {
                let live = live.clone();
                self.end(live, cause, now)
            }
            _ => Vec::new(),
        }
    }

    /// A lease ends: from this instant admission refuses changes and forced reads of everyone
    /// and the link's guard refuses every change admitted under it not yet sent; then its
    /// changes still at the station settle, then the safe state when it ran out (or was
    /// safe-stopped) and one is configured, then it is free and goes to the next in line
    /// ([`Self::finish`]). However it ended, it frees at once when every change of it was
    /// answered: the lock-delay is only for a change left in doubt ([`Self::changes_settled`]).
    pub(super) fn end(&mut self, live: LiveLease, cause: EndCause, now: Instant) -> Vec<Action> {
        let owed = cause.owes_safe_state() && self.has_safe_state;
        let mut ending = live.ending(owed);
        ending.ended_at = Some(now);
        let mut actions = Vec::with_capacity(3);
        if let EndCause::SafeStopped { by, reason } = &cause {
            // Its holder learns at once why its changes are refused.
            actions.push(Action::Publish(LeaseView {
                ended: Some(format!("safe-stopped by {by}: {reason}")),
                ..ending.view()
            }));
        }
        self.state = LeaseState::Ending(ending);
        actions.push(Action::Record(Record::Ended {
            owner: live.owner,
            fence: live.fence,
            cause,
        }));
        actions.push(Action::Settle(SettleScope::Fence(live.fence)));
        actions
    }

    /// The changes the settle waited for have left the station (`lapsed_at`: when the last of
    /// them left doubt unanswered, if one did): a new lease goes to its grantee, unless the
    /// lock-delay after such a doubt still runs; an ended one gets its safe state, or is
    /// finished.
    fn changes_settled(&mut self, lapsed_at: Option<Instant>, now: Instant) -> Vec<Action> {
        // A station that breaks its contract may still carry out a change that left doubt:
        // until the lock-delay after that is over, nobody else's change may follow it.
        let delay_until = lapsed_at
            .map(|lapsed| lapsed + self.lock_delay)
            .filter(|until| *until > now);
        if let (LeaseState::Ending(ending), Some(_)) = (&mut self.state, lapsed_at) {
            if let Some(until) = delay_until {
                ending.lock_delay = Some(LockDelay {
                    until,
                    after: ending.owner.clone(),
                    why: LockDelayWhy::ChangesInDoubt,
                });
            }
            // One of them may still land: the safe state is written, not only read back.
            if ending.step == SafeStateStep::Check {
                ending.step = SafeStateStep::Write;
            }
        }
        // Hole put back (reintroduce-holes only): a doubt does not withhold the next grant.
        let delay_until = delay_until.filter(|_| !crate::holes::active("lease-less-doubt"));
        match (&self.state, self.granting.take()) {
            (LeaseState::Held(live), Some(grantee)) => match delay_until {
                Some(until) => {
                    let delay = LockDelay {
                        until,
                        after: LEASELESS_CHANGE.into(),
                        why: LockDelayWhy::LeaselessDoubt,
                    };
                    self.grant_withheld(grantee, delay, now)
                }
                None => {
                    let mut live = live.clone();
                    live.granted_at = Some(now);
                    let (owner, fence) = (live.owner.clone(), live.fence);
                    let (view, answer) = (live.view(now), live.answer(now));
                    self.state = LeaseState::Held(live);
                    vec![
                        Action::Record(Record::Taken { owner, fence }),
                        Action::Publish(view),
                        Action::Grant { grantee, answer },
                    ]
                }
            },
            (LeaseState::Ending(ending), _) if ending.safe_state_owed => {
                self.retry_now(now);
                self.try_safe_state(now)
            }
            (LeaseState::Ending(_), _) => {
                let mut actions = self.answer_stop(SafeStopState::NotConfigured);
                actions.extend(self.finish(now));
                actions
            }
            _ => Vec::new(),
        }
    }

    pub(super) fn retry_now(&mut self, now: Instant) {
        self.retry = SafeStateRetry {
            next_try: now,
            backoff: SAFE_STATE_FIRST_BACKOFF,
        };
    }

    /// The safe state's next step, when one is owed and it is due: its writes or a read back
    /// (tried again with back-off), or the second read back at its instant.
    fn try_safe_state(&mut self, now: Instant) -> Vec<Action> {
        let LeaseState::Ending(ending) = &mut self.state else {
            return Vec::new();
        };
        let retry_due = self.retry.next_try <= now;
        match ending.step {
            _ if !ending.safe_state_owed => Vec::new(),
            _ if ending.settle_first => adopt::settle_first(ending),
            SafeStateStep::Write if retry_due => vec![Action::SendSafeState {
                after: ending.owner.clone(),
            }],
            SafeStateStep::Check | SafeStateStep::ReadBack(_) if retry_due => {
                vec![Action::ReadBackSafeState]
            }
            SafeStateStep::SecondReadBackAt(at) if at <= now => {
                ending.step = SafeStateStep::ReadBack(ReadBackRound::Second);
                vec![Action::ReadBackSafeState]
            }
            _ => Vec::new(),
        }
    }

    fn safe_state_answered(
        &mut self,
        result: Result<(), SafeStateError>,
        now: Instant,
    ) -> Vec<Action> {
        let LeaseState::Ending(ending) = &mut self.state else {
            return Vec::new();
        };
        let (owner, fence) = (ending.owner.clone(), ending.fence);
        match result {
            Ok(()) => {
                // Confirmed; done once read back right, now and after the longest processing.
                ending.step = SafeStateStep::ReadBack(ReadBackRound::First);
                vec![
                    Action::Record(Record::SafeStateApplied { owner, fence }),
                    Action::ReadBackSafeState,
                ]
            }
            Err(failure) => self.safe_state_failed(failure.to_string(), now),
        }
    }

    /// A try of the safe state (its writes or a read back) failed for `why`: counted, shown,
    /// and the same step tried again after the back-off.
    fn safe_state_failed(&mut self, why: String, now: Instant) -> Vec<Action> {
        // Hole put back (reintroduce-holes only): the safe state tried once, then given up.
        if crate::holes::active("safe-state-tried-once")
            && matches!(self.state, LeaseState::Ending(_))
        {
            let mut actions = self.answer_stop(SafeStopState::NotConfirmed { tries: 1, why });
            actions.extend(self.finish(now));
            return actions;
        }
        let LeaseState::Ending(ending) = &mut self.state else {
            return Vec::new();
        };
        ending.tries += 1;
        ending.last_error = Some(why.clone());
        let (owner, fence, tries, view) = (
            ending.owner.clone(),
            ending.fence,
            ending.tries,
            ending.view(),
        );
        let retry_in = self.back_off(now);
        let mut actions = vec![
            Action::Record(Record::SafeStateFailed {
                owner,
                fence,
                tries,
                why: why.clone(),
                retry_in,
            }),
            Action::Publish(view),
        ];
        actions.extend(self.answer_stop(SafeStopState::NotConfirmed { tries, why }));
        actions
    }

    /// Schedules the next try of the safe state after the current back-off (which doubles, up
    /// to its longest); returns the wait.
    fn back_off(&mut self, now: Instant) -> Duration {
        let retry_in = self.retry.backoff;
        self.retry = SafeStateRetry {
            next_try: now + retry_in,
            backoff: (retry_in * 2).min(SAFE_STATE_MAX_BACKOFF),
        };
        retry_in
    }

    /// The end of a lease is finished: free (or locked, while the lock-delay of a change in
    /// doubt runs), the event, the end recorded in the store (with that lock-delay), then the
    /// next in line (after the lock-delay, once it is over).
    pub(super) fn finish(&mut self, now: Instant) -> Vec<Action> {
        let (fence, lock_delay) = match std::mem::replace(&mut self.state, LeaseState::Free) {
            LeaseState::Ending(ending) => (
                ending.fence,
                ending.lock_delay.filter(|delay| delay.is_running(now)),
            ),
            _ => (0, None),
        };
        let record = lock_delay
            .as_ref()
            .map(|delay| stored_lock_delay(delay, fence, now));
        if let Some(delay) = lock_delay {
            self.state = LeaseState::Locked(delay);
        }
        let mut actions = Vec::with_capacity(4);
        if self.has_safe_state {
            actions.push(Action::ForgetOwed);
        }
        actions.push(Action::Publish(self.free_view(now)));
        if !self.lock_delay.is_zero() {
            actions.push(Action::StoreEnd(record));
        }
        if self.state.is_free(now) {
            actions.push(Action::HandOver);
        }
        actions
    }

    /// Nobody holds it, as anyone may see it: with the lock-delay still to wait, and why, if
    /// any.
    pub(super) fn free_view(&self, now: Instant) -> LeaseView {
        let delay = self.state.lock_delay(now);
        LeaseView {
            lock_delay_ms: delay
                .map(|delay| super::super::millis(delay.until.saturating_duration_since(now))),
            lock_delay_reason: delay.map(LockDelay::reason),
            ..LeaseView::nobody()
        }
    }

    /// The refusal of a new lease while the station's ledger is not read yet, if so.
    fn station_unknown(&self) -> Option<LeaseError> {
        (!self.station_known).then_some(LeaseError::StationNotMet {
            retry_in: STATION_NOT_MET_RETRY,
        })
    }

    /// The refusal of a new lease while the lock-delay runs at `now`, if it does.
    fn lock_delay_at(&self, now: Instant) -> Option<LeaseError> {
        self.state.lock_delay(now).map(|delay| delay.refusal(now))
    }

    /// The live lease when `presented` is its id.
    fn live_lease(&self, presented: &str, now: Instant) -> Option<&LiveLease> {
        self.state
            .live(now)
            .filter(|live| live.token.matches(presented))
    }

    fn held_token(&self) -> Option<LeaseToken> {
        match &self.state {
            LeaseState::Held(live) => Some(live.token.clone()),
            _ => None,
        }
    }
}

/// The lock-delay `delay` as the store keeps it at `now` (after the lease with `fence`).
pub(super) fn stored_lock_delay(delay: &LockDelay, fence: u64, now: Instant) -> StoredLockDelay {
    StoredLockDelay {
        after: delay.after.clone(),
        fence,
        why: delay.why,
        left: delay.until.saturating_duration_since(now),
    }
}

fn refuse(refusal: LeaseError) -> Vec<Action> {
    vec![Action::Answer(Answer::Refused(refusal))]
}
