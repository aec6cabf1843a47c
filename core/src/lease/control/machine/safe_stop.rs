//! The safe stop as the lease machine decides it (`POST /v1/safe-stop`, anyone with control
//! and, under access rules, `safe_stop`): the held lease ends through [`LeaseMachine::end`],
//! and the safe state is applied whatever held it (a lease, a safe state still pending). With
//! nobody holding the lease it is read back first, and a station already in the safe state is
//! left as it is: the press is audited and changes nothing else, so repeated presses never
//! write again. A press never starts a lock-delay: once the safe state is read back
//! right and every change answered, nothing can land late and the lease is free at once;
//! a lock-delay already running goes on.

use tokio::time::Instant;

use super::super::events::{
    Action, Answer, EndCause, Record, SafeStateError, SafeStopOutcome, SafeStopState,
};
use super::super::read_back::Differs;
use super::super::state::{EndingLease, LeaseState, SafeStateStep};
use super::LeaseMachine;

/// The owner an [`EndingLease`] names while the safe state of a safe stop pressed with
/// nobody holding the lease is applied.
const NOBODY: &str = "nobody";

impl LeaseMachine {
    /// A safe stop: the held lease (live or past its deadline) ends and the safe state is
    /// applied; a safe state still pending is tried at once. With nobody holding the lease the
    /// changes admitted meanwhile settle first, then the safe state is read back, and written
    /// only when it is not in place. A lock-delay already running goes on unchanged: a press
    /// never starts one nor makes one longer. Answered once the safe state is confirmed or has failed a try,
    /// or at once when none is configured or it had already been read back right.
    pub(super) fn safe_stop(&mut self, by: String, reason: String, now: Instant) -> Vec<Action> {
        let ended = match &self.state {
            LeaseState::Held(live) => Some((live.owner.clone(), live.fence)),
            _ => None,
        };
        let mut actions = vec![Action::Record(Record::SafeStopped {
            by: by.clone(),
            reason: reason.clone(),
            ended: ended.clone(),
        })];
        self.stopping = Some(ended);
        match &mut self.state {
            LeaseState::Held(live) => {
                let live = live.clone();
                actions.push(Action::Forget(live.token.clone()));
                actions.extend(self.end(live, EndCause::SafeStopped { by, reason }, now));
            }
            _ if !self.has_safe_state => {
                actions.extend(self.answer_stop(SafeStopState::NotConfigured));
            }
            LeaseState::Ending(ending)
                if ending.safe_state_owed
                    && matches!(ending.step, SafeStateStep::SecondReadBackAt(_)) =>
            {
                // Written and read back right once; the second read back stands, and writes
                // it again should a late change have overridden it.
                actions.extend(self.answer_stop(SafeStopState::AlreadySafe));
            }
            LeaseState::Ending(ending) => {
                // Written again, whatever step it was at.
                ending.safe_state_owed = true;
                ending.step = SafeStateStep::Write;
                self.retry_now(now);
                actions.extend(self.try_safe_state(now));
            }
            LeaseState::Free | LeaseState::Locked(_) => {
                // Nobody's change may race the safe state, and those admitted while nobody
                // held it go first; then it is read back ([`SafeStateStep::Check`]). The
                // lock-delay still running, if any, is kept as it is.
                let mut ending = EndingLease::new(NOBODY.into(), 0, true);
                ending.step = SafeStateStep::Check;
                ending.ended_at = Some(now);
                if let LeaseState::Locked(delay) = &self.state {
                    ending.lock_delay = Some(delay.clone()).filter(|delay| delay.is_running(now));
                }
                self.state = LeaseState::Ending(ending);
                actions.push(Action::Settle(crate::link::SettleScope::Every));
            }
        }
        actions
    }

    /// The safe state read back before anything was written (a safe stop pressed while nobody
    /// held the lease): right, the press is done, free again with nothing written; otherwise,
    /// or unread, the safe state is written as after any safe stop.
    pub(super) fn safe_state_checked(
        &mut self,
        result: Result<Vec<Differs>, SafeStateError>,
        now: Instant,
    ) -> Vec<Action> {
        let LeaseState::Ending(ending) = &mut self.state else {
            return Vec::new();
        };
        if matches!(&result, Ok(differs) if differs.is_empty()) {
            let mut actions = self.answer_stop(SafeStopState::AlreadySafe);
            actions.extend(self.finish(now));
            return actions;
        }
        ending.step = SafeStateStep::Write;
        self.retry_now(now);
        self.try_safe_state(now)
    }

    /// The answer to a safe stop waiting for one, if any.
    pub(super) fn answer_stop(&mut self, safe_state: SafeStopState) -> Vec<Action> {
        match self.stopping.take() {
            Some(ended) => vec![Action::Answer(Answer::SafeStopped(SafeStopOutcome {
                ended,
                safe_state,
            }))],
            None => Vec::new(),
        }
    }
}
