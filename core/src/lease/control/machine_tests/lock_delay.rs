//! The lock-delay: after a lease one of whose changes left doubt unanswered, a new lease (and
//! a change without one) waits `LOCK_DELAY`, counted from the settle; a lease that ended with
//! every change answered — released, run out, broken or safe-stopped — frees at once.

use super::*;
use crate::lease::control::state::{LockDelayWhy, StoredLockDelay, guard_check};
use crate::link::{GuardRefusal, Guarded};

const LOCK_DELAY: Duration = Duration::from_secs(3);

fn machine(has_safe_state: bool, now: Instant) -> LeaseMachine {
    LeaseMachine::new(has_safe_state, now).with_lock_delay(LOCK_DELAY)
}

/// Whose lease the lock-delay follows (its refusal says `A's lease`), why, and the wait.
fn lock_delay_of(actions: &[Action]) -> (String, &'static str, Duration) {
    match refusal(actions) {
        LeaseError::LockDelay { after, why, wait } => {
            let owner = after.strip_suffix("'s lease").unwrap_or(after);
            (owner.to_owned(), *why, *wait)
        }
        other => panic!("not a lock-delay: {other:?}"),
    }
}

/// `A`'s lease (fence 5, taken at `now`) runs out at `now + TTL` and its changes settle at
/// once, one of them in doubt; the instant it ran out.
fn ran_out_in_doubt(machine: &mut LeaseMachine, now: Instant) -> Instant {
    held_by(machine, "A", 5, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    let actions = machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(lapsed),
        },
        lapsed,
    );
    assert!(
        matches!(
            &actions[..],
            [Action::Publish(view), Action::StoreEnd(Some(stored))]
                if !view.held && view.lock_delay_ms == Some(3000)
                    && view.lock_delay_reason.as_deref().is_some_and(|why| why.contains("A's lease ended with changes in doubt"))
                    && *stored == StoredLockDelay {
                        after: "A".into(),
                        fence: 5,
                        why: LockDelayWhy::ChangesInDoubt,
                        left: LOCK_DELAY,
                    }
        ),
        "free with the lock-delay recorded in the store, nobody handed the lease: {actions:?}"
    );
    lapsed
}

/// The end of a lease finished with nothing in doubt: free, recorded clean, the next in line.
fn is_clean_finish(actions: &[Action]) -> bool {
    matches!(
        actions,
        [.., Action::Publish(view), Action::StoreEnd(None), Action::HandOver]
            if *view == LeaseView::nobody()
    )
}

/// The gateway owns the only link, so it knows every change of the lease was
/// answered: nothing can land late, and the next acquire is taken at once.
#[test]
fn a_lease_that_ran_out_with_every_change_answered_frees_at_once() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    held_by(&mut machine, "A", 5, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, lapsed);
    assert!(is_clean_finish(&actions), "{actions:?}");
    assert!(matches!(machine.state(), LeaseState::Free));
    assert_eq!(machine.free_view(lapsed), LeaseView::nobody());
    assert_eq!(machine.next_wake(), None);
    let actions = machine.on(acquire("B", false, true), lapsed);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

#[test]
fn after_a_lease_that_ran_out_in_doubt_an_acquire_is_refused_for_the_lock_delay_with_how_long() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let lapsed = ran_out_in_doubt(&mut machine, now);
    assert!(is_free(&machine));
    let asked = lapsed + Duration::from_millis(1200);
    let actions = machine.on(acquire("B", false, true), asked);
    assert_eq!(
        lock_delay_of(&actions),
        (
            "A".into(),
            "ended with changes in doubt",
            Duration::from_millis(1800)
        )
    );
    let message = refusal(&actions).to_string();
    assert!(
        message.contains("A's lease ended with changes in doubt") && message.contains("1800 ms"),
        "{message}"
    );
    assert!(matches!(
        machine.held_by_other(asked),
        LeaseError::LockDelay { .. }
    ));
    assert_eq!(machine.free_view(asked).lock_delay_ms, Some(1800));
    assert_eq!(machine.free_view(lapsed + LOCK_DELAY), LeaseView::nobody());
    // Over at its instant: an acquire then is taken.
    let over = lapsed + LOCK_DELAY;
    let actions = machine.on(acquire("B", false, true), over);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

