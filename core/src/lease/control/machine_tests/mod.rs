//! Unit tests of the lease machine: every transition, with times passed in, without sockets or
//! a runtime (plain `#[test]`s). Taking and renewing here; ending in `ending.rs`.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::link::SettleScope;

use super::super::store::{Acquisition, LeaseGrant, LeaseHolder, LeaseToken};
use super::super::{LeaseError, LeaseStoreError, LeaseView};
use super::events::{Action, Answer, EndCause, Event, Grantee, Record, Releasing, SafeStateError};
use super::machine::{LeaseMachine, SAFE_STATE_FIRST_BACKOFF, SAFE_STATE_MAX_BACKOFF};
use super::state::{LeaseState, StoredEnd};

mod ending;
mod lock_delay;
mod read_back;
mod safe_stop;

const TTL: Duration = Duration::from_secs(10);
/// The second read back of a safe state, this long after the first (`max_processing_ms`).
const READ_BACK_AFTER: Duration = Duration::from_secs(4);
const REQUESTER: Grantee = Grantee::Requester { wait: false };

fn grant(owner: &str, fence: u64) -> LeaseGrant {
    LeaseGrant {
        token: LeaseToken::random(),
        owner: owner.into(),
        fence,
        ttl: TTL,
        expires_in: TTL,
        since: SystemTime::UNIX_EPOCH,
        slot: 0,
    }
}

fn holder(owner: &str) -> LeaseHolder {
    LeaseHolder {
        owner: owner.into(),
        ..LeaseHolder::unknown()
    }
}

fn unavailable() -> LeaseStoreError {
    LeaseStoreError::Unavailable("down".into())
}

fn peer() -> SocketAddr {
    "127.0.0.1:9".parse().unwrap()
}

fn acquire(owner: &str, wait: bool, line_empty: bool) -> Event {
    Event::Acquire {
        owner: owner.into(),
        ttl: TTL,
        presented: None,
        wait,
        line_empty,
    }
}

/// A machine in which `owner` holds the lease with `fence`, taken at `now`; its token.
fn held_by(machine: &mut LeaseMachine, owner: &str, fence: u64, now: Instant) -> LeaseToken {
    let taken = grant(owner, fence);
    let token = taken.token.clone();
    machine.on(acquire(owner, false, true), now);
    machine.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: now,
            answer: Ok(Acquisition::Taken(taken)),
        },
        now,
    );
    machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    token
}

/// The holder releases `token` and the store confirms it: the lease is ending.
fn released(machine: &mut LeaseMachine, token: LeaseToken, now: Instant) {
    machine.on(
        Event::Release {
            presented: token.as_str().into(),
        },
        now,
    );
    machine.on(
        Event::Released {
            token,
            releasing: Releasing::Holder,
            answer: Ok(true),
        },
        now,
    );
}

fn refusal(actions: &[Action]) -> &LeaseError {
    match actions {
        [.., Action::Answer(Answer::Refused(refusal))] => refusal,
        other => panic!("not a refusal: {other:?}"),
    }
}

fn ending_of(machine: &LeaseMachine) -> (String, bool, u32) {
    match machine.state() {
        LeaseState::Ending(ending) => (ending.owner.clone(), ending.safe_state_owed, ending.tries),
        _ => panic!("not ending"),
    }
}

/// Nobody holds it and nothing is being finished (a lock-delay may run).
fn is_free(machine: &LeaseMachine) -> bool {
    matches!(machine.state(), LeaseState::Free | LeaseState::Locked(_))
}

fn fence_held(machine: &LeaseMachine) -> Option<u64> {
    match machine.state() {
        LeaseState::Held(live) => Some(live.fence),
        _ => None,
    }
}

/// The safe state's channels read back right at `at` (the first or the second read back).
fn read_back_right(machine: &mut LeaseMachine, at: Instant) -> Vec<Action> {
    machine.on(Event::SafeStateReadBack(Ok(Vec::new())), at)
}

