//! A gateway configured as a standby that has taken its station over is killed (-9) while its
//! lease holder's change is at a station that carries it out anyway, and is started again with
//! its link-owner state file: it takes its own link-owner lease back through the standby's
//! path, counts what the crashed run had at the station as in doubt, and so grants the next
//! holder the lease only once that change can no longer land inside it.

use crate::common;

use std::time::{Duration, Instant};

use common::backends::Backend;
use common::process::GatewayProcess;
use common::{until, within};
use serde_json::{Value as Json, json};
use station_gateway::config::HaMode;
use station_gateway::lease::LeaseToken;
use station_protocol::Value;

use crate::duties::{BOUND, Line, ON1, Station, VSET1};

/// How long the station takes over a write touching VSET1: well past the restart and the next
/// holder's grant when nothing holds that grant back, within the longest processing.
const SLOW_WRITE: Duration = Duration::from_millis(2500);
/// `station.max_processing_ms` in this test.
const MAX_PROCESSING_MS: u64 = 3000;

/// Waits until the gateway process at `base` answers `/readyz` 200 (a standby does once it
/// has taken the station over).
async fn ready(http: &reqwest::Client, base: &str) {
    within(
        BOUND,
        "the gateway process to take the station over",
        async {
            while !http
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
}

/// Takes the lease at `base` for `owner`, asking again until it is granted; its id.
async fn lease_at(http: &reqwest::Client, base: &str, owner: &str) -> String {
    within(BOUND, "the lease to be granted", async {
        loop {
            let asked = http
                .post(format!("{base}/api/lease"))
                .json(&json!({ "Owner": owner, "TtlMs": 60000 }))
                .send()
                .await;
            if let Ok(asked) = asked
                && asked.status() == 200
            {
                let answer: Json = asked.json().await.unwrap();
                return answer["leaseId"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
}

/// The standby's crash restart on the lease backend `kind`: A's `VSET1`+`ON1=True` is at the
/// station when the process is killed; after the restart A releases and B takes the lease at
/// once and switches ON1 off. A's late `True` must land before B's `False`, and B's grant must
/// come only once it has landed.
async fn a_standby_killed_with_a_change_at_the_station_holds_the_next_grant_at_its_restart(
    kind: &str,
) {
    let backend = Backend::named(kind).await;
    let station = Station::start(Line::Tcp, SLOW_WRITE).await;
    let state = std::env::temp_dir().join(format!(
        "gateway-standby-crash-{}.state",
        &LeaseToken::random().as_str()[..12]
    ));
    let config = station.config(|config| {
        config.station.id = format!("standby-crash-{}", &LeaseToken::random().as_str()[..8]);
        config.station.max_processing_ms = Some(MAX_PROCESSING_MS);
        config.lease.backend = backend.url.clone();
        config.lease.link_owner_state = state.display().to_string();
        config.ha.mode = HaMode::Standby;
    });
    let http = reqwest::Client::new();

    // Nobody owns the station: the standby takes it over, and A takes the lease there.
    let first = GatewayProcess::start(&config).unwrap();
    ready(&http, &first.base_url).await;
    let a = lease_at(&http, &first.base_url, "TAT station 3").await;
    let batch = http
        .post(format!("{}/api/resources/values/set", first.base_url))
        .header("X-Lease-Id", &a)
        .json(&json!({ "Resources": { VSET1: "100", ON1: "True" } }))
        .send();
    let writing = tokio::spawn(batch);
    until(BOUND, "A's change to be at the station", || {
        station.sim.requests_in_progress() > 0
    })
    .await;
    let sent = Instant::now();
    first.signal("-KILL").unwrap();
    drop(first);
    let _ = writing.await;

    // Started again with its state file: its own link-owner lease taken back, not waited for.
    let second = GatewayProcess::start(&config).unwrap();
    let base = second.base_url.clone();
    ready(&http, &base).await;
    let released = http
        .delete(format!("{base}/api/lease/{a}"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(released, 200, "A releases through the restarted gateway");
    let b = lease_at(&http, &base, "TAT station 4").await;
    let granted = sent.elapsed();
    let landed_before_grant = station.on1_writes().contains(&Value::Bool(true));
    let answer = within(BOUND, "B's write", async {
        loop {
            let response = http
                .post(format!("{base}/api/resources/value/set"))
                .header("X-Lease-Id", &b)
                .json(&json!({ "Name": ON1, "Value": "False" }))
                .send()
                .await
                .unwrap();
            if response.status() != 503 {
                return response.status();
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    assert_eq!(answer, 200, "B's write");
    until(BOUND, "the station to finish every request", || {
        station.sim.requests_in_progress() == 0 && station.on1_writes().len() >= 2
    })
    .await;
    let _ = std::fs::remove_file(&state);
    assert_eq!(
        station.on1_writes(),
        [Value::Bool(true), Value::Bool(false)],
        "the crashed standby's change landed inside B's lease, granted {granted:?} after it was sent (the station carries it out after {SLOW_WRITE:?}); the restarted gateway's log:\n{}",
        second.log_tail()
    );
    assert!(
        landed_before_grant,
        "B was granted the lease {granted:?} after A's change was sent, before it landed ({SLOW_WRITE:?})"
    );
}

#[tokio::test]
async fn a_standby_killed_with_a_change_at_the_station_holds_the_next_grant_at_its_restart_on_sqlite()
 {
    a_standby_killed_with_a_change_at_the_station_holds_the_next_grant_at_its_restart("sqlite")
        .await;
}

#[tokio::test]
async fn a_standby_killed_with_a_change_at_the_station_holds_the_next_grant_at_its_restart_on_redis()
 {
    a_standby_killed_with_a_change_at_the_station_holds_the_next_grant_at_its_restart("redis")
        .await;
}

#[tokio::test]
async fn a_standby_killed_with_a_change_at_the_station_holds_the_next_grant_at_its_restart_on_postgres()
 {
    a_standby_killed_with_a_change_at_the_station_holds_the_next_grant_at_its_restart("postgres")
        .await;
}
