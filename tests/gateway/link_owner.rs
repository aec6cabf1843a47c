//! One writer per station at every edge: a gateway on a shared lease backend sends the station
//! nothing once it cannot prove it still owns the link — however it got there (here: a store
//! it can no longer reach in time) — well before the store would let another gateway take the
//! station; and it stops itself. A second gateway that names the station otherwise (another
//! address, no `station.id` or another spelling of it) serves nothing once it met the station,
//! and a gateway restarted after a crash takes both its leases back at once.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use station_gateway::lease::LeaseToken;

const VSET1: &str = "0.4.ESH10000662.VSET1";

/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_gateway_that_cannot_renew_its_link_ownership_sends_nothing_before_another_may_take_over()
{
    let dir = std::env::temp_dir().join(format!("sg-link-owner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("lease.db");
    let ttl = Duration::from_millis(2_000);
    let sim = default_simulator().await;
    let config = config_for(&sim, |c| {
        c.lease.backend = format!("sqlite:{}?busy_timeout_ms=5000", db.display());
        c.lease.link_owner_ttl_ms = u64::try_from(ttl.as_millis()).unwrap();
    });
    let rig = rig_on(sim, config, false).await;
    let (status, body) = rig.write(VSET1, "10").await;
    assert_eq!(
        status, 200,
        "the owner writes while it owns the link: {body}"
    );

    // The store stops answering this gateway: another connection holds the file locked, so
    // every renewal waits (its busy timeout, 5 s, is longer than the lease itself).
    let locker = rusqlite::Connection::open(&db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let locked_at = Instant::now();

    // The link closes itself, naming why, before the lease could lapse in the store.
    link_state(
        &rig.gateway,
        "the link to close for want of ownership",
        |info| {
            !info.connected
                && info
                    .last_error
                    .as_deref()
                    .is_some_and(|why| why.contains("cannot prove it still owns"))
        },
    )
    .await;
    let closed_after = locked_at.elapsed();
    assert!(
        closed_after < ttl,
        "the link stopped sending {closed_after:?} after the store stopped answering: not before the lease ({ttl:?}) could lapse"
    );

    // A lease-less write now: refused, 503 naming why, and nothing reaches the station.
    rig.sim.clear_write_log();
    let (status, body) = rig
        .post(
            "resources/value/set",
            json!({ "Name": VSET1, "Value": "20" }),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|why| why.contains("owns the station's link")),
        "{body}"
    );
    // The gateway stops by itself once its gate closed and the store still did not answer.
    within(
        BOUND,
        "the gateway to stop itself",
        rig.gateway.gateway.shutdown.cancelled(),
    )
    .await;
    assert!(
        rig.sim.write_log().is_empty(),
        "nothing was sent after the gateway lost its proof of ownership: {:?}",
        rig.sim.write_log()
    );
    drop(locker);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_link_owner_ttl_that_leaves_no_time_to_renew_is_refused_naming_the_key() {
    let sim = default_simulator().await;
    let config = config_for(&sim, |c| c.lease.link_owner_ttl_ms = 300);
    let listeners = station_gateway::Listeners {
        http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        legacy: None,
    };
    let refused = station_gateway::start(listeners, config).await.err();
    let why = refused.map(|error| error.to_string()).unwrap_or_default();
    assert!(why.contains("lease.link_owner_ttl_ms"), "{why}");
}

/// A gateway on `sim` with the link-owner lease in `db` and, with `state`, its state file.
fn shared_config(
    sim: &station_simulator::SimulatorHandle,
    db: &std::path::Path,
    state: Option<&std::path::Path>,
) -> station_gateway::Config {
    config_for(sim, |c| {
        c.lease.backend = format!("sqlite:{}", db.display());
        if let Some(state) = state {
            c.lease.link_owner_state = state.display().to_string();
        }
    })
}

async fn try_start(
    config: station_gateway::Config,
) -> Result<station_gateway::GatewayHandle, String> {
    let listeners = station_gateway::Listeners {
        http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        legacy: None,
    };
    station_gateway::start(listeners, config)
        .await
        .map_err(|error| error.to_string())
}

#[tokio::test]
async fn a_gateway_restarted_after_a_crash_takes_its_own_link_ownership_back_at_once() {
    let dir = std::env::temp_dir().join(format!("sg-link-owner-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (db, state) = (dir.join("lease.db"), dir.join("gateway-1.state"));
    let sim = default_simulator().await;

    // Without a state file, a crashed gateway's lease keeps its restart out until it lapses.
    let crashed = try_start(shared_config(&sim, &db, None)).await.unwrap();
    drop(crashed); // every task aborted, nothing released: as after kill -9
    let elsewhere = try_start(shared_config(&sim, &dir.join("other.db"), None)).await;
    assert!(
        elsewhere.is_ok(),
        "another backend is another owner: {:?}",
        elsewhere.err()
    );
    drop(elsewhere);
    let refused = try_start(shared_config(&sim, &db, None)).await.err();
    assert!(
        refused
            .as_deref()
            .is_some_and(|why| why.contains("another gateway owns this station")),
        "{refused:?}"
    );

    // With one, the restart takes its own lease back at once, and a second process is refused.
    let db = dir.join("lease-2.db");
    let first = try_start(shared_config(&sim, &db, Some(&state)))
        .await
        .unwrap();
    drop(first);
    // (A dying process's lock goes with it; an aborted task's, once the runtime drops it.)
    until(BOUND, "the crashed gateway's tasks to be gone", || {
        station_gateway::lease::owner_state::OwnerState::open(&state).is_ok()
    })
    .await;
    let restarted_at = Instant::now();
    let restarted = try_start(shared_config(&sim, &db, Some(&state)))
        .await
        .expect("the restarted gateway takes its own link-owner lease back");
    assert!(
        restarted_at.elapsed() < Duration::from_secs(2),
        "it did not wait for the lease to lapse: {:?}",
        restarted_at.elapsed()
    );
    within(
        BOUND,
        "the restarted gateway to connect",
        restarted.connected(),
    )
    .await;
    let twin = try_start(shared_config(&sim, &db, Some(&state)))
        .await
        .err();
    assert!(
        twin.as_deref()
            .is_some_and(|why| why.contains("link_owner_state")),
        "a second process with the same state file is refused naming it: {twin:?}"
    );
    restarted.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_second_gateway_reaching_the_same_station_by_another_address_never_serves_it_until_the_first_is_gone()
 {
    let dir = std::env::temp_dir().join(format!("sg-link-owner-spelling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("lease.db");
    let sim = default_simulator().await;
    let port = sim.local_addr().port();
    let by_address = shared_config(&sim, &db, None);
    let mut by_name = shared_config(&sim, &db, None);
    by_name.station.url = format!("tcp://localhost:{port}");
    by_name.station.reconnect_max_ms = 200;
    let first = try_start(by_address).await.unwrap();
    within(BOUND, "the first gateway to connect", first.connected()).await;

    // The second starts (its address names another link-owner lease), meets the station, and
    // is refused by the station's own lease: it sends nothing past HELLO.
    let second = try_start(by_name).await.unwrap();
    link_state(
        &second,
        "the second gateway to be refused the station",
        |info| {
            info.last_error
                .as_deref()
                .is_some_and(|why| why.contains("another gateway owns the station"))
        },
    )
    .await;
    assert!(!second.link().info().connected);
    rig_write_refused(&second, &sim).await;
    // Standing by, it does not knock again: no new connection (not even for a HELLO) in the
    // time its 200 ms back-off would have tried several.
    let accepted = sim.connections_accepted();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        sim.connections_accepted(),
        accepted,
        "a gateway standing by connected to another gateway's station"
    );

    // Once the first is gone, the second takes the station over.
    first.stop().await;
    within(
        BOUND,
        "the second gateway to take the station over",
        second.connected(),
    )
    .await;
    second.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lease-less write through `gateway` is refused with 503 and reaches nobody.
async fn rig_write_refused(
    gateway: &station_gateway::GatewayHandle,
    sim: &station_simulator::SimulatorHandle,
) {
    sim.clear_write_log();
    let response = reqwest::Client::new()
        .post(format!("{}/api/resources/value/set", gateway.base_url()))
        .json(&json!({ "Name": VSET1, "Value": "30" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    assert!(sim.write_log().is_empty(), "{:?}", sim.write_log());
}

/// A gateway on `db` with a short link-owner lease and a lock-delay longer than it.
fn lock_delay_config(
    sim: &station_simulator::SimulatorHandle,
    db: &std::path::Path,
) -> station_gateway::Config {
    let mut config = shared_config(sim, db, None);
    config.lease.link_owner_ttl_ms = 2_000;
    config.lease.link_owner_lock_delay_ms = Some(2_500);
    config.station.request_timeout_ms = 1_000;
    config.station.max_processing_ms = Some(1_000);
    config
}

#[tokio::test]
async fn a_gateway_that_starts_on_a_link_owner_lease_that_lapsed_waits_the_lock_delay_and_one_after_a_clean_stop_does_not()
 {
    let dir = std::env::temp_dir().join(format!("sg-link-owner-delay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("lease.db");
    let sim = default_simulator().await;
    let lock_delay = Duration::from_millis(2_500);

    // After a clean stop (the lease released, with its note), the next gateway connects at once.
    let first = try_start(lock_delay_config(&sim, &db)).await.unwrap();
    within(BOUND, "the first gateway to connect", first.connected()).await;
    first.stop().await;
    let started = Instant::now();
    let after_stop = try_start(lock_delay_config(&sim, &db)).await.unwrap();
    within(BOUND, "the next gateway to connect", after_stop.connected()).await;
    assert!(
        started.elapsed() < lock_delay,
        "after a clean stop the next owner waited {:?}: a lock-delay for a lease that was released",
        started.elapsed()
    );

    // After a crash (nothing released), the one that takes the lapsed lease waits the
    // lock-delay before it touches the station.
    drop(after_stop);
    let taken = loop {
        match try_start(lock_delay_config(&sim, &db)).await {
            Ok(gateway) => break gateway,
            Err(why) => assert!(why.contains("another gateway owns this station"), "{why}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let started = Instant::now();
    let accepted = sim.connections_accepted();
    within(BOUND, "the taker to connect", taken.connected()).await;
    assert!(
        started.elapsed() >= lock_delay - Duration::from_millis(100),
        "the taker of a lapsed lease connected {:?} after it took it: before the lock-delay ({lock_delay:?})",
        started.elapsed()
    );
    assert_eq!(
        sim.connections_accepted(),
        accepted + 1,
        "one connection, after the lock-delay"
    );
    taken.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One test per shared backend (memory cannot have two gateways) for `$scenario(&url)`.
macro_rules! on_shared_backends {
    ($scenario:ident: $($test:ident => $kind:literal),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                let backend = common::backends::Backend::named($kind).await;
                $scenario(&backend.url).await
            }
        )+
    };
}

/// Whether `why` says another gateway owns the station and names `owner_url`, where it serves.
fn names_the_owner(why: &str, owner_url: &str) -> bool {
    why.contains("another gateway owns") && why.contains(owner_url)
}

/// One owner whatever `station.id` says.
/// The owner names the station by `station.id`; a second gateway on the same
/// backend and station URL, not a standby, names it otherwise: without `station.id` (its
/// control lease by `lease.name`), or with the owner's id in another case and spacing. Each
/// either refuses to start or, once it met the station, serves nothing — a lease-less write
/// through it is refused and nothing reaches the station — and each names the owner.
async fn a_second_gateway_sends_the_station_nothing_whatever_its_station_id_says(backend: &str) {
    let sim = default_simulator().await;
    let id = format!("HV Bench {}", &LeaseToken::random().as_str()[..8]);
    let owner = start_gateway(config_for(&sim, |c| {
        c.lease.backend = backend.to_owned();
        c.station.id = id.clone();
    }))
    .await;
    let owner_url = owner.base_url();
    sim.clear_write_log();
    let without_id = config_for(&sim, |c| {
        c.lease.backend = backend.to_owned();
        c.lease.name = common::backends::own_lease_name("second-owner");
        c.station.reconnect_max_ms = 200;
    });
    let other_spelling = format!("  {}  ", id.to_lowercase().replace(' ', "   "));
    let with_other_spelling = config_for(&sim, |c| {
        c.lease.backend = backend.to_owned();
        c.station.id = other_spelling.clone();
        c.station.reconnect_max_ms = 200;
    });
    for (what, config) in [
        ("without station.id".to_owned(), without_id),
        (
            format!("with station.id {other_spelling:?}"),
            with_other_spelling,
        ),
    ] {
        let second = match try_start(config).await {
            Err(why) => {
                assert!(names_the_owner(&why, &owner_url), "{what}: {why}");
                continue;
            }
            Ok(second) => second,
        };
        link_state(
            &second,
            &format!("the second gateway ({what}) to be refused the station, naming its owner"),
            |info| {
                info.last_error
                    .as_deref()
                    .is_some_and(|why| names_the_owner(why, &owner_url))
            },
        )
        .await;
        assert!(!second.link().info().connected, "{what}");
        let response = reqwest::Client::new()
            .post(format!("{}/api/resources/value/set", second.base_url()))
            .json(&json!({ "Name": VSET1, "Value": "30" }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        assert_eq!(status, 503, "{what}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|why| names_the_owner(why, &owner_url)),
            "{what}: the refusal names the owner: {body}"
        );
        second.stop().await;
    }
    assert!(
        sim.write_log().is_empty(),
        "a change reached the station through a second gateway: {:?}",
        sim.write_log()
    );
    owner.stop().await;
}

on_shared_backends!(a_second_gateway_sends_the_station_nothing_whatever_its_station_id_says:
    a_second_gateway_sends_the_station_nothing_whatever_its_station_id_says_on_sqlite => "sqlite",
    a_second_gateway_sends_the_station_nothing_whatever_its_station_id_says_on_postgres => "postgres",
    a_second_gateway_sends_the_station_nothing_whatever_its_station_id_says_on_redis => "redis",
);

/// How soon a gateway restarted after a crash must serve again, at the
/// default link-owner TTL (10 s).
const READY_AFTER_CRASH: Duration = Duration::from_secs(3);

/// Polls the gateway at `base_url` until `/readyz` answers 200: how long that took, or after
/// `limit` its last answer (which says why it is not ready).
async fn ready_within(base_url: &str, limit: Duration) -> Result<Duration, String> {
    let http = reqwest::Client::new();
    let since = Instant::now();
    let mut last = String::from("no answer");
    while since.elapsed() < limit {
        let asked = http
            .get(format!("{base_url}/readyz"))
            .timeout(Duration::from_millis(300))
            .send()
            .await;
        match asked {
            Ok(response) if response.status() == 200 => return Ok(since.elapsed()),
            Ok(response) => {
                last = format!(
                    "{} {}",
                    response.status(),
                    response.text().await.unwrap_or_default()
                )
            }
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "not ready within {limit:?}; /readyz answered last: {last}"
    ))
}

/// A config on `backend` with the state file `state`, the control lease of its own name and
/// the default link-owner TTL.
fn crash_config(
    sim: &station_simulator::SimulatorHandle,
    backend: &str,
    state: &std::path::Path,
) -> station_gateway::Config {
    let config = config_for(sim, |c| {
        c.lease.backend = backend.to_owned();
        c.lease.name = common::backends::own_lease_name("crash-restart");
        c.lease.link_owner_state = state.display().to_string();
    });
    assert_eq!(config.lease.link_owner_ttl_ms, 10_000, "the default TTL");
    config
}

/// A scratch directory of a test's own.
fn scratch(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sg-{test}-{}",
        &LeaseToken::random().as_str()[..12]
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A crash restart takes both leases back.
/// A gateway that met the station holds two leases: the link-owner lease
/// and the station's own. Restarted after a crash (every task aborted, nothing released) with
/// its state file, it takes both back at once and serves within 3 s, not when the station's
/// lapses (10 s).
async fn a_gateway_restarted_after_a_crash_takes_both_its_leases_back_at_once(backend: &str) {
    let dir = scratch("crash-both-leases");
    let state = dir.join("gateway.state");
    let sim = default_simulator().await;
    let config = crash_config(&sim, backend, &state);
    let crashed = start_gateway(config.clone()).await;
    drop(crashed);
    until(BOUND, "the crashed gateway's tasks to be gone", || {
        station_gateway::lease::owner_state::OwnerState::open(&state).is_ok()
    })
    .await;
    let restarted_at = Instant::now();
    let restarted = try_start(config)
        .await
        .expect("the restarted gateway takes its own link-owner lease back");
    if let Err(why) = ready_within(&restarted.base_url(), READY_AFTER_CRASH).await {
        panic!("the restarted gateway (both its leases taken back, not waited out): {why}");
    }
    println!(
        "{backend}: ready {:?} after the restart",
        restarted_at.elapsed()
    );
    restarted.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

on_shared_backends!(a_gateway_restarted_after_a_crash_takes_both_its_leases_back_at_once:
    a_gateway_restarted_after_a_crash_takes_both_its_leases_back_at_once_on_sqlite => "sqlite",
    a_gateway_restarted_after_a_crash_takes_both_its_leases_back_at_once_on_postgres => "postgres",
    a_gateway_restarted_after_a_crash_takes_both_its_leases_back_at_once_on_redis => "redis",
);

/// A crash restart takes both leases back.
/// Measured as operators see it: the gateway process killed with `kill -9`
/// and started again with the same config and state file is ready within 3 s of its start at
/// the default TTL.
async fn a_gateway_process_killed_with_sigkill_is_ready_again_within_3_s(backend: &str) {
    let dir = scratch("sigkill-restart");
    let state = dir.join("gateway.state");
    let sim = default_simulator().await;
    let config = crash_config(&sim, backend, &state);
    let mut first = common::process::GatewayProcess::start(&config).unwrap();
    if let Err(why) = ready_within(&first.base_url, BOUND).await {
        panic!(
            "the first gateway process: {why}; its log:\n{}",
            first.log_tail()
        );
    }
    first.signal("-KILL").unwrap();
    let killed_at = Instant::now();
    first.ended_within(BOUND).await.unwrap();
    let restarted_at = Instant::now();
    let restarted = common::process::GatewayProcess::start(&config).unwrap();
    if let Err(why) = ready_within(&restarted.base_url, READY_AFTER_CRASH).await {
        panic!("the gateway process restarted after kill -9: {why}");
    }
    println!(
        "{backend}: ready {:?} after kill -9 ({:?} after the restart)",
        killed_at.elapsed(),
        restarted_at.elapsed()
    );
    drop(restarted);
    drop(first);
    let _ = std::fs::remove_dir_all(&dir);
}

on_shared_backends!(a_gateway_process_killed_with_sigkill_is_ready_again_within_3_s:
    a_gateway_process_killed_with_sigkill_is_ready_again_within_3_s_on_sqlite => "sqlite",
    a_gateway_process_killed_with_sigkill_is_ready_again_within_3_s_on_postgres => "postgres",
    a_gateway_process_killed_with_sigkill_is_ready_again_within_3_s_on_redis => "redis",
);
