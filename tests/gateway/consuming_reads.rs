//! Reads that consume data are changes, against a simulated station: a
//! consuming read queued before a lease is granted is refused at the link and the grant waits
//! for one already at the station; a non-holder's `MaxAgeMs` read during a lease never reaches
//! the hardware; the `read` role never consumes data.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value as Json, json};
use station_gateway::config::{ApiKey, Role};
use station_gateway::lease::Access;
use station_gateway::link::LinkStats;
use station_gateway::station::{ItemError, ReadPolicy};

const UART01: &str = "0.ESH10000023.UART01";
const I2C09: &str = "0.ESH10000023.I2C09";
/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(20);

/// The default station answering one request at a time, with every read of UART01 taking
/// `latency`: a second request waits in the gateway's queue while a read of UART01 is out.
async fn one_at_a_time_with_slow_uart(latency: Duration) -> station_simulator::SimulatorHandle {
    common::station_with_slow_channels(
        |name| name == UART01,
        latency,
        |profile| profile.station.tcp_window = 1,
    )
    .await
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|name| (*name).to_owned()).collect()
}

#[tokio::test]
async fn a_consuming_read_queued_before_a_grant_is_never_sent_after_it_and_the_grant_waits_for_one_sent()
 {
    let sim = one_at_a_time_with_slow_uart(Duration::from_millis(500)).await;
    let gateway = start_gateway(config_for(&sim, |_| {})).await;
    let (lease, station, link) = (
        gateway.gateway.lease.clone(),
        gateway.gateway.station.clone(),
        gateway.link().clone(),
    );
    // Nobody holds the lease: a non-holder's forced reads of both bus channels are admitted.
    let admitted = lease.admit(Access::ForcedRead, None).unwrap();
    let frames_before = LinkStats::get(&link.stats().frames_sent);
    let first_answered = Arc::new(AtomicBool::new(false));
    let first = tokio::spawn({
        let (station, admitted, answered) =
            (station.clone(), admitted.clone(), first_answered.clone());
        async move {
            let policy = ReadPolicy::hardware(None, admitted.guard.as_ref());
            let readings = station.read(&names(&[UART01]), policy).await;
            answered.store(true, Ordering::SeqCst);
            readings
        }
    });
    until(BOUND, "the first read to be on the wire", || {
        LinkStats::get(&link.stats().frames_sent) > frames_before
    })
    .await;
    // The second is handed to the link now, and waits in its queue: the station's one slot
    // is taken by the first for another ~500 ms.
    let mut second = Box::pin({
        let (station, admitted) = (station.clone(), admitted.clone());
        async move {
            let policy = ReadPolicy::hardware(None, admitted.guard.as_ref());
            station.read(&names(&[I2C09]), policy).await
        }
    });
    assert!(futures::poll!(&mut second).is_pending());
    until(BOUND, "the link to take the second read", || {
        link.queue_depth() == 0
    })
    .await;
    let second = tokio::spawn(second);

    let held = lease
        .acquire(
            "TAT station 4".into(),
            Duration::from_secs(30),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap();
    assert!(
        first_answered.load(Ordering::SeqCst),
        "the lease was granted while a consuming read admitted before it was still at the station"
    );
    assert!(first.await.unwrap().unwrap()[0].is_ok());
    let refused = second.await.unwrap().unwrap().remove(0);
    match &refused {
        Err(ItemError::Link(station_gateway::link::LinkError::Refused(why))) => {
            assert!(why.to_string().contains("leased by TAT station 4"), "{why}")
        }
        other => panic!("the queued consuming read was not refused at the link: {other:?}"),
    }
    assert_eq!(
        sim.reads_of(I2C09),
        0,
        "a non-holder's consuming read queued before the grant consumed the holder's data"
    );
    // The holder reads it.
    let holders = lease
        .admit(Access::ForcedRead, Some(&held.lease_id))
        .unwrap();
    let readings = station
        .read(
            &names(&[I2C09]),
            ReadPolicy::hardware(None, holders.guard.as_ref()),
        )
        .await
        .unwrap();
    assert!(readings[0].is_ok(), "{readings:?}");
    assert_eq!(sim.reads_of(I2C09), 1);
    gateway.stop().await;
}

async fn post(rig: &Rig, path: &str, header: Option<(&str, &str)>, body: Json) -> (u16, Json) {
    let mut request = rig.http.post(rig.url(path)).json(&body);
    if let Some((name, value)) = header {
        request = request.header(name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Json::Null))
}

#[tokio::test]
async fn a_non_holders_max_age_read_during_a_lease_comes_from_the_cache_however_old() {
    let rig = rig(|_| {}).await;
    let id = rig.take_lease("TAT station 3").await;
    let holder = Some(("X-Lease-Id", id.as_str()));
    let asked_at = Instant::now();
    let (status, body) = post(
        &rig,
        "resources/values/get",
        holder,
        json!({ "Names": [MON_3V3, UART01] }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let hardware_reads = (sim_reads(&rig, MON_3V3), sim_reads(&rig, UART01));
    // Let the cached values age past the non-holder's MaxAgeMs (this is not a synchronisation:
    // the values just have to be older than 1 ms).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, body) = post(
        &rig,
        "resources/values/get",
        None,
        json!({ "Names": [MON_3V3, UART01], "MaxAgeMs": 1 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (sim_reads(&rig, MON_3V3), sim_reads(&rig, UART01)),
        hardware_reads,
        "a non-holder's MaxAgeMs read reached the hardware during a lease: {body}"
    );
    for name in [MON_3V3, UART01] {
        let age = body["ageMs"][name].as_f64().unwrap();
        assert!(
            age >= 20.0 && age <= asked_at.elapsed().as_secs_f64() * 1000.0 + 1.0,
            "{name}: not its true age: {body}"
        );
    }
    // A channel nobody has read: refused naming the holder, still no hardware read.
    let before = sim_reads(&rig, VMON1);
    let (status, body) = post(
        &rig,
        "resources/values/get",
        None,
        json!({ "Names": [VMON1], "MaxAgeMs": 1 }),
    )
    .await;
    assert_eq!(status, 423, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(
        message.contains(VMON1) && message.contains("TAT station 3"),
        "{body}"
    );
    assert_eq!(sim_reads(&rig, VMON1), before);
    // The holder's own MaxAgeMs read still goes to the hardware for stale values.
    let (status, body) = post(
        &rig,
        "resources/values/get",
        holder,
        json!({ "Names": [MON_3V3], "MaxAgeMs": 1 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sim_reads(&rig, MON_3V3), hardware_reads.0 + 1);
}

fn sim_reads(rig: &Rig, name: &str) -> u64 {
    rig.sim.reads_of(name)
}

const READ_KEY: &str = "read-key-0123456789abcdef";
const CONTROL_KEY: &str = "control-key-0123456789abcdef";

#[tokio::test]
async fn the_read_role_never_consumes_data() {
    let rig = rig(|config| {
        config.access.keys = vec![
            ApiKey {
                key: READ_KEY.into(),
                role: Role::Read,
                name: String::new(),
            },
            ApiKey {
                key: CONTROL_KEY.into(),
                role: Role::Control,
                name: String::new(),
            },
        ];
    })
    .await;
    let reader = Some(("X-Api-Key", READ_KEY));
    for (path, body) in [
        ("resources/value/get", json!({ "Name": UART01 })),
        (
            "resources/values/get",
            json!({ "Names": [MON_3V3, UART01] }),
        ),
        (
            "resources/values/get",
            json!({ "Names": [UART01], "MaxAgeMs": 1000 }),
        ),
    ] {
        let (status, answer) = post(&rig, path, reader, body.clone()).await;
        assert_eq!(status, 403, "{path} {body}: {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(
            message.contains(UART01) && message.contains("control"),
            "{answer}"
        );
    }
    assert_eq!(
        rig.sim.reads_of(UART01),
        0,
        "the read role consumed bus data"
    );
    // Ordinary channels are the read role's as before.
    let (status, answer) = post(
        &rig,
        "resources/values/get",
        reader,
        json!({ "Names": [MON_3V3] }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // The control role reads it, and a fresh cached value then serves the read role too.
    let (status, answer) = post(
        &rig,
        "resources/value/get",
        Some(("X-Api-Key", CONTROL_KEY)),
        json!({ "Name": UART01 }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rig.sim.reads_of(UART01), 1);
    let (status, answer) = post(
        &rig,
        "resources/values/get",
        reader,
        json!({ "Names": [UART01], "MaxAgeMs": 60000 }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rig.sim.reads_of(UART01), 1);
}
