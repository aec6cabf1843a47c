//! How a control lease ends, against a simulated station: the safe state after a lease that ran
//! out is a duty kept until the station confirms it (through a stalled station, a station that
//! refuses it, and a gateway restart on a persistent backend), and nobody changes the station or
//! takes the lease while it is pending.

use crate::common;

use std::time::Duration;

use common::{config_for, rig, start_gateway};
use serde_json::{Value as Json, json};
use station_gateway::config::SafeWrite;
use station_gateway::lease::LeaseView;
use station_protocol::Value;
use station_simulator::Simulator;
use tokio::sync::broadcast;

const ON1: &str = "0.4.ESH10000662.ON1";
const MON_3V3: &str = "0.1.ESH10000158.MON_3V3";
/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(20);

fn safe_state(channel: &str, value: &str) -> Vec<SafeWrite> {
    vec![SafeWrite {
        channel: channel.into(),
        value: value.into(),
    }]
}

/// Waits for the first lease event that `wanted` accepts.
async fn lease_event(
    events: &mut broadcast::Receiver<LeaseView>,
    what: &str,
    wanted: impl Fn(&LeaseView) -> bool,
) -> LeaseView {
    tokio::time::timeout(BOUND, async {
        loop {
            match events.recv().await {
                Ok(view) if wanted(&view) => return view,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("lease events closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no lease event {what} within {BOUND:?}"))
}

fn pending(view: &LeaseView) -> bool {
    view.safe_state
        .as_ref()
        .is_some_and(|s| s.pending && s.tries > 0)
}

fn free(view: &LeaseView) -> bool {
    !view.held && view.safe_state.is_none()
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    lease_id: Option<&str>,
    body: Option<Json>,
) -> (u16, Json) {
    let mut request = http.request(method, url);
    if let Some(id) = lease_id {
        request = request.header("X-Lease-Id", id);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the gateway did not answer");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Json::Null))
}

fn safe_writes_of(log: &[station_simulator::WriteRecord], channel: &str, value: &Value) -> usize {
    log.iter()
        .filter(|w| w.channel == channel && &w.value == value)
        .count()
}

#[tokio::test]
async fn a_safe_state_the_stalled_station_missed_is_retried_until_it_lands_and_nothing_changes_meanwhile()
 {
    let rig = rig(|config| {
        config.lease.safe_state = safe_state(ON1, "False");
        config.station.request_timeout_ms = 200;
    })
    .await;
    let base = rig.gateway.base_url();
    let mut events = rig.gateway.gateway.lease_events.subscribe();
    let (status, held) = call(
        &rig.http,
        reqwest::Method::POST,
        format!("{base}/api/lease"),
        None,
        Some(json!({"Owner": "TAT station 3", "TtlMs": 1000})),
    )
    .await;
    assert_eq!(status, 200, "{held}");
    let id = held["leaseId"].as_str().unwrap().to_owned();
    let (status, body) = call(
        &rig.http,
        reqwest::Method::POST,
        format!("{base}/api/resources/value/set"),
        Some(&id),
        Some(json!({"Name": ON1, "Value": "True"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    rig.sim.set_stall(true);
    let view = lease_event(&mut events, "with the safe state pending", pending).await;
    assert_eq!(view.safe_state.as_ref().unwrap().after, "TAT station 3");
    // While it is pending: not ready, no new lease, no change by anyone.
    let (status, body) = call(
        &rig.http,
        reqwest::Method::GET,
        format!("{base}/readyz"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("safe state"),
        "{body}"
    );
    let (status, body) = call(
        &rig.http,
        reqwest::Method::POST,
        format!("{base}/api/lease"),
        None,
        Some(json!({"Owner": "TAT station 4", "TtlMs": 30000})),
    )
    .await;
    assert_eq!(
        status, 503,
        "a lease was granted while the safe state was pending: {body}"
    );
    let (status, body) = call(
        &rig.http,
        reqwest::Method::POST,
        format!("{base}/api/resources/value/set"),
        None,
        Some(json!({"Name": ON1, "Value": "True"})),
    )
    .await;
    assert_eq!(
        status, 503,
        "a change went through while the safe state was pending: {body}"
    );
    let metrics = rig
        .http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("station_gateway_lease_safe_state_pending 1"),
        "{metrics}"
    );

    rig.sim.set_stall(false);
    lease_event(&mut events, "free after the safe state landed", free).await;
    let log = rig.sim.write_log();
    assert_eq!(
        log.last().map(|w| (w.channel.as_str(), &w.value)),
        Some((ON1, &Value::Bool(false))),
        "the last write the station applied is not the safe state: {log:?}"
    );
    let (status, _) = call(
        &rig.http,
        reqwest::Method::POST,
        format!("{base}/api/lease"),
        None,
        Some(json!({"Owner": "TAT station 4", "TtlMs": 30000})),
    )
    .await;
    assert_eq!(
        status, 200,
        "the lease stayed unavailable after the safe state landed"
    );
}

#[tokio::test]
async fn a_safe_state_the_station_refuses_stays_pending_and_says_why() {
    // MON_3V3 is a monitor: the station refuses writes to it, every time.
    let rig = rig(|config| config.lease.safe_state = safe_state(MON_3V3, "0")).await;
    let lease = rig.gateway.gateway.lease.clone();
    let mut events = rig.gateway.gateway.lease_events.subscribe();
    lease
        .acquire(
            "TAT station 3".into(),
            Duration::from_millis(1000),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap();
    let first = lease_event(&mut events, "with the safe state pending", pending).await;
    let second = lease_event(&mut events, "of a second try", |view| {
        view.safe_state.as_ref().is_some_and(|s| s.tries >= 2)
    })
    .await;
    let why = second.safe_state.unwrap().last_error.unwrap();
    assert!(why.contains(MON_3V3), "{why}");
    assert!(first.safe_state.unwrap().tries < 2);
    assert!(lease.safe_state_pending().is_some());
    let refusal = lease
        .acquire(
            "TAT station 4".into(),
            Duration::from_secs(30),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap_err();
    assert!(refusal.to_string().contains("safe state"), "{refusal}");
}

#[tokio::test]
async fn a_lease_that_lapsed_while_the_gateway_was_down_gets_its_safe_state_at_the_next_start() {
    let sim = Simulator::start(common::default_profile(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "sg-lease-end-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let backend = format!("sqlite:{}", dir.join("lease.db").display());
    let config = config_for(&sim, |config| {
        config.lease.backend = backend.clone();
        config.lease.safe_state = safe_state(ON1, "False");
    });
    let first = start_gateway(config.clone()).await;
    let lease = first.gateway.lease.clone();
    let held = lease
        .acquire(
            "TAT station 3".into(),
            Duration::from_millis(1000),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap();
    let admitted = lease
        .admit(station_gateway::lease::Access::Change, Some(&held.lease_id))
        .unwrap();
    first
        .link()
        .write(vec![(ON1.into(), Value::Bool(true))], admitted.guard)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    drop(lease);
    first.stop().await;
    sim.clear_write_log();
    // The lease runs out while no gateway is there to see it.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let second = start_gateway(config).await;
    let mut events = second.gateway.lease_events.subscribe();
    if second.gateway.lease.safe_state_pending().is_some() {
        lease_event(&mut events, "free after the safe state landed", free).await;
    }
    assert_eq!(
        safe_writes_of(&sim.write_log(), ON1, &Value::Bool(false)),
        1,
        "the safe state owed for the lapsed lease was not applied once after the restart"
    );
    second.stop().await;
    // Owed once: a third start applies nothing.
    sim.clear_write_log();
    let third = start_gateway(config_for(&sim, |config| {
        config.lease.backend = backend.clone();
        config.lease.safe_state = safe_state(ON1, "False");
    }))
    .await;
    assert!(third.gateway.lease.safe_state_pending().is_none());
    assert_eq!(
        safe_writes_of(&sim.write_log(), ON1, &Value::Bool(false)),
        0
    );
    third.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_second_gateway_on_the_same_station_and_backend_refuses_to_start() {
    let sim = Simulator::start(common::default_profile(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "sg-link-owner-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let backend = format!("sqlite:{}", dir.join("lease.db").display());
    let config = config_for(&sim, |config| config.lease.backend = backend.clone());
    let first = start_gateway(config.clone()).await;
    let connections_before = sim.connections_accepted();

    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = station_gateway::start(
        station_gateway::Listeners { http, legacy: None },
        config.clone(),
    )
    .await
    .err()
    .expect("a second gateway started on a station another gateway owns");
    let message = refused.to_string();
    assert!(
        message.contains("another gateway owns this station")
            && message.contains(&format!("at {}", first.base_url())),
        "{message}"
    );
    assert_eq!(
        sim.connections_accepted(),
        connections_before,
        "the refused gateway connected to the station"
    );

    // Once the owner stops (and releases it), another gateway may serve the station.
    first.stop().await;
    let next = start_gateway(config).await;
    next.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

const VSET1: &str = "0.4.ESH10000662.VSET1";

/// The default station, with every request touching VSET1 taking `latency` more.
async fn station_with_slow_vset1(latency: Duration) -> station_simulator::SimulatorHandle {
    common::station_with_slow_channels(|name| name == VSET1, latency, |_| {}).await
}

/// The order in which the station applied writes to ON1.
fn on1_writes(sim: &station_simulator::SimulatorHandle) -> Vec<Value> {
    sim.write_log()
        .into_iter()
        .filter(|w| w.channel == ON1)
        .map(|w| w.value)
        .collect()
}

#[tokio::test]
async fn a_change_still_at_the_station_when_the_lease_runs_out_lands_before_the_safe_state() {
    let sim = station_with_slow_vset1(Duration::from_millis(800)).await;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.lease.safe_state = safe_state(ON1, "False");
    }))
    .await;
    let lease = gateway.gateway.lease.clone();
    let mut events = gateway.gateway.lease_events.subscribe();
    let held = lease
        .acquire(
            "TAT station 3".into(),
            Duration::from_millis(300),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap();
    let guard = lease
        .admit(station_gateway::lease::Access::Change, Some(&held.lease_id))
        .unwrap()
        .guard;
    // Sent at once, applied by the station only after the lease has run out.
    let results = gateway
        .link()
        .write(
            vec![
                (VSET1.into(), Value::Float(100.0)),
                (ON1.into(), Value::Bool(true)),
            ],
            guard,
        )
        .await
        .expect("the holder's write was sent and answered");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    lease_event(&mut events, "free after the lease ran out", |view| {
        free(view) && !view.held
    })
    .await;
    assert_eq!(
        on1_writes(&sim),
        [Value::Bool(true), Value::Bool(false)],
        "the safe state did not come after the ended lease's change that was still at the station"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_change_admitted_while_nobody_held_the_lease_lands_before_the_next_holders_first_change()
{
    let sim = station_with_slow_vset1(Duration::from_millis(800)).await;
    let gateway = start_gateway(config_for(&sim, |_| {})).await;
    let lease = gateway.gateway.lease.clone();
    let guard = lease
        .admit(station_gateway::lease::Access::Change, None)
        .unwrap()
        .guard;
    let link = gateway.link().clone();
    let stats = gateway.link().stats().clone();
    let frames_before = station_gateway::link::LinkStats::get(&stats.frames_sent);
    let free_write = tokio::spawn(async move {
        link.write(
            vec![
                (VSET1.into(), Value::Float(100.0)),
                (ON1.into(), Value::Bool(true)),
            ],
            guard,
        )
        .await
    });
    // The free write is on the wire once the station has it: wait for the link to have sent it.
    tokio::time::timeout(BOUND, async {
        while station_gateway::link::LinkStats::get(&stats.frames_sent) == frames_before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the free write was never sent");
    let held = lease
        .acquire(
            "TAT station 4".into(),
            Duration::from_secs(30),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap();
    let guard = lease
        .admit(station_gateway::lease::Access::Change, Some(&held.lease_id))
        .unwrap()
        .guard;
    gateway
        .link()
        .write(vec![(ON1.into(), Value::Bool(false))], guard)
        .await
        .unwrap()
        .remove(0)
        .unwrap();
    free_write.await.unwrap().unwrap();
    assert_eq!(
        on1_writes(&sim),
        [Value::Bool(true), Value::Bool(false)],
        "the new holder's first change overtook a change admitted before its lease"
    );
    gateway.stop().await;
}
