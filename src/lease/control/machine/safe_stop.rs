//! The safe stop as the lease machine decides it (`POST /v1/safe-stop`, anyone with control):
//! the held lease ends through [`LeaseMachine::end`], and the safe state is applied whatever
//! held it (a lease, a safe state still pending, nobody).

use tokio::time::Instant;

use super::super::events::{Action, Answer, EndCause, Record, SafeStopOutcome, SafeStopState};
use super::super::state::{EndingLease, LeaseState, LockDelay, LockDelayWhy, SafeStateStep};
use super::LeaseMachine;

/// The owner an [`EndingLease`] names while the safe state of a safe stop pressed with
/// nobody holding the lease is applied.
const NOBODY: &str = "nobody";

impl LeaseMachine {
    /// A safe stop: the held lease (live or past its deadline) ends, and the safe state is
    /// applied in any case (after a lease, after a safe state still pending, or with nobody
    /// holding it: after the changes admitted meanwhile). Answered once the safe state is
    /// confirmed or has failed a try, or at once when none is configured.
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
                if let LeaseState::Free = self.state {
                    self.locked = Some(LockDelay {
                        until: now + self.lock_delay,
                        after: NOBODY.into(),
                        why: LockDelayWhy::SafeStopped,
                    });
                }
                actions.extend(self.answer_stop(SafeStopState::NotConfigured));
            }
            LeaseState::Ending(ending) => {
                // Written again, whatever step it was at.
                ending.safe_state_owed = true;
                ending.step = SafeStateStep::Write;
                ending.lock_delay = Some(LockDelay {
                    until: now + self.lock_delay,
                    after: ending.owner.clone(),
                    why: LockDelayWhy::SafeStopped,
                });
                self.retry_now(now);
                actions.extend(self.try_safe_state(now));
            }
            LeaseState::Free => {
                // Nobody's change may race the safe state, and those admitted while nobody
                // held it go first.
                let mut ending = EndingLease::new(NOBODY.into(), 0, true);
                ending.lock_delay = Some(LockDelay {
                    until: now + self.lock_delay,
                    after: NOBODY.into(),
                    why: LockDelayWhy::SafeStopped,
                });
                self.state = LeaseState::Ending(ending);
                actions.push(Action::Settle(None));
            }
        }
        actions
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
