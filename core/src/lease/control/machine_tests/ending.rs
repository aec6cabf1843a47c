//! Unit tests of how the lease machine ends a lease: release, break, deadline, the safe state
//! and its retries, the line, an unclaimed lease, resuming.

use super::*;

#[test]
fn a_release_ends_the_lease_without_the_safe_state_then_frees_it_for_the_next_in_line() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let token = held_by(&mut machine, "A", 3, now);
    let actions = machine.on(
        Event::Release {
            presented: token.as_str().into(),
        },
        now,
    );
    assert!(
        matches!(&actions[..], [Action::Release { token: asked, releasing: Releasing::Holder }] if *asked == token)
    );
    // Not yet answered: still held.
    assert_eq!(fence_held(&machine), Some(3));
    let actions = machine.on(
        Event::Released {
            token: token.clone(),
            releasing: Releasing::Holder,
            answer: Ok(true),
        },
        now,
    );
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(Record::Ended {
                    fence: 3,
                    cause: EndCause::Released,
                    ..
                }),
                Action::Settle(SettleScope::Fence(3)),
                Action::Answer(Answer::Released),
            ]
        ),
        "{actions:?}"
    );
    assert_eq!(ending_of(&machine), ("A".into(), false, 0));
    assert_eq!(machine.next_wake(), None);
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(is_finish(&actions, true), "{actions:?}");
    assert!(is_free(&machine));
}

#[test]
fn a_release_the_store_did_not_know_ran_out_and_one_it_could_not_answer_changes_nothing() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let token = held_by(&mut machine, "A", 3, now);
    let actions = machine.on(
        Event::Released {
            token: token.clone(),
            releasing: Releasing::Holder,
            answer: Err(unavailable()),
        },
        now,
    );
    assert!(matches!(refusal(&actions), LeaseError::Store(_)));
    assert_eq!(fence_held(&machine), Some(3));
    let actions = machine.on(
        Event::Released {
            token,
            releasing: Releasing::Holder,
            answer: Ok(false),
        },
        now,
    );
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(Record::Ended {
                    cause: EndCause::RanOut,
                    ..
                }),
                Action::Settle(SettleScope::Fence(3)),
                Action::Answer(Answer::Refused(LeaseError::NoSuchLease)),
            ]
        ),
        "{actions:?}"
    );
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
}

/// An admin's break waits for the transition under way, which may be a lease being taken
/// and granted to the first in line: that lease was nobody's when the break was asked, and the
/// break leaves it alone (as carried out at once it would have found nobody to break). Its
/// holder was told it holds it; the break is answered that nobody held it.
#[test]
fn a_break_asked_before_a_lease_was_granted_leaves_that_lease_alone() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let asked_at = now;
    let granted_at = now + Duration::from_millis(300);
    held_by(&mut machine, "B", 3, granted_at);
    let actions = machine.on(
        Event::Break {
            peer: peer(),
            asked_at,
        },
        granted_at,
    );
    assert!(
        matches!(refusal(&actions), LeaseError::NobodyHolds),
        "{actions:?}"
    );
    assert_eq!(fence_held(&machine), Some(3));
    // Asked once it was granted, it breaks it.
    let actions = machine.on(
        Event::Break {
            peer: peer(),
            asked_at: granted_at,
        },
        granted_at,
    );
    assert!(
        matches!(&actions[..], [Action::Release { .. }]),
        "{actions:?}"
    );
}

