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
            Action::Settle(SettleScope::Fence(7)),
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
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
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
        matches!(&actions[..], [Action::Record(r), Action::Settle(SettleScope::Every)] if *r == stopped_record(None)),
        "{actions:?}"
    );
    // Nobody's change races it meanwhile.
    let (_, owed, _) = ending_of(&machine);
    assert!(owed);
    // Read back first: a station not in the safe state gets it written.
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(
        matches!(&actions[..], [Action::ReadBackSafeState]),
        "{actions:?}"
    );
    let differs = crate::lease::control::read_back::Differs {
        channel: "ON1".into(),
        wanted: station_protocol::Value::Bool(false),
        read: station_protocol::Value::Bool(true),
    };
    let actions = machine.on(Event::SafeStateReadBack(Ok(vec![differs])), now);
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
    assert!(matches!(
        actions.last(),
        Some(Action::Settle(SettleScope::Fence(2)))
    ));
    assert_eq!(ending_of(&machine), ("B".into(), false, 0));
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
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
    machine.on(Event::ChangesSettled { lapsed_at: None }, now);
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
    machine.on(Event::ChangesSettled { lapsed_at: None }, lapsed);
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
fn a_safe_stop_with_nobody_holding_and_the_safe_state_in_place_writes_nothing_and_starts_no_lock_delay()
 {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now).with_lock_delay(Duration::from_secs(3));
    machine.on(safe_stop(), now);
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(
        matches!(&actions[..], [Action::ReadBackSafeState]),
        "{actions:?}"
    );
    let actions = read_back_right(&mut machine, now);
    assert_eq!(stop_answer(&actions).safe_state, SafeStopState::AlreadySafe);
    // Free, with no lock-delay recorded in the store either.
    assert!(
        matches!(
            &actions[1..],
            [Action::ForgetOwed, Action::Publish(view), Action::StoreEnd(None), Action::HandOver]
                if *view == LeaseView::nobody()
        ),
        "{actions:?}"
    );
    assert!(
        matches!(
            &machine.on(acquire("B", false, true), now)[..],
            [Action::Take { .. }]
        ),
        "no lock-delay"
    );
}

#[test]
fn a_safe_stop_with_nobody_holding_whose_settle_left_doubt_writes_the_safe_state() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    machine.on(safe_stop(), now);
    let actions = machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(now),
        },
        now,
    );
    assert!(
        matches!(&actions[..], [Action::SendSafeState { .. }]),
        "a change in doubt may still land: written, not only read back: {actions:?}"
    );
}

