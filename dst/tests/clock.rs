//! A crash restart after the store's clock stepped forward: the crashed run's link-owner lease
//! has lapsed in the store early, so the restart takes a new fence instead of taking its own
//! lease back; the hold a crash restart owes (`after_a_crash`: no grant for
//! `max_processing_ms`, for what the crashed run left at the station) is owed all the same,
//! since the state file named a token for that lease and no clean release was noted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use station_core::station::{ChangeOutcome, ChangeReport};
use station_dst::assembly::{self, GatewayStart, SETPOINT, SimGateway};
use station_dst::naming::StationNames;
use station_dst::pipe::LineControl;
use station_dst::store::SimStore;
use station_dst::trace::Trace;
use station_simulator::{Profile, Simulator, SimulatorHandle};
use tokio::time::Instant;

/// A gateway (restarted `incarnation` times) on `store`, its state file at `dir`.
async fn gateway(
    sim: &SimulatorHandle,
    store: &Arc<SimStore>,
    dir: &std::path::Path,
    incarnation: u32,
) -> SimGateway {
    assembly::start(GatewayStart {
        index: 0,
        incarnation,
        standby: false,
        store: store.view(0),
        sim: sim.clone(),
        line: LineControl::default(),
        state_file: dir.join("gw0.state"),
        names: StationNames::shared(),
    })
    .await
    .expect("the gateway starts")
}

/// Kills a gateway while a lease-less write of 7 is at the station (applied 1.5 s after it
/// was sent, past the request timeout, within `max_processing_ms`), steps the store's clock
/// forward by `step_ms`, restarts it and asks for the lease: when the lease was granted, and
/// when 7 landed.
async fn grant_and_late_write(step_ms: i64) -> (Instant, Instant) {
    let dir = std::env::temp_dir().join(format!(
        "station-dst-clock-{}-{step_ms}",
        std::process::id()
    ));
    let _ = std::fs::create_dir_all(&dir);
    let sim = Simulator::in_process(Profile::default_station());
    sim.set_ignores_close(true);
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(1)));
    let store = SimStore::new(1, rng, Trace::new(false));
    let first = gateway(&sim, &store, &dir, 0).await;
    // The link is up once a write is applied.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(
        first.write(1.0, None).await,
        Ok(Ok(ChangeReport {
            outcome: ChangeOutcome::Applied,
            ..
        }))
    ) {
        assert!(Instant::now() < deadline, "the link never came up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sim.set_processing_time(Duration::from_millis(1_500));
    let first = Arc::new(first);
    let writing = {
        let first = first.clone();
        tokio::spawn(async move { first.write(7.0, None).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.kill();
    writing.abort();
    sim.set_processing_time(Duration::from_millis(5));
    store.step_clock(step_ms);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = gateway(&sim, &store, &dir, 1).await;
    second
        .acquire(
            "next",
            Duration::from_secs(5),
            None,
            Duration::from_secs(10),
        )
        .await
        .expect("the next holder is granted the lease");
    let granted = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let landed = sim
        .write_log()
        .iter()
        .find(|record| {
            record.channel == SETPOINT && record.value == station_protocol::Value::Float(7.0)
        })
        .map(|record| record.at)
        .expect("the station applied 7");
    second.kill();
    sim.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    (granted, landed)
}

#[tokio::test(start_paused = true)]
async fn a_crash_restart_grants_the_lease_only_after_what_the_crashed_run_left_landed() {
    let (granted, landed) = grant_and_late_write(0).await;
    assert!(
        landed <= granted,
        "7 landed {:?} after the grant",
        landed - granted
    );
}

#[tokio::test(start_paused = true)]
async fn a_crash_restart_after_the_stores_clock_stepped_forward_holds_the_grant_as_well() {
    let (granted, landed) = grant_and_late_write(10_000).await;
    assert!(
        landed <= granted,
        "7 landed {:?} after the grant",
        landed - granted
    );
}