/// At the instant the lock-delay is over the lease is free, even before the expiry task's
/// turn has marked it so: an acquire then is taken and installed, not seen as a lease taken
/// over another's (cargo mutants: `is_free` without its `Locked` arm went unnoticed).
#[test]
fn an_acquire_at_the_instant_the_lock_delay_is_over_is_installed_before_any_deadline_turn() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let lapsed = ran_out_in_doubt(&mut machine, now);
    let over = lapsed + LOCK_DELAY;
    assert!(matches!(machine.state(), LeaseState::Locked(_)));
    let actions = machine.on(acquire("B", false, true), over);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
    let actions = machine.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: over,
            answer: Ok(Acquisition::Taken(grant("B", 6))),
        },
        over,
    );
    assert!(
        matches!(machine.state(), LeaseState::Held(live) if live.owner == "B" && live.fence == 6),
        "B holds it: {actions:?}"
    );
}

/// The lock-delay exists because a change of the ended lease may still
/// land, so a change without a lease waits it too: refused at admission (423, with the wait)
/// and at the link's send guard, until the instant it is over.
#[test]
fn during_the_lock_delay_a_change_without_a_lease_is_refused_at_admission_and_at_the_link() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let lapsed = ran_out_in_doubt(&mut machine, now);
    let asked = lapsed + Duration::from_millis(1000);
    match machine.state().between_leases(asked) {
        Some(LeaseError::ChangeInLockDelay { after, why, wait }) => {
            assert_eq!(
                (after.as_str(), why, wait),
                (
                    "A's lease",
                    "ended with changes in doubt",
                    Duration::from_millis(2000)
                )
            );
        }
        other => panic!("admitted in the lock-delay: {other:?}"),
    }
    assert!(matches!(
        guard_check(machine.state(), None, Guarded::Change, asked),
        Err(GuardRefusal::LockDelay { ref after, .. }) if after == "A's lease"
    ));
    assert!(matches!(
        guard_check(machine.state(), Some(5), Guarded::Change, asked),
        Err(GuardRefusal::LeaseEnded { admitted: 5, .. })
    ));
    let over = lapsed + LOCK_DELAY;
    assert!(machine.state().between_leases(over).is_none());
    assert!(guard_check(machine.state(), None, Guarded::Change, over).is_ok());
    assert!(
        guard_check(
            machine.state(),
            None,
            Guarded::Change,
            over - Duration::from_millis(1)
        )
        .is_err()
    );
}

#[test]
fn one_who_asked_to_wait_is_queued_and_handed_the_lease_when_the_lock_delay_is_over() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let lapsed = ran_out_in_doubt(&mut machine, now);
    let actions = machine.on(acquire("B", true, true), lapsed);
    assert!(
        matches!(&actions[..], [Action::Answer(Answer::Queued)]),
        "{actions:?}"
    );
    let over = lapsed + LOCK_DELAY;
    assert_eq!(machine.next_wake(), Some(over));
    assert!(
        machine
            .on(Event::Deadline, over - Duration::from_millis(1))
            .is_empty()
    );
    // One handed over early (another path) goes back to the front of the line.
    let early = machine.on(
        Event::NextInLine {
            ticket: 4,
            owner: "B".into(),
            ttl: TTL,
        },
        over - Duration::from_millis(1),
    );
    assert!(matches!(&early[..], [Action::BackInLine(4)]), "{early:?}");
    let actions = machine.on(Event::Deadline, over);
    assert!(matches!(&actions[..], [Action::HandOver]), "{actions:?}");
    assert!(matches!(machine.state(), LeaseState::Free));
    assert_eq!(machine.next_wake(), None);
    assert!(machine.on(Event::Deadline, over).is_empty());
    let actions = machine.on(
        Event::NextInLine {
            ticket: 4,
            owner: "B".into(),
            ttl: TTL,
        },
        over,
    );
    assert!(
        matches!(
            &actions[..],
            [Action::Take {
                grantee: Some(Grantee::Waiter(4)),
                ..
            }]
        ),
        "{actions:?}"
    );
}