#[test]
fn the_admin_break_ends_whoever_holds_it_and_says_what_it_broke() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    assert!(matches!(
        refusal(&machine.on(
            Event::Break {
                peer: peer(),
                asked_at: now
            },
            now
        )),
        LeaseError::NobodyHolds
    ));
    let token = held_by(&mut machine, "A", 5, now);
    let actions = machine.on(
        Event::Break {
            peer: peer(),
            asked_at: now + Duration::from_secs(2),
        },
        now + Duration::from_secs(2),
    );
    let releasing = match &actions[..] {
        [
            Action::Release {
                token: asked,
                releasing,
            },
        ] if *asked == token => releasing.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        matches!(&releasing, Releasing::Admin { broken, .. } if broken.owner.as_deref() == Some("A") && broken.expires_in_ms == 8_000)
    );
    let failed = machine.on(
        Event::Released {
            token: token.clone(),
            releasing: releasing.clone(),
            answer: Err(unavailable()),
        },
        now,
    );
    assert!(matches!(refusal(&failed), LeaseError::Store(_)));
    assert_eq!(fence_held(&machine), Some(5));
    // Ended whatever the store says of it.
    let actions = machine.on(
        Event::Released {
            token,
            releasing,
            answer: Ok(false),
        },
        now,
    );
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(Record::Ended { fence: 5, cause: EndCause::Broken { .. }, .. }),
                Action::Settle(SettleScope::Fence(5)),
                Action::Answer(Answer::Broken(view)),
            ] if view.owner.as_deref() == Some("A")
        ),
        "{actions:?}"
    );
    assert_eq!(ending_of(&machine), ("A".into(), false, 0));
}

#[test]
fn a_lease_past_its_deadline_runs_out_its_changes_settle_then_the_safe_state_then_it_is_free() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let token = held_by(&mut machine, "A", 6, now);
    assert!(
        machine
            .on(Event::Deadline, now + TTL - Duration::from_millis(1))
            .is_empty()
    );
    let past = now + TTL;
    let actions = machine.on(Event::Deadline, past);
    assert!(
        matches!(
            &actions[..],
            [
                Action::Forget(ended),
                Action::Record(Record::Ended { fence: 6, cause: EndCause::RanOut, .. }),
                Action::Settle(SettleScope::Fence(6)),
            ] if *ended == token
        ),
        "{actions:?}"
    );
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
    let settled = past + Duration::from_secs(3);
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, settled);
    assert!(
        matches!(&actions[..], [Action::SendSafeState { after }] if after == "A"),
        "{actions:?}"
    );
    let actions = machine.on(Event::SafeStateAnswered(Ok(())), settled);
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(Record::SafeStateApplied { fence: 6, .. }),
                Action::ReadBackSafeState
            ]
        ),
        "{actions:?}"
    );
    // Not free until read back right twice.
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
    let actions = read_back_right_twice(&mut machine, settled);
    assert!(
        matches!(&actions[..], [Action::Record(Record::SafeStateReadBack { fence: 6, .. }), rest @ ..] if is_finish(rest, true)),
        "{actions:?}"
    );
    assert!(is_free(&machine));
}

