//! The safe state read back (`Event::SafeStateReadBack`): done only once read back right
//! twice, right after its writes and `READ_BACK_AFTER` later; a late change found over it is
//! recorded, shown and written again.

use station_protocol::Value;

use super::*;
use crate::lease::SafeStateStepView;
use crate::lease::control::events::{ReadBackRound, SafeStopState};
use crate::lease::control::read_back::Differs;

/// A machine whose lease "A" (fence 6) ran out and whose safe state the station just
/// confirmed; the instant it did.
fn confirmed() -> (LeaseMachine, Instant) {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now).with_read_back_after(READ_BACK_AFTER);
    held_by(&mut machine, "A", 6, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    machine.on(Event::ChangesSettled { lapsed_at: None }, lapsed);
    let actions = machine.on(Event::SafeStateAnswered(Ok(())), lapsed);
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(Record::SafeStateApplied { .. }),
                Action::ReadBackSafeState
            ]
        ),
        "{actions:?}"
    );
    (machine, lapsed)
}

fn on1_true() -> Vec<Differs> {
    vec![Differs {
        channel: "ON1".into(),
        wanted: Value::Bool(false),
        read: Value::Bool(true),
    }]
}

fn overridden() -> Event {
    Event::SafeStateReadBack(Ok(on1_true()))
}

fn view_of(actions: &[Action]) -> &LeaseView {
    actions
        .iter()
        .find_map(|action| match action {
            Action::Publish(view) => Some(view),
            _ => None,
        })
        .unwrap_or_else(|| panic!("nothing published in {actions:?}"))
}

#[test]
fn read_back_right_at_once_the_second_read_back_is_due_after_the_longest_processing() {
    let (mut machine, at) = confirmed();
    let actions = read_back_right(&mut machine, at);
    let safe = view_of(&actions).safe_state.clone().unwrap();
    assert_eq!(
        (safe.step, safe.overridden, safe.pending),
        (SafeStateStepView::SecondReadBack, 0, true)
    );
    assert_eq!(actions.len(), 1, "{actions:?}");
    // Still ending: nobody changes the station or takes the lease meanwhile.
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
    let second_at = at + READ_BACK_AFTER;
    assert_eq!(machine.next_wake(), Some(second_at));
    let early = second_at - Duration::from_millis(1);
    assert!(machine.on(Event::Deadline, early).is_empty());
    // A station that came back does not bring the second read back forward.
    machine.on(
        Event::Link {
            connected: true,
            generation: 1,
        },
        early,
    );
    assert!(
        machine
            .on(
                Event::Link {
                    connected: true,
                    generation: 2,
                },
                early,
            )
            .is_empty()
    );
    let actions = machine.on(Event::Deadline, second_at);
    assert!(
        matches!(&actions[..], [Action::ReadBackSafeState]),
        "{actions:?}"
    );
    let actions = read_back_right(&mut machine, second_at);
    assert!(
        matches!(&actions[..], [Action::Record(Record::SafeStateReadBack { owner, fence: 6 }), rest @ ..] if owner == "A" && is_finish(rest, true)),
        "{actions:?}"
    );
    assert!(is_free(&machine));
}

#[test]
fn a_late_change_found_by_the_second_read_back_is_recorded_shown_and_overwritten_at_once() {
    let (mut machine, at) = confirmed();
    read_back_right(&mut machine, at);
    let second_at = at + READ_BACK_AFTER;
    machine.on(Event::Deadline, second_at);
    let actions = machine.on(overridden(), second_at);
    match &actions[..] {
        [
            Action::Record(Record::SafeStateOverridden {
                owner,
                fence: 6,
                round: ReadBackRound::Second,
                differs,
                retry_in,
            }),
            Action::Publish(view),
            Action::SendSafeState { after },
        ] => {
            assert_eq!((owner.as_str(), after.as_str()), ("A", "A"));
            assert_eq!(*differs, on1_true());
            assert_eq!(*retry_in, Duration::ZERO);
            let safe = view.safe_state.as_ref().unwrap();
            assert_eq!(
                (safe.step, safe.overridden),
                (SafeStateStepView::Writing, 1)
            );
            assert_eq!(
                safe.last_error.as_deref(),
                Some("a late change overrode the safe state: ON1 read back True, wanted False")
            );
        }
        other => panic!("{other:?}"),
    }
    // Written again, then read back twice again before it is done.
    let actions = machine.on(Event::SafeStateAnswered(Ok(())), second_at);
    assert!(
        matches!(actions.last(), Some(Action::ReadBackSafeState)),
        "{actions:?}"
    );
    let actions = read_back_right(&mut machine, second_at);
    assert_eq!(view_of(&actions).safe_state.as_ref().unwrap().overridden, 1);
    assert_eq!(machine.next_wake(), Some(second_at + READ_BACK_AFTER));
    let actions = read_back_right_twice_from(&mut machine, second_at + READ_BACK_AFTER);
    assert!(is_finish(&actions[1..], true), "{actions:?}");
}

/// The second read back, due at `at`, read right: its actions.
fn read_back_right_twice_from(machine: &mut LeaseMachine, at: Instant) -> Vec<Action> {
    let actions = machine.on(Event::Deadline, at);
    assert!(
        matches!(&actions[..], [Action::ReadBackSafeState]),
        "{actions:?}"
    );
    read_back_right(machine, at)
}