#[test]
fn a_clean_release_has_no_lock_delay() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let token = held_by(&mut machine, "A", 5, now);
    released(&mut machine, token, now);
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(
        is_clean_finish(&actions),
        "free, its end recorded clean in the store, the next in line: {actions:?}"
    );
    let actions = machine.on(acquire("B", false, true), now);
    assert!(
        matches!(
            &actions[..],
            [Action::Take {
                mark_end_pending: true,
                ..
            }]
        ),
        "{actions:?}"
    );
    assert_eq!(machine.next_wake(), None);
}

#[test]
fn a_release_whose_change_left_doubt_unanswered_waits_the_lock_delay_from_the_settle() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let token = held_by(&mut machine, "A", 5, now);
    released(&mut machine, token, now);
    let settled = now + Duration::from_secs(8);
    let actions = machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(settled),
        },
        settled,
    );
    assert!(
        matches!(
            &actions[..],
            [Action::Publish(_), Action::StoreEnd(Some(stored))]
                if stored.why == LockDelayWhy::ChangesInDoubt && stored.left == LOCK_DELAY
        ),
        "{actions:?}"
    );
    let actions = machine.on(acquire("B", false, true), settled);
    assert_eq!(
        lock_delay_of(&actions),
        ("A".into(), "ended with changes in doubt", LOCK_DELAY)
    );
}

#[test]
fn a_broken_lease_with_every_change_answered_frees_at_once() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let token = held_by(&mut machine, "A", 5, now);
    let broken = machine.on(
        Event::Break {
            peer: peer(),
            asked_at: now,
        },
        now,
    );
    let Some(Action::Release { releasing, .. }) = broken.into_iter().next() else {
        panic!("no release");
    };
    machine.on(
        Event::Released {
            token,
            releasing,
            answer: Ok(true),
        },
        now,
    );
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(is_clean_finish(&actions), "{actions:?}");
    let actions = machine.on(acquire("B", false, true), now);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

#[test]
fn a_safe_stop_never_starts_a_lock_delay_with_a_lease_or_without_and_with_a_safe_state_or_without()
{
    let now = Instant::now();
    let stop = || Event::SafeStop {
        by: "bench 3".into(),
        reason: "smoke".into(),
    };
    let taken = |machine: &mut LeaseMachine| {
        let actions = machine.on(acquire("B", false, true), now);
        assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
    };
    // No safe state, nobody holding it.
    let mut machine = machine(false, now);
    machine.on(stop(), now);
    assert!(matches!(machine.state(), LeaseState::Free));
    taken(&mut machine);
    // No safe state, a lease held.
    let mut machine = self::machine(false, now);
    held_by(&mut machine, "A", 5, now);
    machine.on(stop(), now);
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    assert!(is_clean_finish(&actions), "{actions:?}");
    taken(&mut machine);
    // A safe state, a lease held.
    let mut machine = machine_with_safe_state(now);
    held_by(&mut machine, "A", 5, now);
    machine.on(stop(), now);
    finish_safe_state(&mut machine, now);
    taken(&mut machine);
    // A safe state, nobody holding it, and the station not in it: read back, then written.
    let mut machine = machine_with_safe_state(now);
    machine.on(stop(), now);
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
    machine.on(Event::SafeStateReadBack(Ok(vec![differs])), now);
    machine.on(Event::SafeStateAnswered(Ok(())), now);
    let actions = read_back_right_twice(&mut machine, now);
    assert!(is_clean_finish(&actions), "{actions:?}");
    taken(&mut machine);
}

fn machine_with_safe_state(now: Instant) -> LeaseMachine {
    machine(true, now)
}

