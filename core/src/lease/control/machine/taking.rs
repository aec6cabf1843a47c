//! Taking a new lease: what the store's answer to an acquisition leaves
//! ([`LeaseMachine::taken`]), including an answer that never came (the store may have taken the
//! lease all the same) and a waiter the store did not serve, whom the line is handed to again
//! ([`LeaseMachine::hand_over_due`]).

use std::time::Duration;

use tokio::time::Instant;

use super::super::super::store::{Acquisition, LeaseToken};
use super::super::super::{LeaseError, LeaseStoreError};
use super::super::events::{Action, Answer, EndCause, Grantee};
use super::super::state::{LeaseState, LiveLease, LockDelay};
use super::{LeaseMachine, refuse, stored_lock_delay};
use crate::link::SettleScope;

/// The shortest wait before the line is handed over again after the first in line was not
/// served (the store held the lease, or did not answer).
pub(in super::super) const LINE_RETRY: Duration = Duration::from_millis(250);

impl LeaseMachine {
    /// The store's answer to a new lease for `grantee`.
    pub(super) fn taken(
        &mut self,
        grantee: Grantee,
        asked_at: Instant,
        answer: Result<Acquisition, LeaseStoreError>,
        now: Instant,
    ) -> Vec<Action> {
        // The id the store gives the lease should it take it, drawn before it was asked.
        let asked_for = self.taking.take();
        let (grant, taken) = match (answer, grantee) {
            (Ok(Acquisition::Taken(grant)), _) => (grant, true),
            (Ok(Acquisition::Renewed(grant)), _) => (grant, false),
            (Ok(Acquisition::HeldByOther(holder)), Grantee::Requester { wait }) => {
                return match wait {
                    true => vec![Action::Answer(Answer::Queued)],
                    false => refuse(LeaseError::HeldByOther {
                        owner: holder.owner,
                        expires_in: holder.expires_in,
                    }),
                };
            }
            (Ok(Acquisition::HeldByOther(holder)), Grantee::Waiter(ticket)) => {
                return self.back_in_line(ticket, holder.expires_in, now);
            }
            (Err(error), grantee) => return self.take_unanswered(grantee, asked_for, error, now),
        };
        // Whatever the store says, a new lease is installed only over none.
        if !self.state.is_free(now) {
            return self.taken_over_another(grantee, grant.token, now);
        }
        let mut live = LiveLease::from_grant(grant, asked_at);
        // Given at once when the store renewed it (nothing was taken anew).
        live.granted_at = (!taken).then_some(now);
        let answer = live.answer(now);
        self.state = LeaseState::Held(live);
        if !taken {
            return vec![Action::Grant { grantee, answer }];
        }
        // Changes admitted while nobody held it are refused at the link from now on; the
        // holder gets its id (and so can make its first change) once every change that may
        // still be at the station has left it, whoever made it.
        self.granting = Some(grantee);
        vec![Action::Settle(SettleScope::Every)]
    }

    /// The lease just taken for `grantee` waited for the changes still at the station, and
    /// one of them left doubt unanswered: until the lock-delay after it is over, nobody may
    /// have the lease. It goes back to the store unused (nobody has its id), the delay is
    /// recorded, and `grantee` is answered as while any lock-delay runs.
    pub(super) fn grant_withheld(
        &mut self,
        grantee: Grantee,
        delay: LockDelay,
        now: Instant,
    ) -> Vec<Action> {
        let LeaseState::Held(live) = &self.state else {
            return Vec::new();
        };
        let mut actions = vec![Action::Forget(live.token.clone())];
        let record = stored_lock_delay(&delay, 0, now);
        self.state = LeaseState::Locked(delay);
        if self.has_safe_state {
            actions.push(Action::ForgetOwed);
        }
        actions.push(Action::Publish(self.free_view(now)));
        if !self.lock_delay.is_zero() {
            actions.push(Action::StoreEnd(Some(record)));
        }
        actions.push(match grantee {
            Grantee::Requester { wait: true } => Action::Answer(Answer::Queued),
            Grantee::Requester { wait: false } => {
                Action::Answer(Answer::Refused(self.held_by_other(now)))
            }
            Grantee::Waiter(ticket) => Action::BackInLine(ticket),
        });
        actions
    }

    /// The store took a new lease (`new`) while this gateway's lease had not ended here: asked
    /// while it was live, the store answered after its deadline (the store's copy had lapsed
    /// too), or the store lost it. The new lease goes back to the store, and the lease here
    /// ends the way every lease ends, run out (its changes settle, then its safe state), which
    /// the store's word says it has: installed over it, a change of it still at the station
    /// could land under the new holder. `grantee` is answered as while any lease is ending.
    fn taken_over_another(
        &mut self,
        grantee: Grantee,
        new: LeaseToken,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = vec![Action::Forget(new)];
        if let Some(held) = self.held_token() {
            actions.push(Action::Forget(held.clone()));
            actions.extend(self.end_held(&held, EndCause::RanOut, now));
        }
        actions.push(match grantee {
            Grantee::Requester { wait: true } => Action::Answer(Answer::Queued),
            Grantee::Requester { wait: false } => {
                Action::Answer(Answer::Refused(self.held_by_other(now)))
            }
            Grantee::Waiter(ticket) => Action::BackInLine(ticket),
        });
        actions
    }

    /// The store did not answer an acquisition for `grantee` (`error`): it may have taken the
    /// lease all the same, under the id `asked_for`, for nobody (its grantee never gets that
    /// id, so no change is ever made under it, and no safe state is owed after it). It goes
    /// back to the store at once; should that answer be lost too, it lapses there at its TTL,
    /// nobody renewing it. A requester is refused with the store's error; a waiter goes back to
    /// the front of the line, which is handed over again shortly: left there, the lease free
    /// here, nobody would ever hand it over, and everyone after it would be refused.
    fn take_unanswered(
        &mut self,
        grantee: Grantee,
        asked_for: Option<LeaseToken>,
        error: LeaseStoreError,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions: Vec<Action> = asked_for.map(Action::Forget).into_iter().collect();
        match grantee {
            Grantee::Requester { .. } => {
                actions.push(Action::Answer(Answer::Refused(error.into())));
            }
            Grantee::Waiter(ticket) => {
                actions.extend(self.back_in_line(ticket, Duration::ZERO, now));
            }
        }
        actions
    }

    /// The first in line, `ticket`, was not served (the store held the lease for `held_for`
    /// more, or did not answer): back at the front of the line, which the expiry task hands
    /// over again then, never sooner than [`LINE_RETRY`].
    fn back_in_line(&mut self, ticket: u64, held_for: Duration, now: Instant) -> Vec<Action> {
        self.hand_over_at = Some(now + held_for.max(LINE_RETRY));
        vec![Action::BackInLine(ticket)]
    }

    /// The line, handed over again once its time has come and the lease is free.
    pub(super) fn hand_over_due(&mut self, now: Instant) -> Vec<Action> {
        match self.hand_over_at {
            Some(at) if at <= now && self.state.is_free(now) => {
                self.hand_over_at = None;
                vec![Action::HandOver]
            }
            _ => Vec::new(),
        }
    }
}