#[test]
fn a_safe_stop_while_the_second_read_back_is_awaited_is_answered_at_once_and_changes_nothing() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now)
        .with_read_back_after(READ_BACK_AFTER)
        .with_lock_delay(Duration::from_secs(10));
    held_by(&mut machine, "A", 4, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    machine.on(Event::ChangesSettled { lapsed_at: None }, lapsed);
    machine.on(Event::SafeStateAnswered(Ok(())), lapsed);
    read_back_right(&mut machine, lapsed);
    let second_at = lapsed + READ_BACK_AFTER;
    assert_eq!(machine.next_wake(), Some(second_at));
    let pressed = lapsed + Duration::from_secs(1);
    let actions = machine.on(safe_stop(), pressed);
    assert!(
        matches!(&actions[..], [Action::Record(r), Action::Answer(Answer::SafeStopped(outcome))]
            if *r == stopped_record(None) && outcome.safe_state == SafeStopState::AlreadySafe),
        "{actions:?}"
    );
    // The second read back stays where it was; then it is free at once (nothing in doubt).
    assert_eq!(machine.next_wake(), Some(second_at));
    read_back_right_twice_from(&mut machine, second_at);
    let actions = machine.on(acquire("B", false, true), second_at);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

/// The second read back, due at `at`, right.
fn read_back_right_twice_from(machine: &mut LeaseMachine, at: Instant) {
    let actions = machine.on(Event::Deadline, at);
    assert!(
        matches!(&actions[..], [Action::ReadBackSafeState]),
        "{actions:?}"
    );
    read_back_right(machine, at);
    assert!(is_free(machine));
}

/// A station for [`driven`]: whether its channels hold the safe state, and how
/// often the safe state was written to it.
#[derive(Default)]
struct FakeStation {
    safe: bool,
    writes: u32,
}

/// Feeds `event` at `at` and every answer it leads to, the station answering as `station`
/// says (changes settle at once, writes make it safe, read backs say whether it is), as the
/// shell's turn does; every action taken.
fn driven(
    machine: &mut LeaseMachine,
    station: &mut FakeStation,
    event: Event,
    at: Instant,
) -> Vec<Action> {
    let mut all = Vec::new();
    let mut next = Some(event);
    while let Some(event) = next.take() {
        let actions = machine.on(event, at);
        next = match actions.last() {
            Some(Action::Settle(_)) => Some(Event::ChangesSettled { lapsed_at: None }),
            Some(Action::SendSafeState { .. }) => {
                station.writes += 1;
                station.safe = true;
                Some(Event::SafeStateAnswered(Ok(())))
            }
            Some(Action::ReadBackSafeState) => {
                let differs = match station.safe {
                    true => Vec::new(),
                    false => vec![crate::lease::control::read_back::Differs {
                        channel: "0.4.ESH10000662.ON1".into(),
                        wanted: station_protocol::Value::Bool(false),
                        read: station_protocol::Value::Bool(true),
                    }],
                };
                Some(Event::SafeStateReadBack(Ok(differs)))
            }
            _ => None,
        };
        all.extend(actions);
    }
    all
}

#[test]
fn pressing_the_safe_stop_every_second_with_nobody_holding_neither_writes_again_nor_locks_the_lease()
 {
    const LOCK_DELAY: Duration = Duration::from_secs(15);
    let start = Instant::now();
    let mut machine = LeaseMachine::new(true, start)
        .with_lock_delay(LOCK_DELAY)
        .with_read_back_after(READ_BACK_AFTER);
    let mut station = FakeStation::default();
    // The first press finds the station unsafe: written and read back.
    let actions = driven(&mut machine, &mut station, safe_stop(), start);
    assert_eq!(stop_answer(&actions).safe_state, SafeStopState::Confirmed);
    assert_eq!(station.writes, 1);
    // Someone presses once a second; the lease task feeds every deadline that falls due.
    let mut freed_at = None;
    for second in 1..=18u64 {
        let at = start + Duration::from_secs(second);
        if let Some(due) = machine.next_wake().filter(|due| *due <= at) {
            let actions = driven(&mut machine, &mut station, Event::Deadline, due);
            if actions.iter().any(|a| matches!(a, Action::HandOver)) {
                freed_at.get_or_insert(due);
            }
        }
        let actions = driven(&mut machine, &mut station, safe_stop(), at);
        assert_eq!(
            stop_answer(&actions).safe_state,
            SafeStopState::AlreadySafe,
            "press at {second} s: {actions:?}"
        );
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Record(r) if *r == stopped_record(None))),
            "every press is audited: {actions:?}"
        );
        assert_eq!(machine.free_view(at).lock_delay_ms, None, "{second} s");
    }
    assert_eq!(
        station.writes, 1,
        "the safe state was in place: written once"
    );
    assert_eq!(
        freed_at,
        Some(start + READ_BACK_AFTER),
        "free once the first press's safe state is read back the second time"
    );
    let at = start + Duration::from_secs(18);
    let actions = machine.on(acquire("operator", false, true), at);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

#[test]
fn without_a_safe_state_a_press_with_nobody_holding_starts_no_lock_delay() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now).with_lock_delay(Duration::from_secs(3));
    machine.on(safe_stop(), now);
    machine.on(safe_stop(), now + Duration::from_secs(2));
    let actions = machine.on(acquire("B", false, true), now + Duration::from_secs(2));
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}