/// Settles (nothing in doubt), writes and reads back the safe state owed, all at `at`: free
/// at once, recorded clean.
fn finish_safe_state(machine: &mut LeaseMachine, at: Instant) {
    machine.on(Event::ChangesSettled { lapsed_at: None }, at);
    machine.on(Event::SafeStateAnswered(Ok(())), at);
    let actions = read_back_right_twice(machine, at);
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(_),
                Action::ForgetOwed,
                Action::Publish(_),
                Action::StoreEnd(None),
                Action::HandOver
            ]
        ),
        "free, recorded clean, the next in line: {actions:?}"
    );
}

/// A safe stop pressed while a lease whose change is in doubt is ending keeps its lock-delay,
/// counted from the settle, neither longer nor gone.
#[test]
fn a_safe_stop_while_a_lease_is_ending_keeps_its_lock_delay_as_it_is() {
    let now = Instant::now();
    let mut machine = machine_with_safe_state(now);
    held_by(&mut machine, "A", 5, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    let actions = machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(lapsed),
        },
        lapsed,
    );
    assert!(
        matches!(&actions[..], [Action::SendSafeState { .. }]),
        "{actions:?}"
    );
    let stopped = lapsed + Duration::from_secs(1);
    machine.on(
        Event::SafeStop {
            by: "bench 3".into(),
            reason: "smoke".into(),
        },
        stopped,
    );
    machine.on(Event::SafeStateAnswered(Ok(())), stopped);
    read_back_right(&mut machine, stopped);
    let second_at = machine.next_wake().expect("the second read back");
    machine.on(Event::Deadline, second_at);
    let done = stopped + Duration::from_millis(100);
    let actions = read_back_right(&mut machine, done);
    assert!(
        matches!(actions.last(), Some(Action::StoreEnd(Some(stored))) if stored.left == LOCK_DELAY - Duration::from_millis(1100)),
        "{actions:?}"
    );
    let actions = machine.on(acquire("B", false, true), done);
    assert_eq!(
        lock_delay_of(&actions),
        (
            "A".into(),
            "ended with changes in doubt",
            LOCK_DELAY - Duration::from_millis(1100)
        )
    );
}

#[test]
fn the_lock_delay_counts_from_the_settle_so_a_long_safe_state_leaves_none_to_wait() {
    let now = Instant::now();
    let mut machine = machine_with_safe_state(now);
    held_by(&mut machine, "A", 5, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(lapsed),
        },
        lapsed,
    );
    let done = lapsed + LOCK_DELAY;
    machine.on(Event::SafeStateAnswered(Ok(())), done);
    let actions = read_back_right_twice(&mut machine, done);
    assert!(
        matches!(actions.last(), Some(Action::HandOver)),
        "{actions:?}"
    );
    let actions = machine.on(acquire("B", false, true), done);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

#[test]
fn a_lock_delay_of_zero_is_none() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    held_by(&mut machine, "A", 5, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    let actions = machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(lapsed),
        },
        lapsed,
    );
    assert!(is_finish(&actions, false), "{actions:?}");
    let actions = machine.on(acquire("B", false, true), lapsed);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

