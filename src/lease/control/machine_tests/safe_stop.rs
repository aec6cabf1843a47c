//! The safe stop (`Event::SafeStop`): the held lease ends through `LeaseMachine::end`, and the
//! safe state is applied whoever held it, a lease, nobody, or a safe state still pending.

use super::*;
use crate::lease::control::events::{SafeStopOutcome, SafeStopState};

fn safe_stop() -> Event {
    Event::SafeStop {
        by: "bench 3".into(),
        reason: "smoke in rack 2".into(),
    }
}

fn stop_answer(actions: &[Action]) -> &SafeStopOutcome {
    actions
        .iter()
        .find_map(|action| match action {
            Action::Answer(Answer::SafeStopped(outcome)) => Some(outcome),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no safe-stop answer in {actions:?}"))
}

fn stopped_record(ended: Option<(&str, u64)>) -> Record {
    Record::SafeStopped {
        by: "bench 3".into(),
        reason: "smoke in rack 2".into(),
        ended: ended.map(|(owner, fence)| (owner.to_owned(), fence)),
    }
}

#[test]
fn a_safe_stop_ends_the_held_lease_tells_its_holder_and_answers_once_the_safe_state_is_confirmed() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let token = held_by(&mut machine, "A", 7, now);
    let actions = machine.on(safe_stop(), now);
    match &actions[..] {
        [
            Action::Record(stopped),
            Action::Forget(forgotten),
            Action::Publish(view),
            Action::Record(Record::Ended {
                owner,
                fence: 7,
                cause,
            }),
            Action::Settle(Some(7)),
        ] => {
            assert_eq!(*stopped, stopped_record(Some(("A", 7))));
            assert_eq!(*forgotten, token);
            assert_eq!(
                view.ended.as_deref(),
                Some("safe-stopped by bench 3: smoke in rack 2")
            );
            assert!(!view.held);
            assert_eq!(owner, "A");
            assert!(matches!(cause, EndCause::SafeStopped { by, .. } if by == "bench 3"));
        }
        other => panic!("{other:?}"),
    }
    // Refused from this instant, the safe state owed although the holder did nothing wrong.
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
    let actions = machine.on(Event::ChangesSettled { had_doubts: false }, now);
    assert!(
        matches!(&actions[..], [Action::SendSafeState { after }] if after == "A"),
        "{actions:?}"
    );
    machine.on(Event::SafeStateAnswered(Ok(())), now);
    // Answered once read back right; free after the second read back.
    let actions = read_back_right(&mut machine, now);
    assert_eq!(
        *stop_answer(&actions),
        SafeStopOutcome {
            ended: Some(("A".into(), 7)),
            safe_state: SafeStopState::Confirmed,
        }
    );
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
    let second_at = machine.next_wake().unwrap();
    machine.on(Event::Deadline, second_at);
    read_back_right(&mut machine, second_at);
    assert!(is_free(&machine));
}

#[test]
fn a_safe_stop_with_nobody_holding_applies_the_safe_state_after_the_changes_admitted_meanwhile() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let actions = machine.on(safe_stop(), now);
    assert!(
        matches!(&actions[..], [Action::Record(r), Action::Settle(None)] if *r == stopped_record(None)),
        "{actions:?}"
    );
    // Nobody's change races it meanwhile.
    let (_, owed, _) = ending_of(&machine);
    assert!(owed);
    let actions = machine.on(Event::ChangesSettled { had_doubts: false }, now);
    assert!(
        matches!(&actions[..], [Action::SendSafeState { .. }]),
        "{actions:?}"
    );
    machine.on(Event::SafeStateAnswered(Ok(())), now);
    let actions = read_back_right(&mut machine, now);
    assert_eq!(stop_answer(&actions).ended, None);
    assert_eq!(stop_answer(&actions).safe_state, SafeStopState::Confirmed);
    let second_at = machine.next_wake().unwrap();
    machine.on(Event::Deadline, second_at);
    read_back_right(&mut machine, second_at);
    assert!(is_free(&machine));
}

#[test]
fn without_a_safe_state_a_safe_stop_still_ends_the_lease_and_says_none_is_configured() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let actions = machine.on(safe_stop(), now);
    assert_eq!(
        *stop_answer(&actions),
        SafeStopOutcome {
            ended: None,
            safe_state: SafeStopState::NotConfigured,
        }
    );
    assert!(is_free(&machine));

    held_by(&mut machine, "B", 2, now);
    let actions = machine.on(safe_stop(), now);
    assert!(matches!(actions.last(), Some(Action::Settle(Some(2)))));
    assert_eq!(ending_of(&machine), ("B".into(), false, 0));
    let actions = machine.on(Event::ChangesSettled { had_doubts: false }, now);
    assert_eq!(
        *stop_answer(&actions),
        SafeStopOutcome {
            ended: Some(("B".into(), 2)),
            safe_state: SafeStopState::NotConfigured,
        }
    );
    assert!(is_finish(&actions[1..], false), "{actions:?}");
}

#[test]
fn a_safe_state_that_fails_is_answered_not_confirmed_and_stays_owed() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    held_by(&mut machine, "A", 3, now);
    machine.on(safe_stop(), now);
    machine.on(Event::ChangesSettled { had_doubts: false }, now);
    let failure = SafeStateError::NoChannel("ON1".into());
    let actions = machine.on(Event::SafeStateAnswered(Err(failure)), now);
    match &stop_answer(&actions).safe_state {
        SafeStopState::NotConfirmed { tries: 1, why } => assert!(why.contains("ON1"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ending_of(&machine), ("A".into(), true, 1));
    // Retried by the lease task as any safe state owed.
    assert_eq!(machine.next_wake(), Some(now + SAFE_STATE_FIRST_BACKOFF));
}

#[test]
fn a_safe_stop_while_a_safe_state_is_pending_tries_it_at_once() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    held_by(&mut machine, "A", 4, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    machine.on(Event::ChangesSettled { had_doubts: false }, lapsed);
    let failure = SafeStateError::NoChannel("ON1".into());
    machine.on(Event::SafeStateAnswered(Err(failure.clone())), lapsed);
    machine.on(Event::SafeStateAnswered(Err(failure)), lapsed);
    // The back-off is not over, yet the safe stop tries now.
    let actions = machine.on(safe_stop(), lapsed);
    assert!(
        matches!(&actions[..], [Action::Record(r), Action::SendSafeState { after }] if *r == stopped_record(None) && after == "A"),
        "{actions:?}"
    );
    machine.on(Event::SafeStateAnswered(Ok(())), lapsed);
    let actions = read_back_right(&mut machine, lapsed);
    assert_eq!(stop_answer(&actions).safe_state, SafeStopState::Confirmed);
}

#[test]
fn a_safe_stop_while_the_second_read_back_is_awaited_writes_the_safe_state_again() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now).with_read_back_after(READ_BACK_AFTER);
    held_by(&mut machine, "A", 4, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    machine.on(Event::ChangesSettled { had_doubts: false }, lapsed);
    machine.on(Event::SafeStateAnswered(Ok(())), lapsed);
    read_back_right(&mut machine, lapsed);
    assert_eq!(machine.next_wake(), Some(lapsed + READ_BACK_AFTER));
    let actions = machine.on(safe_stop(), lapsed);
    assert!(
        matches!(&actions[..], [Action::Record(_), Action::SendSafeState { after }] if after == "A"),
        "{actions:?}"
    );
    machine.on(Event::SafeStateAnswered(Ok(())), lapsed);
    let actions = read_back_right(&mut machine, lapsed);
    assert_eq!(stop_answer(&actions).safe_state, SafeStopState::Confirmed);
}
