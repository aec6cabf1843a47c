//! The safe stop anyone with control may press (`POST /v1/safe-stop`): in the middle of a
//! holder's sequence of writes it ends the lease, applies the safe state after every write of
//! that lease and before none, tells the holder why, and leaves a line in the audit trail.

use crate::common;

use std::time::{Duration, Instant};

use common::{VSET1, rig, within};
use serde_json::{Value as Json, json};
use station_gateway::config::{ApiKey, Role, SafeWrite};
use station_gateway::lease::LeaseView;
use station_protocol::Value;
use tokio::sync::broadcast;

const ON1: &str = "0.4.ESH10000662.ON1";
const READ_KEY: &str = "read-key-0123456789";
const CONTROL_KEY: &str = "control-key-0123456789";
/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(20);

fn safe_state() -> Vec<SafeWrite> {
    vec![
        SafeWrite {
            channel: VSET1.into(),
            value: "0".into(),
        },
        SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        },
    ]
}

async fn post(
    http: &reqwest::Client,
    url: String,
    headers: &[(&str, &str)],
    body: Json,
) -> (u16, Json) {
    let mut request = http.post(url).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("the gateway did not answer");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Json::Null))
}

/// Waits for the first lease event that `wanted` accepts.
async fn lease_event(
    events: &mut broadcast::Receiver<LeaseView>,
    wanted: impl Fn(&LeaseView) -> bool,
) -> LeaseView {
    within(BOUND, "the lease event of the safe stop", async {
        loop {
            match events.recv().await {
                Ok(view) if wanted(&view) => return view,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("lease events closed"),
            }
        }
    })
    .await
}

fn is_holder_value(value: &Value) -> bool {
    matches!(value, Value::Float(v) if *v >= 1.0)
}