/// A change made without a lease that left doubt unanswered delays the next grant exactly as
/// a holder's change would: the lease just taken goes back to the store unused, the requester
/// is refused the lock-delay (or waits in line), and the delay runs from when the doubt lapsed.
#[test]
fn a_new_lease_whose_settle_finds_a_lease_less_change_left_in_doubt_waits_the_lock_delay() {
    let now = Instant::now();
    let new_machine = machine;
    let mut machine = new_machine(false, now);
    machine.on(acquire("A", false, true), now);
    machine.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: now,
            answer: Ok(Acquisition::Taken(grant("A", 5))),
        },
        now,
    );
    let lapsed = now + Duration::from_millis(400);
    let settled = now + Duration::from_millis(500);
    let actions = machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(lapsed),
        },
        settled,
    );
    let left = LOCK_DELAY - Duration::from_millis(100);
    match &actions[..] {
        [
            Action::Forget(_),
            Action::Publish(view),
            Action::StoreEnd(Some(stored)),
            Action::Answer(Answer::Refused(LeaseError::LockDelay { after, why, wait })),
        ] => {
            assert!(!view.held && view.lock_delay_ms == Some(2900), "{view:?}");
            assert_eq!(stored.why, LockDelayWhy::LeaselessDoubt);
            assert_eq!(stored.left, left);
            assert_eq!(
                (after.as_str(), *why, *wait),
                ("a change made without a lease", "was left in doubt", left)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fence_held(&machine), None, "nobody has the lease taken");
    assert!(matches!(
        machine.state().between_leases(settled),
        Some(LeaseError::ChangeInLockDelay { .. })
    ));
    // Waiting in line, it is queued; a waiter goes back to the front of the line.
    let mut waiting = new_machine(false, now);
    waiting.on(acquire("A", true, true), now);
    waiting.on(
        Event::Taken {
            grantee: Some(Grantee::Requester { wait: true }),
            asked_at: now,
            answer: Ok(Acquisition::Taken(grant("A", 5))),
        },
        now,
    );
    let actions = waiting.on(
        Event::ChangesSettled {
            lapsed_at: Some(now),
        },
        now,
    );
    assert!(
        matches!(actions.last(), Some(Action::Answer(Answer::Queued))),
        "{actions:?}"
    );
    // A lapse longer ago than the lock-delay delays nothing.
    let mut late = new_machine(false, now);
    late.on(acquire("A", false, true), now);
    late.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: now,
            answer: Ok(Acquisition::Taken(grant("A", 5))),
        },
        now,
    );
    let actions = late.on(
        Event::ChangesSettled {
            lapsed_at: Some(now),
        },
        now + LOCK_DELAY,
    );
    assert!(
        matches!(actions.last(), Some(Action::Grant { .. })),
        "{actions:?}"
    );
}

#[test]
fn an_acquire_while_an_end_is_finished_says_when_it_ended_and_the_lock_delay_left() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now)
        .with_lock_delay(Duration::from_secs(10))
        .with_read_back_after(READ_BACK_AFTER);
    held_by(&mut machine, "A", 5, now);
    let lapsed = now + TTL;
    machine.on(Event::Deadline, lapsed);
    machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(lapsed),
        },
        lapsed,
    );
    machine.on(Event::SafeStateAnswered(Ok(())), lapsed);
    read_back_right(&mut machine, lapsed);
    // Waiting for the second read back, 3 s after it ran out.
    let asked = lapsed + Duration::from_secs(3);
    let actions = machine.on(acquire("B", false, true), asked);
    let message = refusal(&actions).to_string();
    assert!(
        message.contains("A's lease ended 3 s ago")
            && !message.contains("just")
            && message.contains("another 7 s (7000 ms)"),
        "{message}"
    );
    let actions = machine.on(acquire("B", false, true), lapsed);
    let message = refusal(&actions).to_string();
    assert!(message.contains("A's lease has just ended"), "{message}");
}

/// The station's ledger read at `at`, keeping `end`: what the machine asks.
fn resumed_with(machine: &mut LeaseMachine, end: StoredEnd, at: Instant) -> Vec<Action> {
    machine.on(
        Event::Adopted {
            owed_after: None,
            end,
        },
        at,
    )
}

fn stored(after: &str, why: LockDelayWhy, left: Duration) -> StoredLockDelay {
    StoredLockDelay {
        after: after.into(),
        fence: 5,
        why,
        left,
    }
}

#[test]
fn a_lock_delay_the_store_keeps_goes_on_after_a_restart_for_what_it_has_left() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let left = Duration::from_millis(1200);
    let end = StoredEnd {
        lock_delay: Some(stored("A", LockDelayWhy::ChangesInDoubt, left)),
        end_pending: None,
    };
    // Recorded in this gateway's ledger, the new lease's view published, nobody handed it.
    let actions = resumed_with(&mut machine, end, now);
    assert!(
        matches!(&actions[..], [Action::StoreEnd(Some(record)), Action::Publish(view)] if record.left == left && view.lock_delay_ms == Some(1200)),
        "{actions:?}"
    );
    assert!(is_free(&machine));
    let actions = machine.on(acquire("B", false, true), now);
    assert_eq!(
        lock_delay_of(&actions),
        ("A".into(), "ended with changes in doubt", left)
    );
    assert_eq!(machine.free_view(now).lock_delay_ms, Some(1200));
    assert_eq!(machine.next_wake(), Some(now + left));
    let actions = machine.on(Event::Deadline, now + left);
    assert!(matches!(&actions[..], [Action::HandOver]), "{actions:?}");
    let actions = machine.on(acquire("B", false, true), now + left);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