/// Once the station confirmed the safe state's writes at `at`: read back right at once and,
/// when the second read back is due, again; the second's actions (the end finished).
fn read_back_right_twice(machine: &mut LeaseMachine, at: Instant) -> Vec<Action> {
    read_back_right(machine, at);
    let second_at = machine.next_wake().expect("the second read back is due");
    let actions = machine.on(Event::Deadline, second_at);
    assert!(
        matches!(&actions[..], [Action::ReadBackSafeState]),
        "{actions:?}"
    );
    read_back_right(machine, second_at)
}

/// What finishing an end looks like: (the mark cleared,) free, the event, the next in line.
fn is_finish(actions: &[Action], with_safe_state: bool) -> bool {
    match actions {
        [Action::ForgetOwed, Action::Publish(view), Action::HandOver] => {
            with_safe_state && *view == LeaseView::nobody()
        }
        [Action::Publish(view), Action::HandOver] => {
            !with_safe_state && *view == LeaseView::nobody()
        }
        _ => false,
    }
}

#[test]
fn a_free_lease_is_taken_from_the_store_and_granted_once_the_free_changes_have_settled() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let actions = machine.on(acquire("A", false, true), now);
    assert!(
        matches!(
            &actions[..],
            [Action::Take { grantee: Some(REQUESTER), remember_owed: false, mark_end_pending: false, asked_at, request }]
                if *asked_at == now && request.owner == "A" && request.retry_token.is_none()
        ),
        "{actions:?}"
    );
    let actions = machine.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: now,
            answer: Ok(Acquisition::Taken(grant("A", 7))),
        },
        now,
    );
    assert!(
        matches!(&actions[..], [Action::Settle(SettleScope::Every)]),
        "every change still at the station, whoever made it, leaves it first: {actions:?}"
    );
    // Held from now on: the link refuses changes admitted while it was free.
    assert_eq!(fence_held(&machine), Some(7));
    let later = now + Duration::from_secs(1);
    let actions = machine.on(Event::ChangesSettled { lapsed_at: None }, later);
    match &actions[..] {
        [
            Action::Record(Record::Taken { owner, fence: 7 }),
            Action::Publish(view),
            Action::Grant { grantee, answer },
        ] if owner == "A" => {
            assert!(view.held && view.owner.as_deref() == Some("A"));
            assert_eq!(*grantee, REQUESTER);
            assert_eq!((answer.fence, answer.expires_in_ms), (7, 9_000));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(machine.next_wake(), Some(now + TTL));
    // Settled once: a second answer grants nothing.
    assert!(
        machine
            .on(Event::ChangesSettled { lapsed_at: None }, later)
            .is_empty()
    );
}

#[test]
fn with_a_safe_state_taking_a_free_lease_first_marks_it_owed() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let actions = machine.on(acquire("A", false, true), now);
    assert!(matches!(
        &actions[..],
        [Action::Take {
            remember_owed: true,
            ..
        }]
    ));
    // Held by someone else: the mark is there already.
    held_by(&mut machine, "A", 1, now);
    let actions = machine.on(acquire("B", false, true), now);
    assert!(matches!(
        &actions[..],
        [Action::Take {
            remember_owed: false,
            ..
        }]
    ));
}

#[test]
fn a_store_that_renews_instead_of_taking_grants_at_once() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    machine.on(acquire("A", false, true), now);
    let actions = machine.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: now,
            answer: Ok(Acquisition::Renewed(grant("A", 3))),
        },
        now,
    );
    assert!(
        matches!(&actions[..], [Action::Grant { grantee: REQUESTER, answer }] if answer.fence == 3),
        "{actions:?}"
    );
    assert_eq!(fence_held(&machine), Some(3));
}

#[test]
fn someone_elses_lease_is_refused_or_waited_for() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    for (wait, queued) in [(false, false), (true, true)] {
        machine.on(acquire("B", wait, true), now);
        let actions = machine.on(
            Event::Taken {
                grantee: Some(Grantee::Requester { wait }),
                asked_at: now,
                answer: Ok(Acquisition::HeldByOther(holder("A"))),
            },
            now,
        );
        match queued {
            true => assert!(matches!(&actions[..], [Action::Answer(Answer::Queued)])),
            false => assert!(matches!(
                refusal(&actions),
                LeaseError::HeldByOther { owner, .. } if owner == "A"
            )),
        }
    }
    let actions = machine.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: now,
            answer: Err(unavailable()),
        },
        now,
    );
    assert!(matches!(refusal(&actions), LeaseError::Store(_)));
    assert!(is_free(&machine));
}