#[test]
fn a_safe_state_found_otherwise_right_after_its_writes_is_written_again_after_the_back_off() {
    let (mut machine, at) = confirmed();
    let actions = machine.on(overridden(), at);
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(Record::SafeStateOverridden {
                    round: ReadBackRound::First,
                    retry_in,
                    ..
                }),
                Action::Publish(_),
            ] if *retry_in == SAFE_STATE_FIRST_BACKOFF
        ),
        "{actions:?}"
    );
    assert_eq!(machine.next_wake(), Some(at + SAFE_STATE_FIRST_BACKOFF));
    assert!(
        machine
            .on(Event::Deadline, at + SAFE_STATE_FIRST_BACKOFF / 2)
            .is_empty()
    );
    let actions = machine.on(Event::Deadline, at + SAFE_STATE_FIRST_BACKOFF);
    assert!(
        matches!(&actions[..], [Action::SendSafeState { .. }]),
        "{actions:?}"
    );
    // Again right after the writes: the back-off doubles.
    machine.on(
        Event::SafeStateAnswered(Ok(())),
        at + SAFE_STATE_FIRST_BACKOFF,
    );
    let actions = machine.on(overridden(), at + SAFE_STATE_FIRST_BACKOFF);
    assert!(
        matches!(&actions[0], Action::Record(Record::SafeStateOverridden { retry_in, .. }) if *retry_in == 2 * SAFE_STATE_FIRST_BACKOFF),
        "{actions:?}"
    );
    assert_eq!(view_of(&actions).safe_state.as_ref().unwrap().overridden, 2);
}

#[test]
fn a_safe_stop_whose_safe_state_is_found_otherwise_right_after_its_writes_is_answered_not_confirmed()
 {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    held_by(&mut machine, "A", 3, now);
    machine.on(
        Event::SafeStop {
            by: "bench 3".into(),
            reason: "smoke".into(),
        },
        now,
    );
    machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    let failure = SafeStateError::NoChannel("ON1".into());
    machine.on(Event::SafeStateAnswered(Err(failure)), now);
    // The retry is written and confirmed, then found otherwise right away.
    let retry_at = now + SAFE_STATE_FIRST_BACKOFF;
    machine.on(Event::Deadline, retry_at);
    machine.on(
        Event::SafeStop {
            by: "bench 3".into(),
            reason: "smoke, again".into(),
        },
        retry_at,
    );
    machine.on(Event::SafeStateAnswered(Ok(())), retry_at);
    let actions = machine.on(overridden(), retry_at);
    let answered = actions.iter().find_map(|action| match action {
        Action::Answer(Answer::SafeStopped(outcome)) => Some(outcome.safe_state.clone()),
        _ => None,
    });
    match answered {
        Some(SafeStopState::NotConfirmed { tries: 1, why }) => {
            assert!(
                why.starts_with("a late change overrode the safe state"),
                "{why}"
            )
        }
        other => panic!("{other:?} in {actions:?}"),
    }
}

#[test]
fn a_read_back_that_fails_is_a_failed_try_and_the_same_read_back_is_tried_again() {
    let (mut machine, at) = confirmed();
    read_back_right(&mut machine, at);
    let second_at = at + READ_BACK_AFTER;
    machine.on(Event::Deadline, second_at);
    let failure = SafeStateError::ReadBack(vec![("ON1".into(), "busy".into())]);
    let actions = machine.on(Event::SafeStateReadBack(Err(failure)), second_at);
    match &actions[..] {
        [
            Action::Record(Record::SafeStateFailed {
                tries: 1,
                why,
                retry_in,
                ..
            }),
            Action::Publish(view),
        ] => {
            assert!(
                why.contains("could not be read back from ON1: busy"),
                "{why}"
            );
            assert_eq!(*retry_in, SAFE_STATE_FIRST_BACKOFF);
            let safe = view.safe_state.as_ref().unwrap();
            assert_eq!((safe.step, safe.tries), (SafeStateStepView::ReadingBack, 1));
        }
        other => panic!("{other:?}"),
    }
    let retry_at = second_at + SAFE_STATE_FIRST_BACKOFF;
    assert_eq!(machine.next_wake(), Some(retry_at));
    // Not before its back-off.
    let early = machine.on(Event::Deadline, second_at + SAFE_STATE_FIRST_BACKOFF / 2);
    assert!(early.is_empty(), "{early:?}");
    let actions = machine.on(Event::Deadline, retry_at);
    assert!(
        matches!(&actions[..], [Action::ReadBackSafeState]),
        "{actions:?}"
    );
    // Still the second read back: right now, it is done.
    let actions = read_back_right(&mut machine, retry_at);
    assert!(
        matches!(
            &actions[0],
            Action::Record(Record::SafeStateReadBack { .. })
        ),
        "{actions:?}"
    );
    assert!(is_free(&machine));
}

#[test]
fn a_read_back_nobody_asked_for_changes_nothing() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now).with_read_back_after(READ_BACK_AFTER);
    assert!(machine.on(overridden(), now).is_empty());
    assert!(is_free(&machine));
    let (mut machine, at) = confirmed();
    read_back_right(&mut machine, at);
    // Waiting for the second read back: a stray answer neither finishes nor rewrites it.
    assert!(read_back_right(&mut machine, at).is_empty());
    assert!(machine.on(overridden(), at).is_empty());
    assert_eq!(machine.next_wake(), Some(at + READ_BACK_AFTER));
    // Being written: a read back answer is not the writes' answer.
    let (mut machine, at) = confirmed();
    machine.on(overridden(), at);
    assert!(read_back_right(&mut machine, at).is_empty());
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
}