#[test]
fn a_lease_found_ended_with_no_end_recorded_waits_the_whole_lock_delay_and_records_it() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let end = StoredEnd {
        lock_delay: None,
        end_pending: Some("A".into()),
    };
    let actions = resumed_with(&mut machine, end, now);
    let lost = stored("A", LockDelayWhy::LostTrack, LOCK_DELAY);
    assert!(
        matches!(&actions[..], [Action::StoreEnd(Some(record)), Action::Publish(_)] if *record == StoredLockDelay { fence: 0, ..lost.clone() }),
        "{actions:?}"
    );
    let (after, why, wait) = lock_delay_of(&machine.on(acquire("B", false, true), now));
    assert_eq!((after.as_str(), wait), ("A", LOCK_DELAY));
    assert!(
        why.contains("after a restart or a standby's takeover"),
        "{why}"
    );
    assert_eq!(machine.free_view(now).lock_delay_ms, Some(3000));
}

#[test]
fn a_restart_honours_the_longer_of_the_recorded_delay_and_an_unrecorded_end() {
    let now = Instant::now();
    let mut recorded_longer = machine(false, now);
    let end = StoredEnd {
        lock_delay: Some(stored("A", LockDelayWhy::RanOut, LOCK_DELAY * 2)),
        end_pending: Some("A".into()),
    };
    let actions = resumed_with(&mut recorded_longer, end, now);
    assert!(
        matches!(&actions[..], [Action::StoreEnd(Some(record)), Action::Publish(_)] if record.why == LockDelayWhy::RanOut && record.left == LOCK_DELAY * 2),
        "{actions:?}"
    );
    let mut unrecorded_longer = machine(false, now);
    let end = StoredEnd {
        lock_delay: Some(stored("A", LockDelayWhy::RanOut, Duration::from_millis(10))),
        end_pending: Some("B".into()),
    };
    resumed_with(&mut unrecorded_longer, end, now);
    let (after, _, wait) = lock_delay_of(&unrecorded_longer.on(acquire("C", false, true), now));
    assert_eq!((after.as_str(), wait), ("B", LOCK_DELAY));
}

#[test]
fn a_live_lease_in_the_store_is_resumed_and_its_own_ledger_changes_nothing() {
    let now = Instant::now();
    let mut machine = machine(false, now).with_station_unknown();
    let actions = machine.on(
        Event::Resumed {
            held: Some(grant("A", 11)),
            asked_at: now,
        },
        now,
    );
    assert!(actions.is_empty(), "{actions:?}");
    // Its own ledger's end marks are its own lease's: the shell passes none for it.
    let actions = resumed_with(&mut machine, StoredEnd::default(), now);
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(fence_held(&machine), Some(11));
}

/// The ledger of the station met says another control lease's holder left it a safe state
/// and a lock-delay (a gateway that named the station otherwise served it), while a lease of
/// this one is still held here: that lease ends as run out, and its end carries the ledger's
/// lock-delay.
#[test]
fn a_lease_held_here_when_the_ledger_owes_the_station_more_ends_with_those_duties() {
    let now = Instant::now();
    let mut machine = machine_with_safe_state(now).with_station_unknown();
    machine.on(
        Event::Resumed {
            held: Some(grant("A", 11)),
            asked_at: now,
        },
        now,
    );
    let actions = machine.on(
        Event::Adopted {
            owed_after: Some("Z".into()),
            end: StoredEnd {
                lock_delay: Some(stored("Z", LockDelayWhy::ChangesInDoubt, LOCK_DELAY * 2)),
                end_pending: None,
            },
        },
        now,
    );
    assert!(
        matches!(
            &actions[..],
            [
                Action::Forget(_),
                Action::Record(Record::Ended {
                    cause: EndCause::RanOut,
                    ..
                }),
                Action::Settle(SettleScope::Fence(11))
            ]
        ),
        "{actions:?}"
    );
    machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    machine.on(Event::SafeStateAnswered(Ok(())), now);
    read_back_right_twice(&mut machine, now);
    let (after, why, wait) = lock_delay_of(&machine.on(acquire("B", false, true), now));
    assert_eq!(
        (after.as_str(), why, wait),
        ("Z", "ended with changes in doubt", LOCK_DELAY * 2)
    );
}