/// An acquire asked of the store while `A`'s lease was live locally, answered only after its
/// deadline (the machine had not yet seen the deadline): the store, whose lease had lapsed too,
/// took a new one. `A`'s lease must still end the way every lease ends (its changes settle,
/// then its safe state): installing the new lease over it would let `A`'s changes still at the
/// station land under the next holder (`lease_invariants` saw a change in doubt do exactly
/// that). The new lease is handed back to the store; the asker is refused, queued or put
/// back in line, as while any lease is ending.
#[test]
fn a_new_lease_the_store_took_over_one_not_yet_ended_here_ends_that_one_first() {
    let now = Instant::now();
    let deadline = now + TTL;
    for grantee in [
        REQUESTER,
        Grantee::Requester { wait: true },
        Grantee::Waiter(7),
    ] {
        let mut machine = LeaseMachine::new(true, now);
        let token = held_by(&mut machine, "A", 2, now);
        let asked_at = deadline - Duration::from_millis(1);
        let actions = machine.on(acquire("B", false, true), asked_at);
        assert!(matches!(&actions[..], [Action::Take { .. }]), "{actions:?}");
        let new = grant("B", 3);
        let new_token = new.token.clone();
        let actions = machine.on(
            Event::Taken {
                grantee: Some(grantee),
                asked_at,
                answer: Ok(Acquisition::Taken(new)),
            },
            deadline + Duration::from_millis(1),
        );
        let answered = match grantee {
            Grantee::Requester { wait: false } => matches!(
                &actions[..],
                [.., Action::Answer(Answer::Refused(LeaseError::Ending { owner, .. }))] if owner == "A"
            ),
            Grantee::Requester { wait: true } => {
                matches!(&actions[..], [.., Action::Answer(Answer::Queued)])
            }
            Grantee::Waiter(ticket) => {
                matches!(&actions[..], [.., Action::BackInLine(back)] if *back == ticket)
            }
        };
        assert!(answered, "{grantee:?}: {actions:?}");
        assert!(
            matches!(
                &actions[..],
                [
                    Action::Forget(handed_back),
                    Action::Forget(ended),
                    Action::Record(Record::Ended { fence: 2, cause: EndCause::RanOut, .. }),
                    Action::Settle(SettleScope::Fence(2)),
                    _,
                ] if *handed_back == new_token && *ended == token
            ),
            "{grantee:?}: {actions:?}"
        );
        assert_eq!(ending_of(&machine), ("A".into(), true, 0));
        // Nothing of the new lease is left: no grant follows the settle of A's changes.
        let actions = machine.on(
            Event::ChangesSettled { lapsed_at: None },
            deadline + Duration::from_millis(2),
        );
        assert!(
            matches!(&actions[..], [Action::SendSafeState { after }] if after == "A"),
            "{actions:?}"
        );
    }
}

/// The store took a new lease although this gateway's is live by its own clock (the store
/// lost it: a flushed Redis, an operator): the store's word ends it here too, as a renewal the
/// store says ended does, rather than two holders at once.
#[test]
fn a_new_lease_the_store_took_over_a_live_one_ends_the_live_one_as_run_out() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let token = held_by(&mut machine, "A", 2, now);
    machine.on(acquire("B", false, true), now);
    let new = grant("B", 3);
    let new_token = new.token.clone();
    let actions = machine.on(
        Event::Taken {
            grantee: Some(REQUESTER),
            asked_at: now,
            answer: Ok(Acquisition::Taken(new)),
        },
        now,
    );
    assert!(
        matches!(
            &actions[..],
            [
                Action::Forget(handed_back),
                Action::Forget(ended),
                Action::Record(Record::Ended { fence: 2, cause: EndCause::RanOut, .. }),
                Action::Settle(SettleScope::Fence(2)),
                Action::Answer(Answer::Refused(LeaseError::Ending { owner, .. })),
            ] if *handed_back == new_token && *ended == token && owner == "A"
        ),
        "{actions:?}"
    );
    assert_eq!(ending_of(&machine), ("A".into(), false, 0));
    assert_eq!(fence_held(&machine), None);
}

