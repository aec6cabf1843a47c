//! The send guard's decision as a pure function: lease snapshots, interlocks and times in,
//! the refusal (or none) out; no runtime, no lock.

use std::sync::Arc;
use std::time::Duration;

use station_protocol::Value;
use tokio::time::Instant;

use super::*;

const DOOR: &str = "Interlock.DOOR_CLOSED";

fn held(fence: u64, until: Instant) -> LeaseSnapshot {
    LeaseSnapshot::Held {
        owner: "B".into(),
        fence,
        until,
    }
}

fn door_closed(max_age: Duration) -> Interlocks {
    Interlocks {
        conditions: vec![Interlock {
            channel: Arc::from(DOOR),
            value: Arc::from("True"),
        }],
        max_age,
    }
}

fn judged(
    guard: &SendGuard,
    lease: Option<&LeaseSnapshot>,
    values: &ValueCache,
    now: Instant,
    values_now: std::time::Instant,
) -> Result<(), GuardRefusal> {
    guard.judge(&SendMoment {
        lease,
        values,
        generation: 1,
        now,
        values_now,
    })
}

#[test]
fn a_holders_change_passes_only_while_its_own_lease_is_live() {
    let now = Instant::now();
    let later = now + Duration::from_secs(10);
    let watch = LeaseWatch::new(held(7, later));
    let guard = SendGuard::lease(Some(7), Guarded::Change, watch.clone());
    let values = ValueCache::new();
    let std_now = std::time::Instant::now();
    assert_eq!(
        judged(&guard, Some(&held(7, later)), &values, now, std_now),
        Ok(())
    );
    // Past its deadline, before the lease control noticed: ended for the guard.
    assert_eq!(
        judged(&guard, Some(&held(7, later)), &values, later, std_now),
        Err(GuardRefusal::LeaseEnded {
            what: Guarded::Change,
            admitted: 7
        })
    );
    let taken = held(8, later);
    let refused = judged(&guard, Some(&taken), &values, now, std_now).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "lease ended: the lease this change was admitted under (fence 7) was replaced by B's (fence 8) before the change reached the station; it was not sent"
    );
    assert_eq!(refused.admitted_fence(), Some(7));
    // What the link runs: the snapshot published now.
    assert_eq!(guard.lease_check(now), Ok(()));
    watch.publish(LeaseSnapshot::Free);
    assert!(matches!(
        guard.check(&values, 1),
        Err(GuardRefusal::LeaseEnded { admitted: 7, .. })
    ));
}

#[test]
fn a_change_admitted_while_nobody_held_it_waits_for_no_lease() {
    let now = Instant::now();
    let later = now + Duration::from_secs(1);
    let guard = SendGuard::lease(None, Guarded::Read, LeaseWatch::new(LeaseSnapshot::Free));
    let refusal = |lease: LeaseSnapshot, at: Instant| lease.admits(None, Guarded::Read, at);
    assert_eq!(refusal(LeaseSnapshot::Free, now), Ok(()));
    let delay = LeaseSnapshot::LockDelay {
        after: "A's lease".into(),
        until: later,
    };
    assert_eq!(
        refusal(delay.clone(), now).unwrap_err().to_string(),
        "the station waits the lock-delay after A's lease (a change of it may still land); no change until it is over; this read was not sent"
    );
    assert_eq!(refusal(delay, later), Ok(()));
    assert!(matches!(
        refusal(held(3, later), now),
        Err(GuardRefusal::Leased { .. })
    ));
    assert!(matches!(
        refusal(held(3, later), later),
        Err(GuardRefusal::LeasedAndEnded { .. })
    ));
    let ending = |pending| LeaseSnapshot::Ending {
        owner: "A".into(),
        safe_state_pending: pending,
    };
    assert!(matches!(
        refusal(ending(None), now),
        Err(GuardRefusal::BetweenLeases { .. })
    ));
    assert_eq!(
        refusal(ending(Some((2, "no answer".into()))), now)
            .unwrap_err()
            .to_string(),
        "the safe state after A's lease is not yet confirmed by the station (2 tries; last: no answer); no change and no new lease until it is; the gateway keeps trying; this read was not sent"
    );
    assert_eq!(guard.fence(), None);
}

#[test]
fn an_interlock_holds_only_on_a_recent_equal_value_of_this_generation() {
    let max_age = Duration::from_millis(500);
    let guard = SendGuard::with_interlocks(None, door_closed(max_age));
    let values = ValueCache::new();
    let now = Instant::now();
    let read_at = std::time::Instant::now();
    let later = read_at + Duration::from_millis(100);
    let broken = |seen: Option<&str>| {
        Err(GuardRefusal::Interlock(InterlockBroken {
            index: 0,
            channel: Arc::from(DOOR),
            seen: seen.map(str::to_owned),
        }))
    };
    assert_eq!(judged(&guard, None, &values, now, later), broken(None));
    values.insert(DOOR, Value::Bool(true), read_at, 1);
    assert_eq!(judged(&guard, None, &values, now, later), Ok(()));
    // Compared by rendering, ASCII case ignored.
    values.insert(DOOR, Value::String("TRUE".into()), read_at, 1);
    assert_eq!(judged(&guard, None, &values, now, later), Ok(()));
    values.insert(DOOR, Value::Bool(false), later, 1);
    assert_eq!(
        judged(&guard, None, &values, now, later),
        broken(Some("False"))
    );
    values.insert(DOOR, Value::Bool(true), later, 1);
    // Too old to trust, or of an earlier connection: as if there were no value.
    let too_late = later + max_age + Duration::from_millis(1);
    assert_eq!(judged(&guard, None, &values, now, too_late), broken(None));
    let moment = SendMoment {
        lease: None,
        values: &values,
        generation: 2,
        now,
        values_now: later,
    };
    assert_eq!(guard.judge(&moment), broken(None));
}

#[test]
fn the_lease_is_judged_before_the_interlocks() {
    let now = Instant::now();
    let admitted = SendGuard::lease(
        Some(4),
        Guarded::Change,
        LeaseWatch::new(LeaseSnapshot::Free),
    );
    let guard = SendGuard::with_interlocks(Some(admitted), door_closed(Duration::from_secs(1)));
    assert_eq!(guard.fence(), Some(4));
    let values = ValueCache::new();
    let std_now = std::time::Instant::now();
    assert!(matches!(
        judged(&guard, Some(&LeaseSnapshot::Free), &values, now, std_now),
        Err(GuardRefusal::LeaseEnded { admitted: 4, .. })
    ));
    assert!(matches!(
        judged(
            &guard,
            Some(&held(4, now + Duration::from_secs(1))),
            &values,
            now,
            std_now
        ),
        Err(GuardRefusal::Interlock(_))
    ));
}

/// An interlock refusal nobody put in the rules' words says which channel and what it read,
/// in the link's own neutral words.
#[test]
fn a_broken_interlock_in_neutral_words_names_the_channel_and_what_it_read() {
    let broken = |seen: Option<&str>| {
        InterlockBroken {
            index: 0,
            channel: Arc::from(DOOR),
            seen: seen.map(str::to_owned),
        }
        .to_string()
    };
    assert_eq!(
        broken(Some("False")),
        "forbidden: an interlock on Interlock.DOOR_CLOSED does not hold (it reads False); it was not sent"
    );
    assert_eq!(
        broken(None),
        "forbidden: an interlock on Interlock.DOOR_CLOSED does not hold (no value read recently enough to trust); it was not sent"
    );
}
