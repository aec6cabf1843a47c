//! Two gateways that name one station differently (their control leases are different
//! records; only the station's own link-owner lease and its ledger are shared): a gateway that
//! served the station, restarted cleanly just as the other took the station's own link-owner
//! lease (before the other read the station's ledger), remembers that ledger from its earlier
//! run, but its link stands by on the station's identity. It grants no lease of its own
//! control lease then, to a client that waits in line or to one that does not: that client and
//! the other gateway's next holder would both hold a lease of one station.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use station_core::lease::link_owner::LinkOwnership;
use station_core::station::{ChangeOutcome, ChangeReport};
use station_dst::assembly::{self, GatewayStart, Refusal, SimGateway};
use station_dst::naming::StationNames;
use station_dst::pipe::LineControl;
use station_dst::store::SimStore;
use station_dst::trace::Trace;
use station_lease::AcquireRequest;
use station_simulator::{Profile, Simulator, SimulatorHandle};
use tokio::time::Instant;

/// Gateway `index` (started `incarnation` times before) naming the station as `names`, an
/// owner, on `store`, its state file in `dir`.
async fn gateway(
    sim: &SimulatorHandle,
    store: &Arc<SimStore>,
    dir: &std::path::Path,
    (index, incarnation): (usize, u32),
    names: StationNames,
) -> SimGateway {
    assembly::start(GatewayStart {
        index,
        incarnation,
        standby: false,
        store: store.view(index),
        sim: sim.clone(),
        line: LineControl::default(),
        state_file: dir.join(format!("gw{index}.state")),
        names,
    })
    .await
    .expect("the gateway starts")
}

/// Waits (simulated time) until `condition` holds, at most 20 s.
async fn until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a lease-less write through `gateway` was applied (its link serves the station).
async fn applied(gateway: &SimGateway) -> bool {
    matches!(
        gateway.write(1.0, None).await,
        Ok(Ok(ChangeReport {
            outcome: ChangeOutcome::Applied,
            ..
        }))
    )
}

#[tokio::test(start_paused = true)]
async fn a_gateway_whose_link_stands_by_grants_no_lease_of_the_station_it_served_before() {
    let dir = std::env::temp_dir().join(format!("station-dst-served-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let sim = Simulator::in_process(Profile::default_station());
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(1)));
    let store = SimStore::new(2, rng, Trace::new(false));
    let shared = StationNames::shared();
    // gw0 serves the station (its ledger is read, and which station it serves is kept), then
    // stops cleanly, and another gateway (naming the station otherwise) takes the station's
    // own link-owner lease, not yet having read its ledger.
    let gw0 = gateway(&sim, &store, &dir, (0, 0), shared.clone()).await;
    until("gw0 serves the station", async || applied(&gw0).await).await;
    let identity = gw0
        .runtime
        .lease
        .station_served()
        .expect("gw0 read the ledger");
    gw0.stop().await;
    let taken = store
        .view(1)
        .try_acquire(
            &LinkOwnership::station_name_for(&identity),
            AcquireRequest::new("gateway B".to_owned(), Duration::from_secs(600)),
        )
        .await;
    assert!(
        matches!(taken, Ok(station_lease::Acquisition::Taken(_))),
        "{taken:?}"
    );
    // gw0 again: its link meets the station and stands by, for gateway B serves it.
    let gw0 = gateway(&sim, &store, &dir, (0, 1), shared).await;
    until("gw0's link stands by", async || !gw0.serves_the_station()).await;
    assert!(
        gw0.runtime.lease.station_served().is_some(),
        "gw0 remembers the station's ledger"
    );
    let at_once = gw0
        .acquire("client0", Duration::from_secs(10), None, Duration::ZERO)
        .await;
    assert!(
        matches!(&at_once, Err(Refusal::NotLinkOwner(_))),
        "client0 asked at gw0 at once: {at_once:?}"
    );
    let waited = gw0
        .acquire(
            "client0",
            Duration::from_secs(10),
            None,
            Duration::from_secs(3),
        )
        .await;
    assert!(
        waited.is_err(),
        "client0 waited in line at gw0 and was granted its lease while gateway B serves the station: {waited:?}"
    );
    gw0.kill();
    sim.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