#[test]
fn nobody_jumps_the_line() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    held_by(&mut machine, "A", 1, now);
    let actions = machine.on(acquire("D", false, false), now);
    assert!(matches!(refusal(&actions), LeaseError::HeldByOther { owner, .. } if owner == "A"));
    let actions = machine.on(acquire("D", true, false), now);
    assert!(matches!(&actions[..], [Action::Answer(Answer::Queued)]));
    // Free, with someone still in line the store would not serve: the one who waited.
    let mut free = LeaseMachine::new(false, now);
    let actions = free.on(acquire("D", false, false), now);
    assert!(matches!(
        refusal(&actions),
        LeaseError::HeldByOther { owner, expires_in } if owner.contains("waited") && expires_in.is_zero()
    ));
}

/// The store's answer to a waiter's acquisition was lost (the store may have taken the lease
/// all the same), or the store held the lease for one this gateway does not know of: the lease
/// it may have taken goes back to the store under the id it was asked for, the waiter goes back
/// to the front of the line, and the expiry task hands the line over again later. Left there,
/// the lease free here and nobody handing the line over, everyone after it is refused for ever.
#[test]
fn a_waiter_the_store_did_not_serve_is_handed_the_line_again() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let next_in_line = || Event::NextInLine {
        ticket: 7,
        owner: "B".into(),
        ttl: TTL,
    };
    let actions = machine.on(next_in_line(), now);
    let [Action::Take { request, .. }] = &actions[..] else {
        panic!("{actions:?}")
    };
    let asked_for = request.fresh_token().clone();
    let not_answered = Event::Taken {
        grantee: Some(Grantee::Waiter(7)),
        asked_at: now,
        answer: Err(unavailable()),
    };
    let actions = machine.on(not_answered, now);
    assert!(
        matches!(&actions[..], [Action::Forget(token), Action::BackInLine(7)] if *token == asked_for),
        "{actions:?}"
    );
    let again = machine
        .next_wake()
        .expect("the line is never handed over again");
    assert!(again > now);
    assert!(machine.on(Event::Deadline, now).is_empty());
    assert!(matches!(
        &machine.on(Event::Deadline, again)[..],
        [Action::HandOver]
    ));
    // Held in the store for 3 s more: handed over again once that lease has lapsed there.
    machine.on(next_in_line(), again);
    let held_there = LeaseHolder {
        expires_in: Duration::from_secs(3),
        ..holder("X")
    };
    let actions = machine.on(
        Event::Taken {
            grantee: Some(Grantee::Waiter(7)),
            asked_at: again,
            answer: Ok(Acquisition::HeldByOther(held_there)),
        },
        again,
    );
    assert!(
        matches!(&actions[..], [Action::BackInLine(7)]),
        "{actions:?}"
    );
    assert_eq!(machine.next_wake(), Some(again + Duration::from_secs(3)));
}

#[test]
fn between_leases_an_acquire_is_refused_or_waits() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let token = held_by(&mut machine, "A", 1, now);
    released(&mut machine, token, now);
    let actions = machine.on(acquire("B", false, true), now);
    assert!(matches!(refusal(&actions), LeaseError::Ending { owner, .. } if owner == "A"));
    let actions = machine.on(acquire("B", true, true), now);
    assert!(matches!(&actions[..], [Action::Answer(Answer::Queued)]));
    assert!(matches!(
        machine.held_by_other(now),
        LeaseError::Ending { .. }
    ));
}

