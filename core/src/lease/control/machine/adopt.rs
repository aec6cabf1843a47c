//! What the lease machine is handed at start and when the link meets the station: the store's
//! live lease ([`LeaseMachine::resumed`]), and the station's ledger of duties
//! ([`LeaseMachine::adopted`]), merged with what this gateway already owes.

use tokio::time::Instant;

use super::super::super::store::LeaseGrant;
use super::super::events::{Action, EndCause};
use super::super::state::{
    EndingLease, LeaseState, LiveLease, LockDelay, LockDelayWhy, SafeStateStep, StoredEnd,
};
use super::{LeaseMachine, stored_lock_delay};
use crate::link::SettleScope;

impl LeaseMachine {
    /// At start (or a takeover): the store's live lease goes on, ending no later than its
    /// holder was told ([`LiveLease::resumed`]). What the station is owed otherwise comes with
    /// its ledger ([`Self::adopted`]).
    pub(super) fn resumed(&mut self, held: Option<LeaseGrant>, asked_at: Instant) -> Vec<Action> {
        if let Some(grant) = held {
            self.state = LeaseState::Held(LiveLease::resumed(grant, asked_at));
        }
        Vec::new()
    }

    /// The link met the station and its ledger was read: a safe state owed is applied once the
    /// changes in doubt inherited with the ledger have settled (a lease of another control
    /// lease ended at the takeover owes one, and its last change may still land), and the
    /// lock-delay it keeps is honoured for what it has left by the store's clock (counted from
    /// `now`, after the store answered: never shorter here). A lease whose end nobody recorded
    /// may have left a change in doubt: the next holder waits the whole lock-delay from `now`,
    /// recorded so that a second restart honours it too. What this gateway already owes (a
    /// lease ending, a lock-delay) is kept, the longer delay of the two in force; a lease
    /// still held here when the ledger owes the station more (another gateway served it
    /// meanwhile under another name) ends as run out, the ledger's duties taken into its end.
    /// From now on leases may be granted.
    pub(super) fn adopted(
        &mut self,
        owed_after: Option<String>,
        end: StoredEnd,
        now: Instant,
    ) -> Vec<Action> {
        self.station_known = true;
        let fence = end.lock_delay.as_ref().map_or(0, |stored| stored.fence);
        let stored = end.lock_delay.map(|stored| LockDelay {
            until: now + stored.left,
            after: stored.after,
            why: stored.why,
        });
        let lost_track = end
            .end_pending
            .clone()
            .filter(|_| !self.lock_delay.is_zero())
            .map(|owner| LockDelay {
                until: now + self.lock_delay,
                after: owner,
                why: LockDelayWhy::LostTrack,
            });
        let lock_delay = longer(stored, lost_track).filter(|delay| delay.until > now);
        // Hole put back (reintroduce-holes only): the lock-delay lost on a restart or takeover.
        let lock_delay = lock_delay.filter(|_| !crate::holes::active("lock-delay-lost"));
        let owed_after = owed_after.filter(|_| self.has_safe_state);
        let mut actions = Vec::new();
        // Ended here, its end settles what may still land (the doubts just inherited too).
        let ended_here = matches!(&self.state, LeaseState::Held(_))
            && (owed_after.is_some() || lock_delay.is_some());
        if let LeaseState::Held(live) = &self.state
            && ended_here
        {
            let live = live.clone();
            actions.push(Action::Forget(live.token.clone()));
            actions.extend(self.end(live, EndCause::RanOut, now));
        }
        match &mut self.state {
            LeaseState::Held(_) => {}
            LeaseState::Ending(ending) => {
                if owed_after.is_some() && !ending.safe_state_owed {
                    ending.safe_state_owed = true;
                    ending.step = SafeStateStep::Write;
                }
                // An end already under way waited for its changes before the doubts just
                // inherited joined them: its safe state waits for those too.
                ending.settle_first |=
                    !ended_here && ending.safe_state_owed && settles_inherited_doubts();
                ending.lock_delay = longer(ending.lock_delay.take(), lock_delay);
            }
            LeaseState::Free | LeaseState::Locked(_) => {
                let running = match &self.state {
                    LeaseState::Locked(delay) => Some(delay.clone()),
                    _ => None,
                };
                let lock_delay = longer(running, lock_delay).filter(|delay| delay.until > now);
                if let Some(owner) = owed_after {
                    // Recorded when this end is finished, after the safe state. Its changes may
                    // still be at the station (the doubts inherited with the ledger, of
                    // whichever fence: the ledger does not say which were its): they settle
                    // before the safe state, which they would otherwise override.
                    let mut ending = EndingLease::new(owner, 0, true);
                    ending.ended_at = Some(now);
                    ending.lock_delay = lock_delay;
                    ending.settle_first = settles_inherited_doubts();
                    self.state = LeaseState::Ending(ending);
                    self.retry_now(now);
                    return actions;
                }
                let record = lock_delay
                    .as_ref()
                    .map(|delay| stored_lock_delay(delay, fence, now));
                if let Some(delay) = lock_delay {
                    self.state = LeaseState::Locked(delay);
                }
                if end.end_pending.is_some() || record.is_some() {
                    actions.push(Action::StoreEnd(record));
                }
                actions.push(Action::Publish(self.free_view(now)));
                if self.state.is_free(now) {
                    actions.push(Action::HandOver);
                }
            }
        }
        actions
    }
}

/// The next step of an end taken over with the station's ledger, before its safe state: every
/// change in doubt settles (a change that may still land would override the safe state), as a
/// lease's own end waits for its changes ([`LeaseMachine::end`]).
pub(super) fn settle_first(ending: &mut EndingLease) -> Vec<Action> {
    ending.settle_first = false;
    vec![Action::Settle(SettleScope::Every)]
}

/// Whether the safe state of an end taken over with the ledger waits for the doubts inherited
/// with it.
fn settles_inherited_doubts() -> bool {
    // Hole put back (reintroduce-holes only): it is written without waiting for them.
    !crate::holes::active("adoption-without-settle")
}

/// The lock-delay of the two that ends later.
fn longer(a: Option<LockDelay>, b: Option<LockDelay>) -> Option<LockDelay> {
    match (a, b) {
        (Some(a), Some(b)) if a.until >= b.until => Some(a),
        (_, Some(b)) => Some(b),
        (a, None) => a,
    }
}
