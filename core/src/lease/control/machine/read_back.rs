//! The safe state read back, as the lease machine decides it: once the station confirmed the
//! safe state's writes, its channels are read back at once and again `station.max_processing_ms`
//! later; a channel found otherwise (a late change overrode the safe state) is written again.
//! The safe state is done only once the second read back finds it right.

use tokio::time::Instant;

use super::super::events::{Action, ReadBackRound, Record, SafeStateError, SafeStopState};
use super::super::read_back::Differs;
use super::super::state::{LeaseState, SafeStateStep};
use super::LeaseMachine;

impl LeaseMachine {
    /// The safe state's channels, read back (`Ok`: those that differ from it).
    ///
    /// - Right: after the first read back, the second is due after the longest processing (a
    ///   safe stop waiting is answered now); after the second, the safe state is done.
    /// - Otherwise: a late change overrode it; recorded, shown, and written again: at once when
    ///   the second read back found it (a change that landed late), after the back-off when the
    ///   first did (the station did not keep what it had just confirmed, so it may do so again).
    /// - Not read: a failed try, the same read back tried again after the back-off.
    pub(super) fn safe_state_read_back(
        &mut self,
        result: Result<Vec<Differs>, SafeStateError>,
        now: Instant,
    ) -> Vec<Action> {
        let LeaseState::Ending(ending) = &mut self.state else {
            return Vec::new();
        };
        if ending.step == SafeStateStep::Check {
            return self.safe_state_checked(result, now);
        }
        let SafeStateStep::ReadBack(round) = ending.step else {
            return Vec::new();
        };
        let differs = match result {
            Err(failure) => return self.safe_state_failed(failure.to_string(), now),
            Ok(differs) => differs,
        };
        let (owner, fence) = (ending.owner.clone(), ending.fence);
        if differs.is_empty() {
            return match round {
                ReadBackRound::First => {
                    ending.step = SafeStateStep::SecondReadBackAt(now + self.read_back_after);
                    let mut actions = vec![Action::Publish(ending.view())];
                    actions.extend(self.answer_stop(SafeStopState::Confirmed));
                    actions
                }
                ReadBackRound::Second => {
                    let mut actions =
                        vec![Action::Record(Record::SafeStateReadBack { owner, fence })];
                    actions.extend(self.finish(now));
                    actions
                }
            };
        }
        let listed: Vec<String> = differs.iter().map(Differs::to_string).collect();
        let why = format!(
            "a late change overrode the safe state: {}",
            listed.join("; ")
        );
        ending.step = SafeStateStep::Write;
        ending.overridden += 1;
        ending.last_error = Some(why.clone());
        let (view, tries) = (ending.view(), ending.tries);
        let retry_in = match round {
            ReadBackRound::Second => {
                self.retry_now(now);
                std::time::Duration::ZERO
            }
            ReadBackRound::First => self.back_off(now),
        };
        let mut actions = vec![
            Action::Record(Record::SafeStateOverridden {
                owner,
                fence,
                round,
                differs,
                retry_in,
            }),
            Action::Publish(view),
        ];
        if round == ReadBackRound::First {
            actions.extend(self.answer_stop(SafeStopState::NotConfirmed { tries, why }));
        }
        actions.extend(self.try_safe_state(now));
        actions
    }
}