#[test]
fn acquiring_with_the_live_id_renews_through_the_store() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let token = held_by(&mut machine, "A", 4, now);
    let again = Event::Acquire {
        owner: "A".into(),
        ttl: TTL,
        presented: Some(token.as_str().into()),
        wait: false,
        line_empty: false,
    };
    let actions = machine.on(again, now);
    assert!(
        matches!(
            &actions[..],
            [Action::Take { grantee: None, remember_owed: false, request, .. }]
                if request.retry_token.as_ref() == Some(&token)
        ),
        "{actions:?}"
    );
    let later = now + Duration::from_secs(5);
    let renewed = LeaseGrant {
        token: token.clone(),
        ..grant("A", 4)
    };
    let actions = machine.on(
        Event::Taken {
            grantee: None,
            asked_at: later,
            answer: Ok(Acquisition::Renewed(renewed)),
        },
        later,
    );
    assert!(
        matches!(&actions[..], [Action::Answer(Answer::Renewed(answer))] if answer.fence == 4 && answer.expires_in_ms == 10_000),
        "{actions:?}"
    );
    assert_eq!(machine.next_wake(), Some(later + TTL));
    for answer in [
        Ok(Acquisition::HeldByOther(holder("B"))),
        Err(unavailable()),
    ] {
        let actions = machine.on(
            Event::Taken {
                grantee: None,
                asked_at: later,
                answer,
            },
            later,
        );
        assert!(matches!(
            refusal(&actions),
            LeaseError::HeldByOther { .. } | LeaseError::Store(_)
        ));
        assert_eq!(fence_held(&machine), Some(4));
    }
}

#[test]
fn a_store_that_took_anew_instead_of_renewing_ends_the_old_lease_and_frees_the_new_one() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    held_by(&mut machine, "A", 4, now);
    let stray = grant("A", 5);
    let stray_token = stray.token.clone();
    let actions = machine.on(
        Event::Taken {
            grantee: None,
            asked_at: now,
            answer: Ok(Acquisition::Taken(stray)),
        },
        now,
    );
    assert!(
        matches!(
            &actions[..],
            [
                Action::Forget(forgotten),
                Action::Record(Record::Ended { fence: 4, cause: EndCause::RanOut, .. }),
                Action::Settle(SettleScope::Fence(4)),
                Action::Answer(Answer::Refused(LeaseError::NoSuchLease)),
            ] if *forgotten == stray_token
        ),
        "{actions:?}"
    );
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
}

#[test]
fn a_renewal_confirmed_before_the_deadline_extends_the_lease() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let token = held_by(&mut machine, "A", 2, now);
    let asked_at = now + Duration::from_secs(9);
    let actions = machine.on(
        Event::Renew {
            presented: token.as_str().into(),
            ttl: None,
        },
        asked_at,
    );
    assert!(
        matches!(&actions[..], [Action::Refresh { token: asked, ttl: None, asked_at: at }] if *asked == token && *at == asked_at),
        "{actions:?}"
    );
    let answered = asked_at + Duration::from_millis(500);
    let renewed = LeaseGrant {
        token: token.clone(),
        ..grant("A", 2)
    };
    let actions = machine.on(
        Event::Refreshed {
            token: token.clone(),
            asked_at,
            answer: Ok(Some(renewed)),
        },
        answered,
    );
    assert!(
        matches!(&actions[..], [Action::Answer(Answer::Renewed(answer))] if answer.expires_in_ms == 9_500),
        "{actions:?}"
    );
    // The new deadline counts from when the store was asked, never later.
    assert_eq!(machine.next_wake(), Some(asked_at + TTL));
}

#[test]
fn a_renewal_confirmed_after_the_deadline_ends_the_lease_as_run_out() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let token = held_by(&mut machine, "A", 2, now);
    let asked_at = now + TTL - Duration::from_millis(100);
    machine.on(
        Event::Renew {
            presented: token.as_str().into(),
            ttl: None,
        },
        asked_at,
    );
    let renewed = LeaseGrant {
        token: token.clone(),
        ..grant("A", 2)
    };
    let actions = machine.on(
        Event::Refreshed {
            token: token.clone(),
            asked_at,
            answer: Ok(Some(renewed)),
        },
        now + TTL,
    );
    assert!(
        matches!(
            &actions[..],
            [
                Action::Record(Record::RenewedTooLate { fence: 2, .. }),
                Action::Forget(undone),
                Action::Record(Record::Ended { fence: 2, cause: EndCause::RanOut, .. }),
                Action::Settle(SettleScope::Fence(2)),
                Action::Answer(Answer::Refused(LeaseError::NoSuchLease)),
            ] if *undone == token
        ),
        "{actions:?}"
    );
    assert_eq!(ending_of(&machine), ("A".into(), true, 0));
}