/// Until the station's ledger is read no lease is granted (503, try again in a second), a
/// request waiting in line waits, and the first in line is served once it is read.
#[test]
fn no_lease_is_granted_before_the_stations_ledger_is_read() {
    let now = Instant::now();
    let mut machine = machine(false, now).with_station_unknown();
    let actions = machine.on(acquire("B", false, true), now);
    assert!(
        matches!(refusal(&actions), LeaseError::StationNotMet { retry_in } if *retry_in == Duration::from_secs(1)),
        "{actions:?}"
    );
    let actions = machine.on(acquire("B", true, true), now);
    assert!(
        matches!(&actions[..], [Action::Answer(Answer::Queued)]),
        "{actions:?}"
    );
    let next = Event::NextInLine {
        ticket: 3,
        owner: "B".into(),
        ttl: TTL,
    };
    assert!(matches!(
        &machine.on(next, now)[..],
        [Action::BackInLine(3)]
    ));
    let actions = resumed_with(&mut machine, StoredEnd::default(), now);
    assert!(
        matches!(&actions[..], [Action::Publish(_), Action::HandOver]),
        "{actions:?}"
    );
    let actions = machine.on(acquire("B", false, true), now);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

#[test]
fn a_safe_state_owed_at_a_restart_is_applied_first_then_the_lost_tracks_delay_is_recorded() {
    let now = Instant::now();
    let mut machine = machine_with_safe_state(now);
    let actions = machine.on(
        Event::Adopted {
            owed_after: Some("A".into()),
            end: StoredEnd {
                lock_delay: None,
                end_pending: Some("A".into()),
            },
        },
        now,
    );
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
    machine.on(Event::Deadline, now);
    machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    machine.on(Event::SafeStateAnswered(Ok(())), now);
    let actions = read_back_right_twice(&mut machine, now);
    assert!(
        actions.iter().any(|action| matches!(action, Action::StoreEnd(Some(record)) if record.why == LockDelayWhy::LostTrack)),
        "{actions:?}"
    );
    let (after, _, _) = lock_delay_of(&machine.on(acquire("B", false, true), now));
    assert_eq!(after, "A");
}

/// The station's ledger owes a safe state after Z's lease (another control lease's, ended at
/// the takeover) and hands the link Z's changes still in doubt: the safe state waits for them,
/// as a lease's own end waits for its changes, and one that left doubt unanswered makes it a
/// write and starts the lock-delay after Z's lease. An end already under way here when the
/// ledger is read (its safe state failing meanwhile) waits for them too before its next try.
#[test]
fn a_safe_state_owed_by_the_ledger_waits_for_the_changes_in_doubt_inherited_with_it() {
    let now = Instant::now();
    let mut machine = machine_with_safe_state(now).with_station_unknown();
    let adopted = |owed_after: Option<&str>| Event::Adopted {
        owed_after: owed_after.map(str::to_owned),
        end: StoredEnd::default(),
    };
    assert!(machine.on(adopted(Some("Z")), now).is_empty());
    let actions = machine.on(Event::Deadline, now);
    assert!(
        matches!(&actions[..], [Action::Settle(SettleScope::Every)]),
        "the safe state is tried before Z's changes settled: {actions:?}"
    );
    let lapsed = now + Duration::from_secs(3);
    let actions = machine.on(
        Event::ChangesSettled {
            lapsed_at: Some(lapsed),
        },
        lapsed,
    );
    assert!(
        matches!(&actions[..], [Action::SendSafeState { after }] if after == "Z"),
        "{actions:?}"
    );
    machine.on(Event::SafeStateAnswered(Ok(())), lapsed);
    read_back_right_twice(&mut machine, lapsed);
    let (after, why, wait) = lock_delay_of(&machine.on(acquire("B", false, true), lapsed));
    assert_eq!(
        (after.as_str(), why, wait),
        ("Z", "ended with changes in doubt", LOCK_DELAY)
    );

    // A's lease ended here before the link met the station; its safe state failed once.
    let mut machine = machine_with_safe_state(now).with_station_unknown();
    let resumed = Event::Resumed {
        held: Some(grant("A", 11)),
        asked_at: now,
    };
    machine.on(resumed, now);
    let at = now + TTL;
    machine.on(Event::Deadline, at);
    machine.on(Event::ChangesSettled { lapsed_at: None }, at);
    let failure = SafeStateError::NoChannel("ON1".into());
    machine.on(Event::SafeStateAnswered(Err(failure)), at);
    machine.on(adopted(None), at);
    let retry = at + SAFE_STATE_FIRST_BACKOFF;
    let actions = machine.on(Event::Deadline, retry);
    assert!(
        matches!(&actions[..], [Action::Settle(SettleScope::Every)]),
        "the next try comes before the inherited changes settled: {actions:?}"
    );
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, retry);
    assert!(
        matches!(&actions[..], [Action::SendSafeState { after }] if after == "A"),
        "{actions:?}"
    );
}