#[test]
fn a_safe_state_not_confirmed_is_retried_with_a_doubling_back_off_and_shown_meanwhile() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    held_by(&mut machine, "A", 6, now);
    let mut at = now + TTL;
    machine.on(Event::Deadline, at);
    machine.on(Event::ChangesSettled { lapsed_at: None }, at);
    let mut waits = Vec::new();
    for tries in 1..=8 {
        let failure = SafeStateError::NoChannel("ON1".into());
        let actions = machine.on(Event::SafeStateAnswered(Err(failure)), at);
        let retry_in = match &actions[..] {
            [
                Action::Record(Record::SafeStateFailed {
                    tries: t,
                    why,
                    retry_in,
                    ..
                }),
                Action::Publish(view),
            ] => {
                assert_eq!(*t, tries);
                assert!(why.contains("ON1"), "{why}");
                let pending = view.safe_state.as_ref().unwrap();
                assert!(pending.pending && pending.tries == tries && pending.after == "A");
                assert_eq!(pending.last_error.as_deref(), Some(why.as_str()));
                *retry_in
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(ending_of(&machine), ("A".into(), true, tries));
        waits.push(retry_in);
        assert_eq!(machine.next_wake(), Some(at + retry_in));
        // Not yet due: nothing; due: the next try.
        assert!(
            machine
                .on(Event::Deadline, at + retry_in - Duration::from_millis(1))
                .is_empty()
        );
        at += retry_in;
        let actions = machine.on(Event::Deadline, at);
        assert!(
            matches!(&actions[..], [Action::SendSafeState { .. }]),
            "{actions:?}"
        );
    }
    assert_eq!(waits[0], SAFE_STATE_FIRST_BACKOFF);
    assert_eq!(waits[1], SAFE_STATE_FIRST_BACKOFF * 2);
    assert_eq!(waits[7], SAFE_STATE_MAX_BACKOFF);
    // While it is pending, nobody takes the lease.
    assert!(matches!(
        refusal(&machine.on(acquire("B", false, true), at)),
        LeaseError::SafeStatePending { tries: 8, .. }
    ));
}

#[test]
fn a_station_that_comes_back_gets_the_safe_state_at_once() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let link = |connected, generation| Event::Link {
        connected,
        generation,
    };
    // The first generation seen is where the expiry task starts from.
    assert!(machine.on(link(true, 1), now).is_empty());
    held_by(&mut machine, "A", 6, now);
    let at = now + TTL;
    machine.on(Event::Deadline, at);
    machine.on(Event::ChangesSettled { lapsed_at: None }, at);
    for _ in 0..3 {
        machine.on(
            Event::SafeStateAnswered(Err(SafeStateError::Refused(vec![(
                "ON1".into(),
                "no".into(),
            )]))),
            at,
        );
    }
    assert_eq!(machine.next_wake(), Some(at + SAFE_STATE_FIRST_BACKOFF * 4));
    assert!(machine.on(link(false, 1), at).is_empty());
    assert!(
        machine.on(link(true, 1), at).is_empty(),
        "the same connection"
    );
    assert!(machine.on(link(false, 2), at).is_empty(), "down");
    let actions = machine.on(link(true, 2), at);
    assert!(
        matches!(&actions[..], [Action::SendSafeState { .. }]),
        "{actions:?}"
    );
    assert_eq!(machine.next_wake(), Some(at));
    // The back-off starts again from the first wait.
    let actions = machine.on(
        Event::SafeStateAnswered(Err(SafeStateError::NoChannel("ON1".into()))),
        at,
    );
    assert!(matches!(
        &actions[..],
        [Action::Record(Record::SafeStateFailed { retry_in, .. }), _] if *retry_in == SAFE_STATE_FIRST_BACKOFF
    ));
    // A new connection while nothing is owed asks for nothing.
    let mut free = LeaseMachine::new(true, now);
    free.on(link(true, 1), now);
    assert!(free.on(link(true, 2), now).is_empty());
}

#[test]
fn a_station_that_comes_back_while_a_released_lease_settles_gets_no_safe_state() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let link = |connected, generation| Event::Link {
        connected,
        generation,
    };
    machine.on(link(true, 1), now);
    let token = held_by(&mut machine, "A", 4, now);
    released(&mut machine, token, now);
    assert_eq!(ending_of(&machine), ("A".into(), false, 0));
    // A released lease owes no safe state: a new connection before its changes settled
    // must not send one.
    machine.on(link(false, 1), now);
    let actions = machine.on(link(true, 2), now);
    assert!(actions.is_empty(), "{actions:?}");
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(is_finish(&actions, true), "{actions:?}");
}

#[test]
fn the_free_lease_goes_to_the_first_in_line_once_the_free_changes_settle() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let next = Event::NextInLine {
        ticket: 9,
        owner: "B".into(),
        ttl: TTL,
    };
    let actions = machine.on(next, now);
    assert!(
        matches!(&actions[..], [Action::Take { grantee: Some(Grantee::Waiter(9)), request, .. }] if request.owner == "B"),
        "{actions:?}"
    );
    machine.on(
        Event::Taken {
            grantee: Some(Grantee::Waiter(9)),
            asked_at: now,
            answer: Ok(Acquisition::Taken(grant("B", 8))),
        },
        now,
    );
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(
        matches!(&actions[..], [Action::Record(Record::Taken { .. }), Action::Publish(_), Action::Grant { grantee: Grantee::Waiter(9), answer }] if answer.owner == "B"),
        "{actions:?}"
    );
    // A waiter the store does not serve goes back to the front of the line.
    for answer in [
        Ok(Acquisition::HeldByOther(holder("C"))),
        Err(unavailable()),
    ] {
        let actions = machine.on(
            Event::Taken {
                grantee: Some(Grantee::Waiter(10)),
                asked_at: now,
                answer,
            },
            now,
        );
        assert!(
            matches!(&actions[..], [Action::BackInLine(10)]),
            "{actions:?}"
        );
    }
}