#[tokio::test]
async fn a_safe_stop_in_the_middle_of_a_holders_writes_ends_the_lease_and_applies_the_safe_state_after_all_of_them()
 {
    let rig = rig(|config| config.lease.safe_state = safe_state()).await;
    let base = rig.gateway.base_url();
    let mut events = rig.gateway.gateway.lease_events.subscribe();
    let id = rig.take_lease("TAT station 3").await;

    // The holder writes VSET1 = 1, 2, 3, ... every 50 ms until refused.
    let holder = {
        let (http, url, id) = (rig.http.clone(), rig.url("resources/value/set"), id.clone());
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for n in 1..=400u32 {
                let (status, body) = post(
                    &http,
                    url.clone(),
                    &[("X-Lease-Id", &id)],
                    json!({"Name": VSET1, "Value": n.to_string()}),
                )
                .await;
                statuses.push(status);
                if status != 200 {
                    return (statuses, body);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("the holder's writes were never refused");
        })
    };
    common::until(BOUND, "the holder's first writes", || {
        rig.sim
            .write_log()
            .iter()
            .filter(|w| w.channel == VSET1 && is_holder_value(&w.value))
            .count()
            >= 3
    })
    .await;

    let pressed = Instant::now();
    let (status, answer) = post(
        &rig.http,
        format!("{base}/v1/safe-stop"),
        &[],
        json!({"Reason": "smoke in rack 2"}),
    )
    .await;
    let took = pressed.elapsed();
    assert_eq!(status, 200, "{answer}");
    println!("safe stop: answered with the safe state confirmed in {took:?}");
    assert_eq!(answer["leaseEnded"]["owner"], "TAT station 3", "{answer}");
    assert_eq!(answer["safeState"]["confirmed"], true, "{answer}");

    let (statuses, refusal) = within(BOUND, "the holder to be refused", holder)
        .await
        .unwrap();
    assert_eq!(statuses.last(), Some(&423), "{statuses:?} {refusal}");
    assert!(statuses[..statuses.len() - 1].iter().all(|s| *s == 200));

    let log = rig.sim.write_log();
    let safe_at = log
        .iter()
        .position(|w| w.channel == VSET1 && w.value == Value::Float(0.0))
        .expect("the safe state's write of VSET1 is in the station's log");
    let last_of_lease = log
        .iter()
        .rposition(|w| w.channel == VSET1 && is_holder_value(&w.value))
        .unwrap();
    assert!(
        last_of_lease < safe_at,
        "a write of the stopped lease landed after the safe state: {log:#?}"
    );
    assert!(
        log[safe_at..]
            .iter()
            .any(|w| w.channel == ON1 && w.value == Value::Bool(false)),
        "{log:#?}"
    );

    let view = lease_event(&mut events, |v| v.ended.is_some()).await;
    let ended = view.ended.unwrap();
    assert!(
        ended.contains("safe-stopped by") && ended.contains("smoke in rack 2"),
        "{ended}"
    );
    let lines = rig.gateway.gateway.audit.recent_changes();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("safe-stop") && l.contains("smoke in rack 2")),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn a_safe_stop_with_nobody_holding_still_applies_the_safe_state_and_a_reason_is_required() {
    let rig = rig(|config| {
        config.lease.safe_state = safe_state();
        config.station.max_processing_ms = Some(config.station.request_timeout_ms);
    })
    .await;
    let url = format!("{}/v1/safe-stop", rig.gateway.base_url());
    for body in [json!({}), json!({"Reason": "  "})] {
        let (status, answer) = post(&rig.http, url.clone(), &[], body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.to_string().contains("Reason"), "{answer}");
    }
    // Nobody holds the lease: anyone changes the station out of its safe state.
    let (status, body) = rig.write(ON1, "True").await;
    assert_eq!(status, 200, "{body}");
    rig.sim.clear_write_log();
    let safe_writes = |rig: &common::Rig| -> usize {
        rig.sim
            .write_log()
            .iter()
            .filter(|w| w.channel == ON1 && w.value == Value::Bool(false))
            .count()
    };
    let (status, answer) = post(
        &rig.http,
        url.clone(),
        &[],
        json!({"Reason": "end of shift"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["leaseEnded"].is_null(), "{answer}");
    assert_eq!(answer["safeState"]["confirmed"], true, "{answer}");
    assert_eq!(safe_writes(&rig), 1);
    // Free again once read back right the second time: a change goes ahead.
    let lease = rig.gateway.gateway.lease.clone();
    common::until(Duration::from_secs(10), "the second read back", || {
        lease.safe_state_pending().is_none()
    })
    .await;
    let (status, body) = rig.write(VSET1, "2").await;
    assert_eq!(status, 200, "{body}");
    // VSET1 is part of the safe state: the next press writes it again.
    let (status, answer) = post(&rig.http, url.clone(), &[], json!({"Reason": "again"})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(safe_writes(&rig), 2);
    common::until(Duration::from_secs(10), "the second read back", || {
        lease.safe_state_pending().is_none()
    })
    .await;
    // The safe state in place, a press is audited and writes nothing: read back, right.
    let (status, answer) = post(&rig.http, url, &[], json!({"Reason": "and again"})).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("was already in place"),
        "{answer}"
    );
    assert_eq!(safe_writes(&rig), 2, "nothing written by the third press");
    let lines = rig.gateway.gateway.audit.recent_changes();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("safe-stop") && l.contains("and again")),
        "{lines:#?}"
    );
}