#[test]
fn with_the_lock_delay_off_a_restart_only_clears_an_end_mark_and_takes_mark_nothing() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let end = StoredEnd {
        lock_delay: None,
        end_pending: Some("A".into()),
    };
    let actions = resumed_with(&mut machine, end, now);
    assert!(
        matches!(
            &actions[..],
            [Action::StoreEnd(None), Action::Publish(_), Action::HandOver]
        ),
        "{actions:?}"
    );
    let actions = machine.on(acquire("B", false, true), now);
    assert!(
        matches!(
            &actions[..],
            [Action::Take {
                mark_end_pending: false,
                ..
            }]
        ),
        "{actions:?}"
    );
}

/// A recorded lock-delay with nothing left (the store answered just as it ran out) is no
/// lock-delay: nothing to wake for, and the next lease is taken at once.
#[test]
fn a_recorded_lock_delay_with_nothing_left_is_none() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let end = StoredEnd {
        lock_delay: Some(stored("A", LockDelayWhy::ChangesInDoubt, Duration::ZERO)),
        end_pending: None,
    };
    let actions = resumed_with(&mut machine, end, now);
    assert!(
        matches!(&actions[..], [Action::Publish(_), Action::HandOver]),
        "{actions:?}"
    );
    assert_eq!(machine.next_wake(), None);
    assert_eq!(machine.free_view(now).lock_delay_ms, None);
    let actions = machine.on(acquire("B", false, true), now);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}

/// A safe stop pressed during a lock-delay keeps it as it is (no longer), and one pressed at
/// the very instant it ends starts none.
#[test]
fn a_safe_stop_during_a_lock_delay_keeps_it_and_one_at_its_end_starts_none() {
    let now = Instant::now();
    let mut machine = machine(false, now);
    let lapsed = ran_out_in_doubt(&mut machine, now);
    let stop = || Event::SafeStop {
        by: "bench 3".into(),
        reason: "smoke in rack 2".into(),
    };
    let during = lapsed + Duration::from_secs(1);
    machine.on(stop(), during);
    let (_, why, wait) = lock_delay_of(&machine.on(acquire("B", false, true), during));
    assert_eq!(
        (why, wait),
        (
            "ended with changes in doubt",
            LOCK_DELAY - Duration::from_secs(1)
        )
    );
    let ends = lapsed + LOCK_DELAY;
    machine.on(stop(), ends);
    let actions = machine.on(acquire("B", false, true), ends);
    assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
}
