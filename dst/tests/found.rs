//! Seeds that once found a hole in the gateway, run again: each must pass.

use std::time::Duration;

use station_dst::{RunOptions, run};

/// A standby-configured gateway, killed while its own change was at the station, took its own
/// link-owner lease back at its restart and granted the next lease at once: that change
/// landed inside it. The crash restart's doubt is now inherited on that path too.
#[test]
fn a_standby_that_takes_its_own_lease_back_after_a_crash_waits_for_what_the_crashed_run_left() {
    let outcome = run(RunOptions {
        seed: 493,
        faulty_for: Duration::from_secs(60),
        echo: false,
        reintroduce: None,
    });
    assert!(
        outcome.failure.is_none(),
        "seed 493 failed: {:?}\n{}",
        outcome.failure,
        outcome.trace
    );
}

/// Runs `seed` with the default faulty minute: the failure it found, if any.
fn failure_of(seed: u64) -> Option<String> {
    run(RunOptions {
        seed,
        faulty_for: Duration::from_secs(60),
        echo: false,
        reintroduce: None,
    })
    .failure
}

/// Two gateways name one station differently (gw1: `url tcp://10.0.0.5:5025`, its own control
/// lease). gw0, restarted cleanly at 44.6 s, takes its own link-owner lease, but its link
/// stands by: gw1 holds the station's own lease (`link-owner:station:<identity>`) and serves
/// the station under its control lease, where client2 holds the lease (fence 1 of gw1's, from
/// 45.2 s). client0 waits in line at gw0 and is granted gw0's control lease (fence 4) at
/// 47.29 s, though gw0 does not serve the station (its door refuses every write: "not the link
/// owner"): two clients hold a lease of one physical station at once, and client2's write 33
/// lands at 47.32 s inside client0's tenure (invariant 1). Seed 589 is the same grant, at once,
/// at a gateway that had read the station's ledger before (`station_served()` set). Seed 652:
/// the scripted acquirer client8, waiting in line at gw0 (whose link stood by), granted at once
/// 0.3 s after client0's lease at gw1 ended unreleased, with no safe state between
/// (invariant 2). Seeds 1560, 3044 and 3163 found the same grant. The control lease now asks
/// whether this process owns the station's link at the moment it grants (`tests/
/// served_elsewhere.rs` plays the grant itself, whatever the seeds' paths become).
#[test]
fn a_gateway_that_does_not_serve_the_station_grants_no_lease_of_it() {
    for seed in [328, 589, 652, 1560, 3044, 3163] {
        let failure = failure_of(seed);
        assert!(failure.is_none(), "seed {seed} failed: {failure:?}");
    }
}

/// Two gateways name one station differently (gw1: `lease.name "hv bench"`). client0's write
/// 15 is at the station under gw0's lease when gw0 stops cleanly at 28.73 s (its clean stop
/// records the change in the station's ledger and releases the station's own lease). gw1
/// takes that lease 9 ms later, adopts the ledger: ends client0's lease of gw0's control lease
/// there (a foreign lease) and inherits the change's doubt (any fence, 4 s), then writes the
/// safe state at 29.35 s without waiting for that doubt; write 15 lands at 29.99 s through
/// gw0's old connection, after gw1's safe state (invariant 4; gw1's read-back then finds 15
/// and writes the safe state again). The safe state owed after a lease ended at the takeover
/// now waits for the changes in doubt inherited with the ledger.
#[test]
fn a_takeover_under_another_name_writes_the_safe_state_after_the_changes_in_doubt() {
    let failure = failure_of(491);
    assert!(failure.is_none(), "seed 491 failed: {failure:?}");
}

/// The owner, gw0, is cut off from the store and paused while client1's write 7 waits in its
/// line; it stops cleanly and its release of the station's own lease is lost. gw1 (which names
/// the station otherwise) takes that lease at 8.01 s after it lapsed and waits the lock-delay,
/// but stops cleanly at 8.42 s, during that wait, and noted a clean release: restarted, it took
/// the lease again at once with no lock-delay and wrote the safe state after client1's lease at
/// 8.76 s; write 7 landed at 9.40 s over it (invariant 2). A gateway that stops during the
/// lock-delay after a lapse now notes no clean release, so the next owner waits it too.
#[test]
fn a_clean_stop_during_the_lock_delay_after_a_lapse_leaves_it_owed() {
    let failure = failure_of(92);
    assert!(failure.is_none(), "seed 92 failed: {failure:?}");
}

/// A station carried a lease-less change out later than `max_processing_ms` (within the
/// lock-delay); its doubt lapsed and nobody asked for the lease before the gateway stopped
/// cleanly (seed 14: write 5 sent at 14.0 s, gw0 stopped at 18.2 s and restarted; client11
/// granted at 18.22 s; the write landed at 18.54 s inside that lease; seed 74 the same). The
/// lock-delay that runs from the lapse lived only in the link's memory until a grant's settle
/// took it. It is now written into the station's ledger when the doubt lapses (both seeds fail
/// with `--reintroduce lapse-not-recorded`).
#[test]
fn a_lapsed_doubts_lock_delay_holds_the_grant_after_a_clean_stop_before_anyone_asked() {
    for seed in [14, 74] {
        let failure = failure_of(seed);
        assert!(failure.is_none(), "seed {seed} failed: {failure:?}");
    }
}

/// The store took the lease for the first in line and its answer was lost: the waiter went back
/// to the front of the line, the lease free at the gateway, and nothing handed the line over
/// again, so every acquirer after it was refused for ever. The lease the store may have taken
/// now goes back to it, and the line is handed over again.
#[test]
fn a_lost_answer_to_a_waiters_acquisition_does_not_lock_everyone_out() {
    let failure = failure_of(679);
    assert!(failure.is_none(), "seed 679 failed: {failure:?}");
}

/// A gateway killed while a lease was held resumed it from the store, whose copy ended later
/// than the deadline its holder was told (the store had carried the acquisition out late); a
/// renewal after that deadline was answered renewed. A resumed lease now ends no later than
/// its holder was told.
#[test]
fn a_lease_resumed_after_a_kill_ends_no_later_than_its_holder_was_told() {
    let failure = failure_of(220);
    assert!(failure.is_none(), "seed 220 failed: {failure:?}");
}

/// A station carried a lease-less change out past `max_processing_ms`; its doubt lapsed and its
/// lock-delay went into the station's ledger; the gateway restarted while the store's clock
/// stepped forward 12.2 s. The ledger's times were read less what the store's clock said had
/// passed, so the step ate the lock-delay and the next lease was granted at once; the change
/// landed inside it. A time left in the ledger is now read whole.
#[test]
fn a_step_of_the_stores_clock_does_not_eat_the_ledgers_lock_delay() {
    let failure = failure_of(142);
    assert!(failure.is_none(), "seed 142 failed: {failure:?}");
}