#[test]
fn a_lease_nobody_claimed_is_ended_at_once_and_goes_to_the_next_in_line() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let token = held_by(&mut machine, "B", 8, now);
    assert!(machine.on(Event::Unclaimed { fence: 7 }, now).is_empty());
    assert_eq!(fence_held(&machine), Some(8));
    let actions = machine.on(Event::Unclaimed { fence: 8 }, now);
    assert!(
        matches!(
            &actions[..],
            [
                Action::Forget(forgotten),
                Action::Record(Record::Ended { fence: 8, cause: EndCause::Unclaimed, .. }),
                Action::Settle(SettleScope::Fence(8)),
            ] if *forgotten == token
        ),
        "{actions:?}"
    );
    // Nobody used it: no safe state is owed for it.
    assert_eq!(ending_of(&machine), ("B".into(), false, 0));
    assert!(is_finish(
        &machine.on(Event::ChangesSettled { lapsed_at: None }, now),
        true
    ));
}

#[test]
fn a_lease_being_ended_that_the_expiry_task_finds_unfinished_is_finished() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let token = held_by(&mut machine, "A", 1, now);
    released(&mut machine, token, now);
    assert!(is_finish(&machine.on(Event::Deadline, now), false));
    assert!(is_free(&machine));
    assert!(machine.on(Event::Deadline, now).is_empty());
    assert!(machine.on(Event::SafeStateAnswered(Ok(())), now).is_empty());
    assert!(
        machine
            .on(Event::ChangesSettled { lapsed_at: None }, now)
            .is_empty()
    );
}

#[test]
fn resuming_takes_the_stores_lease_and_the_ledger_the_safe_state_owed() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let resumed = Event::Resumed {
        held: Some(grant("A", 11)),
        asked_at: now,
    };
    assert!(machine.on(resumed, now).is_empty());
    assert_eq!(fence_held(&machine), Some(11));
    // It ends no later than its holder was told: the store's copy may end up to the store
    // call's bound later.
    let bound = crate::lease::control::state::STORE_CALL_BOUND;
    assert_eq!(machine.next_wake(), Some(now + TTL - bound));

    let later = now + Duration::from_secs(60);
    let mut owed = LeaseMachine::new(true, now).with_station_unknown();
    let adopted = Event::Adopted {
        owed_after: Some("Z".into()),
        end: StoredEnd::default(),
    };
    assert!(owed.on(adopted, later).is_empty());
    assert_eq!(ending_of(&owed), ("Z".into(), true, 0));
    assert_eq!(owed.next_wake(), Some(later), "tried at once");
    // Z's changes the ledger says may still land settle first: the safe state comes after.
    assert!(matches!(
        &owed.on(Event::Deadline, later)[..],
        [Action::Settle(SettleScope::Every)]
    ));
    let settled = owed.on(Event::ChangesSettled { lapsed_at: None }, later);
    assert!(
        matches!(&settled[..], [Action::SendSafeState { after }] if after == "Z"),
        "{settled:?}"
    );

    let mut no_safe_state = LeaseMachine::new(false, now);
    let adopted = Event::Adopted {
        owed_after: Some("Z".into()),
        end: StoredEnd::default(),
    };
    assert!(matches!(
        &no_safe_state.on(adopted, now)[..],
        [Action::Publish(_), Action::HandOver]
    ));
    assert!(is_free(&no_safe_state));
    assert_eq!(no_safe_state.next_wake(), None);
}

#[test]
fn who_holds_it_as_a_refusal_says() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    held_by(&mut machine, "A", 1, now);
    let second = now + Duration::from_secs(4);
    assert!(matches!(
        machine.held_by_other(second),
        LeaseError::HeldByOther { owner, expires_in } if owner == "A" && expires_in == Duration::from_secs(6)
    ));
    // Past its deadline, not yet ended: between leases.
    assert!(matches!(
        machine.held_by_other(now + TTL),
        LeaseError::Ending { owner, .. } if owner == "A"
    ));
}
