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