#[test]
fn a_renewal_the_store_says_ended_runs_out_and_one_it_cannot_answer_changes_nothing() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    let token = held_by(&mut machine, "A", 2, now);
    let actions = machine.on(
        Event::Refreshed {
            token: token.clone(),
            asked_at: now,
            answer: Err(unavailable()),
        },
        now,
    );
    assert!(matches!(refusal(&actions), LeaseError::Store(_)));
    assert_eq!(fence_held(&machine), Some(2));
    let actions = machine.on(
        Event::Refreshed {
            token: token.clone(),
            asked_at: now,
            answer: Ok(None),
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
                Action::Settle(SettleScope::Fence(2)),
                Action::Answer(Answer::Refused(LeaseError::NoSuchLease)),
            ]
        ),
        "{actions:?}"
    );
    // Without a safe state configured, nothing is owed.
    assert_eq!(ending_of(&machine), ("A".into(), false, 0));
    // A renewal of a lease no longer held is refused.
    let actions = machine.on(
        Event::Refreshed {
            token,
            asked_at: now,
            answer: Ok(Some(grant("A", 2))),
        },
        now,
    );
    assert!(matches!(refusal(&actions), LeaseError::NoSuchLease));
}

#[test]
fn only_the_live_id_renews_or_releases() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(false, now);
    for event in [
        Event::Renew {
            presented: "nope".into(),
            ttl: None,
        },
        Event::Release {
            presented: "nope".into(),
        },
    ] {
        assert!(matches!(
            refusal(&machine.on(event, now)),
            LeaseError::NoSuchLease
        ));
    }
    let token = held_by(&mut machine, "A", 1, now);
    let past = now + TTL;
    let actions = machine.on(
        Event::Release {
            presented: token.as_str().into(),
        },
        past,
    );
    assert!(matches!(refusal(&actions), LeaseError::NoSuchLease));
    let actions = machine.on(
        Event::Renew {
            presented: token.as_str().into(),
            ttl: None,
        },
        past,
    );
    assert!(matches!(refusal(&actions), LeaseError::NoSuchLease));
}

#[test]
fn a_store_answer_about_a_lease_no_longer_held_changes_nothing() {
    let now = Instant::now();
    let mut machine = LeaseMachine::new(true, now);
    let stale = held_by(&mut machine, "A", 1, now);
    machine.on(
        Event::Released {
            token: stale.clone(),
            releasing: Releasing::Holder,
            answer: Ok(true),
        },
        now,
    );
    machine.on(Event::ChangesSettled { lapsed_at: None }, now);
    held_by(&mut machine, "B", 2, now);
    let renewed = LeaseGrant {
        token: stale.clone(),
        ..grant("A", 1)
    };
    let actions = machine.on(
        Event::Refreshed {
            token: stale.clone(),
            asked_at: now,
            answer: Ok(Some(renewed)),
        },
        now,
    );
    assert!(matches!(refusal(&actions), LeaseError::NoSuchLease));
    for answer in [Ok(None), Err(unavailable())] {
        let actions = machine.on(
            Event::Refreshed {
                token: stale.clone(),
                asked_at: now,
                answer,
            },
            now,
        );
        assert!(matches!(
            refusal(&actions),
            LeaseError::NoSuchLease | LeaseError::Store(_)
        ));
    }
    let actions = machine.on(
        Event::Released {
            token: stale,
            releasing: Releasing::Holder,
            answer: Ok(true),
        },
        now,
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Settle(_) | Action::Record(_))),
        "{actions:?}"
    );
    assert_eq!(
        fence_held(&machine),
        Some(2),
        "B's lease was ended by an answer about A's"
    );
}