/// With no safe state configured the press still ends the lease, but nothing makes the station
/// safe: 501, saying so, never a 200 a script would take for "the station is safe".
#[tokio::test]
async fn a_safe_stop_without_a_safe_state_ends_the_lease_and_is_not_answered_done() {
    let rig = rig(|_| {}).await;
    let id = rig.take_lease("bench 1").await;
    let url = format!("{}/v1/safe-stop", rig.gateway.base_url());
    let (status, answer) = post(&rig.http, url, &[], json!({"Reason": "test"})).await;
    assert_eq!(status, 501, "{answer}");
    assert_eq!(answer["stopped"], false, "{answer}");
    assert_eq!(answer["leaseEnded"]["owner"], "bench 1", "{answer}");
    assert_eq!(answer["safeState"]["configured"], false, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(
        error.contains("no safe state is configured") && error.contains("nothing was written"),
        "{answer}"
    );
    let (status, body) = post(
        &rig.http,
        rig.url("resources/value/set"),
        &[("X-Lease-Id", &id)],
        json!({"Name": VSET1, "Value": "3"}),
    )
    .await;
    assert_eq!(status, 423, "{body}");
}

#[tokio::test]
async fn with_access_control_a_read_key_may_not_press_it_and_a_control_key_may() {
    let rig = rig(|config| {
        config.lease.safe_state = safe_state();
        config.access.keys = vec![
            ApiKey {
                key: READ_KEY.into(),
                role: Role::Read,
                name: "viewer".into(),
            },
            ApiKey {
                key: CONTROL_KEY.into(),
                role: Role::Control,
                name: "bench 3".into(),
            },
        ];
    })
    .await;
    let url = format!("{}/v1/safe-stop", rig.gateway.base_url());
    let body = json!({"Reason": "drill"});
    let (status, answer) = post(
        &rig.http,
        url.clone(),
        &[("X-Api-Key", READ_KEY)],
        body.clone(),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = post(&rig.http, url, &[("X-Api-Key", CONTROL_KEY)], body).await;
    assert_eq!(status, 200, "{answer}");
    let lines = rig.gateway.gateway.audit.recent_changes();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("safe-stop") && l.contains("bench 3") && l.contains("drill")),
        "{lines:#?}"
    );
}

/// A station that does not answer: the press ends the lease, the safe state cannot be
/// confirmed, and the answer is 503 saying so (the gateway keeps trying), never 200.
#[tokio::test]
async fn a_safe_stop_the_station_does_not_confirm_is_answered_503_and_its_safe_state_stays_owed() {
    let rig = rig(|config| {
        config.lease.safe_state = safe_state();
        config.station.request_timeout_ms = 300;
        config.station.max_processing_ms = Some(300);
    })
    .await;
    rig.take_lease("bench 2").await;
    rig.sim.set_stall(true);
    let url = format!("{}/v1/safe-stop", rig.gateway.base_url());
    let (status, answer) = within(
        BOUND,
        "the safe stop's answer",
        post(&rig.http, url, &[], json!({"Reason": "station hung"})),
    )
    .await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["stopped"], false, "{answer}");
    assert_eq!(answer["leaseEnded"]["owner"], "bench 2", "{answer}");
    assert_eq!(answer["safeState"]["confirmed"], false, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("NOT confirmed"),
        "{answer}"
    );
    assert!(rig.gateway.gateway.lease.safe_state_pending().is_some());
    // Once the station answers again the gateway finishes the duty it kept.
    rig.sim.set_stall(false);
    let lease = rig.gateway.gateway.lease.clone();
    common::until(BOUND, "the safe state to be done", || {
        lease.safe_state_pending().is_none()
    })
    .await;
}

/// A reason is shown back in the answer, the lease's end and the audit trail: one with a
/// control character is refused, naming the field, and nothing is stopped.
#[tokio::test]
async fn a_reason_with_control_characters_is_refused_naming_the_field() {
    let rig = rig(|config| config.lease.safe_state = safe_state()).await;
    rig.take_lease("bench 4").await;
    let url = format!("{}/v1/safe-stop", rig.gateway.base_url());
    for reason in ["\u{0}\u{0}", "smoke\u{1b}[2J"] {
        let (status, answer) = post(&rig.http, url.clone(), &[], json!({"Reason": reason})).await;
        assert_eq!(status, 400, "{answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .starts_with("the field Reason holds the control character"),
            "{answer}"
        );
    }
    assert_eq!(
        rig.gateway.gateway.lease.view().owner.as_deref(),
        Some("bench 4")
    );
}
