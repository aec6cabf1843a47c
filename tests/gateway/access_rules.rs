//! Per-channel access rules against the simulator, with config/access-example.toml's
//! keys and rules: students set LEDs and are refused HV over REST and the legacy port, the door
//! interlock at admission and at the send guard, reloads (under load, a bad file, SIGHUP),
//! `v1/access/explain`, a configuration file with one forbidden channel, subscriptions.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use serde_json::{Value as Json, json};
use station_gateway::config::{ApiKey, Config, Role};
use station_protocol::{ErrorCode, Value};
use station_simulator::{ClientError, StationClient};

const STUDENT: &str = "student-key-0123456789abcdef";
const OPERATOR: &str = "operator-key-0123456789abcdef";
const ADMIN: &str = "admin-key-0123456789abcdef01";
const LED: &str = "0.11.ESH10000355.A1";
const VSET2: &str = "0.4.ESH10000662.VSET2";
const DOOR: &str = "Interlock.DOOR_CLOSED";
const EXAMPLE_RULES: &str = include_str!("../../config/access-example-rules.toml");

/// A rules file of its own for one test.
fn rules_file(test: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("access-rules-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The example's keys and the rules at `rules`, legacy clients students.
fn with_rules(config: &mut Config, rules: &Path) {
    config.access.keys = [
        (STUDENT, Role::Control, "student"),
        (OPERATOR, Role::Control, "operator"),
        (ADMIN, Role::Admin, "admin"),
    ]
    .into_iter()
    .map(|(key, role, name)| ApiKey {
        key: key.into(),
        role,
        name: name.into(),
    })
    .collect();
    config.access.rules = rules.display().to_string();
    config.legacy.access_group = "students".into();
}

/// A request below `api/` (or from the root, for a path starting with `/`) with `key`.
async fn keyed(rig: &Rig, key: &str, path: &str, body: Json, lease: Option<&str>) -> (u16, Json) {
    let url = if path.starts_with('/') {
        format!("{}{path}", rig.gateway.base_url())
    } else {
        rig.url(path)
    };
    let mut request = rig.http.post(url).header("X-Api-Key", key).json(&body);
    if let Some(lease) = lease {
        request = request.header("X-Lease-Id", lease);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Json::Null))
}

async fn set(rig: &Rig, key: &str, name: &str, value: &str, lease: Option<&str>) -> (u16, Json) {
    keyed(
        rig,
        key,
        "resources/value/set",
        json!({ "Name": name, "Value": value }),
        lease,
    )
    .await
}

async fn operator_lease(rig: &Rig) -> String {
    let (status, body) = keyed(
        rig,
        OPERATOR,
        "lease",
        json!({ "Owner": "operator", "TtlMs": 60000 }),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["leaseId"].as_str().unwrap().to_owned()
}

fn error_of(body: &Json) -> String {
    body["error"].as_str().unwrap_or_default().to_owned()
}

fn written_to(rig: &Rig, prefix: &str) -> Vec<String> {
    rig.sim
        .write_log()
        .iter()
        .filter(|w| w.channel.starts_with(prefix))
        .map(|w| format!("{}={}", w.channel, w.value.render()))
        .collect()
}

#[tokio::test]
async fn students_set_leds_and_are_refused_hv_over_rest_and_legacy() {
    let path = rules_file("students", EXAMPLE_RULES);
    let rig = legacy_rig(|c| with_rules(c, &path)).await;
    rig.sim.clear_write_log();

    let (status, body) = set(&rig, STUDENT, LED, "Red", None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = set(&rig, STUDENT, VSET1, "10", None).await;
    assert_eq!(status, 403, "{body}");
    let message = error_of(&body);
    assert!(
        message.contains(VSET1) && message.contains("students-never-touch-hv"),
        "{message}"
    );
    let (status, body) = set(&rig, STUDENT, ON1, "True", None).await;
    assert_eq!(status, 403, "{body}");
    // Nor do students take the control lease: no rule gives it to them.
    let (status, body) = keyed(
        &rig,
        STUDENT,
        "lease",
        json!({ "Owner": "student", "TtlMs": 10000 }),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        error_of(&body).contains("no access rule allows lease"),
        "{body}"
    );

    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    client.hello("student tool").await.unwrap();
    client
        .write_one(LED, Value::Enum("Green".into()))
        .await
        .expect("a legacy student sets an LED");
    match client.write_one(VSET1, Value::Float(20.0)).await {
        Err(ClientError::Station(error)) => {
            assert_eq!(error.code, ErrorCode::Locked);
            assert!(
                error.message.contains("students-never-touch-hv") && error.message.contains(VSET1),
                "{}",
                error.message
            );
        }
        other => panic!("expected the rules' refusal, got {other:?}"),
    }
    match client.read_one(VSET1).await {
        Err(ClientError::Station(error)) => {
            assert!(
                error.message.contains("students-never-touch-hv"),
                "{}",
                error.message
            )
        }
        other => panic!("expected the rules' refusal of a hardware read, got {other:?}"),
    }

    assert_eq!(written_to(&rig, "0.4.ESH10000662."), Vec::<String>::new());
    // The audit trail's line of each refused change names the rule.
    let audit: Json = rig
        .http
        .get(rig.url("audit/log?tail=0"))
        .header("X-Api-Key", ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let refused: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .filter(|line| line.contains("outcome=refused") && !line.contains("/api/lease"))
        .collect();
    assert_eq!(
        refused.len(),
        3,
        "REST VSET1, REST ON1, legacy VSET1: {refused:#?}"
    );
    assert!(
        refused
            .iter()
            .all(|line| line.contains("students-never-touch-hv")),
        "{refused:#?}"
    );
    assert_eq!(
        written_to(&rig, LED),
        [format!("{LED}=Red"), format!("{LED}=Green")]
    );
    let metrics = rig
        .http
        .get(format!("{}/metrics", rig.gateway.base_url()))
        .header("X-Api-Key", ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("access_rule_refusals_total{rule=\"students-never-touch-hv\"} 4"),
        "{metrics}"
    );
}

#[tokio::test]
async fn operators_switch_hv_on_only_while_the_door_is_closed() {
    let path = rules_file("door", EXAMPLE_RULES);
    let rig = rig(|c| with_rules(c, &path)).await;
    let (status, body) = set(&rig, OPERATOR, VSET1, "10", None).await;
    assert_eq!(status, 403, "without the lease: {body}");
    assert!(
        error_of(&body).contains("operators-change-everything"),
        "{body}"
    );
    let lease = operator_lease(&rig).await;
    rig.sim.clear_write_log();

    assert!(rig.sim.set_input(DOOR, Value::Bool(false)));
    let (status, body) = set(&rig, OPERATOR, ON1, "True", Some(&lease)).await;
    assert_eq!(status, 403, "{body}");
    let message = error_of(&body);
    for named in [ON1, DOOR, "hv-on-only-with-the-door-closed", "reads False"] {
        assert!(message.contains(named), "{named} in {message}");
    }
    // Switching off needs no door.
    let (status, body) = set(&rig, OPERATOR, ON1, "False", Some(&lease)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(written_to(&rig, ON1), [format!("{ON1}=False")]);

    assert!(rig.sim.set_input(DOOR, Value::Bool(true)));
    let (status, body) = set(&rig, OPERATOR, ON1, "True", Some(&lease)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        written_to(&rig, ON1),
        [format!("{ON1}=False"), format!("{ON1}=True")]
    );
    set(&rig, OPERATOR, ON1, "False", Some(&lease)).await;
}

/// Admission trusts an interlock's cached value only while it is younger than half
/// `interlock_max_age_ms`: an older one is read again from the hardware before the change is
/// admitted, a younger one is not (the watcher polls too rarely here to refresh it).
#[tokio::test]
async fn an_interlock_value_older_than_half_its_trusted_age_is_read_again_before_admission() {
    let rules = EXAMPLE_RULES
        .replace("interlock_max_age_ms = 1000", "interlock_max_age_ms = 2000")
        .replace("interlock_poll_ms = 100", "interlock_poll_ms = 600000");
    let path = rules_file("half-age", &rules);
    let rig = rig(|c| with_rules(c, &path)).await;
    let lease = operator_lease(&rig).await;
    let cache = rig.gateway.gateway.link.cache().clone();
    // The watcher polls every ten minutes: the door's value in the cache is this read's.
    let (status, body) = keyed(
        &rig,
        OPERATOR,
        "resources/value/get",
        json!({ "Name": DOOR }),
        Some(&lease),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Wait until it is past half its trusted age (1 s) but well inside twice it (4 s).
    until(
        Duration::from_secs(5),
        "the door's value to age past 1.1 s",
        || {
            cache
                .get(DOOR)
                .is_some_and(|c| c.age(std::time::Instant::now()) > Duration::from_millis(1100))
        },
    )
    .await;
    let reads = rig.sim.reads_of(DOOR);
    let (status, body) = set(&rig, OPERATOR, ON1, "True", Some(&lease)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        rig.sim.reads_of(DOOR),
        reads + 1,
        "a door value older than half its trusted age is read again"
    );
    // Now fresh: the next interlocked change is admitted on it without a read.
    let (status, body) = set(&rig, OPERATOR, ON1, "False", Some(&lease)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = set(&rig, OPERATOR, ON1, "True", Some(&lease)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        rig.sim.reads_of(DOOR),
        reads + 1,
        "a fresh door value serves"
    );
    set(&rig, OPERATOR, ON1, "False", Some(&lease)).await;
}

/// The door opens while the change waits behind a slow one (a window of one): admitted on the
/// door's value read just before, it is refused by the send guard, which trusts an interlock's
/// value only `interlock_max_age_ms`; the station never sees it.
#[tokio::test]
async fn the_send_guard_refuses_when_the_door_opens_between_admission_and_send() {
    let rules = EXAMPLE_RULES
        .replace("interlock_max_age_ms = 1000", "interlock_max_age_ms = 2000")
        .replace("interlock_poll_ms = 100", "interlock_poll_ms = 20");
    let path = rules_file("guard", &rules);
    let sim = station_with_slow_channels(
        |name| name == VSET2,
        Duration::from_secs(5),
        |profile| profile.station.tcp_window = 1,
    )
    .await;
    let config = config_for(&sim, |c| {
        with_rules(c, &path);
        c.station.request_timeout_ms = 10_000;
    });
    let rig = Arc::new(rig_on(sim, config, false).await);
    let lease = operator_lease(&rig).await;
    let link = rig.gateway.gateway.link.clone();
    until(Duration::from_secs(5), "the door to be read", || {
        link.cache().get(DOOR).is_some()
    })
    .await;
    rig.sim.clear_write_log();
    let stats = rig.gateway.gateway.link.stats().clone();
    let changes_sent =
        || stats.frames_sent.load(Ordering::Relaxed) - stats.read_frames.load(Ordering::Relaxed);
    let before = changes_sent();
    let guard_refusals = stats.refused_by_guard.load(Ordering::Relaxed);
    let slow = {
        let (rig, lease) = (rig.clone(), lease.clone());
        tokio::spawn(async move { set(&rig, OPERATOR, VSET2, "5", Some(&lease)).await })
    };
    until(
        Duration::from_secs(5),
        "the slow change to be on the wire",
        || changes_sent() > before,
    )
    .await;
    let switch_on = {
        let (rig, lease) = (rig.clone(), lease.clone());
        tokio::spawn(async move { set(&rig, OPERATOR, ON1, "True", Some(&lease)).await })
    };
    assert!(rig.sim.set_input(DOOR, Value::Bool(false)));
    let (status, body) = switch_on.await.unwrap();
    assert_eq!(status, 403, "{body}");
    let message = error_of(&body);
    for named in [ON1, DOOR, "hv-on-only-with-the-door-closed", "not sent"] {
        assert!(message.contains(named), "{named} in {message}");
    }
    assert!(
        stats.refused_by_guard.load(Ordering::Relaxed) > guard_refusals,
        "refused at admission, not by the send guard: {message}"
    );
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(written_to(&rig, ON1), Vec::<String>::new());
    assert_eq!(written_to(&rig, VSET2), [format!("{VSET2}=5")]);
}

const STUDENTS_MAY_READ: &str = r#"
[users]
students = ["student"]
[channels.leds]
names = ["0.11.ESH10000355.*"]
[[rule]]
name = "a-students-read-leds"
channels = ["leds"]
users = ["students"]
allow = ["read_cache", "read_hardware"]
"#;

const STUDENTS_MAY_NOT_READ: &str = r#"
[users]
students = ["student"]
[channels.leds]
names = ["0.11.ESH10000355.*"]
[[rule]]
name = "b-students-read-nothing"
channels = ["leds"]
users = ["students"]
deny = ["read_cache", "read_hardware"]
"#;

async fn student_reads(rig: &Rig) -> (u16, Json) {
    keyed(
        rig,
        STUDENT,
        "resources/value/get",
        json!({ "Name": LED }),
        None,
    )
    .await
}

#[tokio::test]
async fn a_reload_under_load_swaps_at_once_and_no_request_sees_a_half_state() {
    let path = rules_file("reload", STUDENTS_MAY_READ);
    let rig = Arc::new(rig(|c| with_rules(c, &path)).await);
    let rules = rig.gateway.gateway.station.access_rules().clone();
    let generation = rig.gateway.gateway.link.info().generation;
    let stop = Arc::new(AtomicBool::new(false));
    let (allowed, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut readers = Vec::new();
    for _ in 0..4 {
        let (rig, stop) = (rig.clone(), stop.clone());
        let (allowed, refused) = (allowed.clone(), refused.clone());
        readers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (status, body) = student_reads(&rig).await;
                match status {
                    200 => allowed.fetch_add(1, Ordering::Relaxed),
                    403 => {
                        let message = error_of(&body);
                        assert!(
                            message.contains("b-students-read-nothing"),
                            "half a state: {message}"
                        );
                        refused.fetch_add(1, Ordering::Relaxed)
                    }
                    other => panic!("{other}: {body}"),
                };
            }
        }));
    }
    for round in 0..6 {
        let (text, expected) = if round % 2 == 0 {
            (STUDENTS_MAY_NOT_READ, 403)
        } else {
            (STUDENTS_MAY_READ, 200)
        };
        std::fs::write(&path, text).unwrap();
        let version = rules.reload().unwrap();
        assert_eq!(rules.version(), version);
        // At once: the first request after the reload sees the new rules.
        assert_eq!(student_reads(&rig).await.0, expected, "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }
    assert!(allowed.load(Ordering::Relaxed) > 0 && refused.load(Ordering::Relaxed) > 0);
    // The load ran over the same connections: the gateway dropped none of them.
    assert_eq!(rig.gateway.gateway.link.info().generation, generation);
}

#[tokio::test]
async fn a_bad_file_is_refused_naming_line_and_key_and_the_rules_in_force_stay() {
    let path = rules_file("bad", STUDENTS_MAY_READ);
    let rig = rig(|c| with_rules(c, &path)).await;
    let rules = rig.gateway.gateway.station.access_rules().clone();
    let version = rules.version();
    std::fs::write(
        &path,
        STUDENTS_MAY_NOT_READ.replace("deny = [\"read_cache\"", "deny = [\"read_cahce\""),
    )
    .unwrap();
    let refused = rules.reload().unwrap_err().to_string();
    assert!(
        refused.contains("line 10") && refused.contains("read_cahce") && refused.contains("deny"),
        "{refused}"
    );
    assert_eq!(rules.version(), version);
    assert_eq!(
        student_reads(&rig).await.0,
        200,
        "the old rules stay in force"
    );
    // The file watcher (mtime, every second) takes a good file by itself; SIGHUP does too.
    std::fs::write(&path, STUDENTS_MAY_NOT_READ).unwrap();
    until(
        Duration::from_secs(5),
        "the changed file to be reloaded",
        || rules.version() > version,
    )
    .await;
    assert_eq!(student_reads(&rig).await.0, 403);
    let reloaded = rules.version();
    std::fs::write(&path, STUDENTS_MAY_READ).unwrap();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    until(Duration::from_secs(5), "SIGHUP to reload", || {
        rules.version() > reloaded
    })
    .await;
    assert_eq!(student_reads(&rig).await.0, 200);
}

#[tokio::test]
async fn explain_names_the_rule_that_decided() {
    let path = rules_file("explain", EXAMPLE_RULES);
    let rig = rig(|c| with_rules(c, &path)).await;
    let explain = |key: &'static str, body: Json| {
        let rig = &rig;
        async move { keyed(rig, key, "/v1/access/explain", body, None).await }
    };
    let (status, body) = explain(
        ADMIN,
        json!({ "User": "student", "Channel": VSET1, "Action": "write" }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["allowed"], false, "{body}");
    assert_eq!(body["rule"], "students-never-touch-hv", "{body}");
    let (_, body) = explain(
        ADMIN,
        json!({ "Key": OPERATOR, "Channel": ON1, "Action": "write", "Value": "True" }),
    )
    .await;
    assert_eq!(body["allowed"], true, "{body}");
    assert_eq!(body["user"], "operator", "{body}");
    assert_eq!(body["interlocks"][0]["channel"], DOOR, "{body}");
    assert_eq!(
        body["interlocks"][0]["rule"],
        "hv-on-only-with-the-door-closed"
    );
    // The status page shows the viewer's own rights over its channels.
    let status: Json = rig
        .http
        .get(format!("{}/status.json", rig.gateway.base_url()))
        .header("X-Api-Key", STUDENT)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let access = &status["access"];
    assert_eq!(access["viewer"], "student", "{access}");
    assert_eq!(access["rights"][VMON1], json!(["read_cache"]), "{access}");
    assert_eq!(access["lease"]["allowed"], false, "{access}");
    // One's own rights without naming oneself; another's need the admin role.
    let (_, body) = explain(STUDENT, json!({ "Channel": LED, "Action": "write" })).await;
    assert_eq!(
        (body["allowed"].as_bool(), body["rule"].as_str()),
        (Some(true), Some("students-set-the-leds")),
        "{body}"
    );
    let (_, body) = explain(STUDENT, json!({ "Channel": LED, "Action": "sample" })).await;
    assert_eq!(body["rule"], "default", "{body}");
    let (status, _) = explain(
        STUDENT,
        json!({ "User": "operator", "Channel": LED, "Action": "write" }),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = explain(ADMIN, json!({ "Channel": LED, "Action": "wirte" })).await;
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("wirte"), "{body}");
}

/// The audit trail's lines, read by the admin.
async fn audit_lines(rig: &Rig) -> Vec<String> {
    let audit: Json = rig
        .http
        .get(rig.url("audit/log?tail=0"))
        .header("X-Api-Key", ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    audit
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_student_confined_to_the_leds_may_not_press_the_safe_stop_and_an_operator_may() {
    let path = rules_file("safe-stop", EXAMPLE_RULES);
    let rig = rig(|c| {
        with_rules(c, &path);
        c.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: VSET2.into(),
            value: "0".into(),
        }];
    })
    .await;
    let lease = operator_lease(&rig).await;
    rig.sim.clear_write_log();

    let (status, body) = keyed(
        &rig,
        STUDENT,
        "/v1/safe-stop",
        json!({ "Reason": "just to see" }),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        error_of(&body).contains("no access rule allows safe_stop"),
        "{body}"
    );
    // Refused: the operator's lease lives on and nothing reached the station.
    let (status, body) = set(&rig, OPERATOR, VSET2, "7", Some(&lease)).await;
    assert_eq!(status, 200, "the operator's lease still works: {body}");
    assert_eq!(written_to(&rig, VSET2), [format!("{VSET2}=7")]);
    let refused: Vec<String> = audit_lines(&rig)
        .await
        .into_iter()
        .filter(|line| line.contains("/v1/safe-stop"))
        .collect();
    assert!(
        refused.len() == 1
            && refused[0].contains("outcome=refused")
            && refused[0].contains("student"),
        "one refused safe-stop line naming the student: {refused:#?}"
    );

    let (status, body) = explain(
        &rig,
        ADMIN,
        json!({ "User": "operator", "Action": "safe_stop" }),
    )
    .await;
    assert_eq!(
        (status, body["rule"].as_str()),
        (200, Some("operators-press-the-safe-stop")),
        "{body}"
    );
    let (status, body) = keyed(
        &rig,
        OPERATOR,
        "/v1/safe-stop",
        json!({ "Reason": "smoke in rack 2" }),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leaseEnded"]["owner"], "operator", "{body}");
    assert_eq!(
        written_to(&rig, VSET2),
        [format!("{VSET2}=7"), format!("{VSET2}=0")]
    );
}

async fn explain(rig: &Rig, key: &str, body: Json) -> (u16, Json) {
    keyed(rig, key, "/v1/access/explain", body, None).await
}

#[tokio::test]
async fn a_numeric_result_reaches_only_the_streams_whose_reader_may_read_its_target() {
    const ADC_NR: &str = "0.8.ESH10000590.NumericResult";
    const ADC01: &str = "0.8.ESH10000590.ADC01";
    let rules = format!(
        "{EXAMPLE_RULES}\n[channels.adc01]\nnames = [\"{ADC01}\"]\n\n[[rule]]\nname = \"students-never-read-adc01\"\nchannels = [\"adc01\"]\nusers = [\"students\"]\ndeny = [\"read_cache\"]\n"
    );
    let path = rules_file("numeric-events", &rules);
    let rig = rig(|c| with_rules(c, &path)).await;
    let mut operator = Sse::open_keyed(&rig, OPERATOR).await.unwrap();
    let mut student = Sse::open_keyed(&rig, STUDENT).await.unwrap();
    let wait = Duration::from_secs(10);

    let lease = operator_lease(&rig).await;
    let (status, body) = keyed(
        &rig,
        OPERATOR,
        "numeric-results/acquire",
        json!({ "Channel": ADC_NR, "Target": ADC01, "Samples": 50 }),
        Some(&lease),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let result = operator.next_named("numeric-result", wait).await.unwrap();
    assert_eq!(result.data["target"], ADC01, "{:?}", result.data);
    // The release's lease event goes to every stream after the result: the student's stream
    // shows it with nothing about ADC01 before it.
    let released = rig
        .http
        .delete(rig.url(&format!("lease/{lease}")))
        .header("X-Api-Key", OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(released.status().as_u16(), 200);
    loop {
        let event = student
            .next(wait)
            .await
            .unwrap()
            .expect("the stream goes on");
        assert_ne!(
            event.name, "numeric-result",
            "the student may not read {ADC01}: {:?}",
            event.data
        );
        if event.name == "lease" && event.data["held"] == false {
            break;
        }
    }
}

#[tokio::test]
async fn a_base_board_module_matches_its_channels_and_explain_names_groups_that_match_nothing() {
    const UART: &str = "0.ESH10000023.UART01";
    let rules = format!(
        "{EXAMPLE_RULES}\n[channels.base_board]\nmodules = [\"ESH10000023\"]\n[channels.ghost]\nmodules = [\"ESH99999999\"]\n\n[[rule]]\nname = \"students-use-the-base-boards-buses\"\nchannels = [\"base_board\", \"ghost\"]\nusers = [\"students\"]\nallow = [\"bus\"]\n"
    );
    let path = rules_file("base-board", &rules);
    let rig = rig(|c| with_rules(c, &path)).await;
    let (status, body) = explain(&rig, STUDENT, json!({ "Channel": UART, "Action": "bus" })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["allowed"].as_bool(), body["rule"].as_str()),
        (Some(true), Some("students-use-the-base-boards-buses")),
        "{body}"
    );
    assert_eq!(
        body["unmatched"],
        json!([
            "channels.ghost.modules: \"ESH99999999\" matches no channel of the station",
            "channels.ghost: the group matches no channel of the station",
        ]),
        "{body}"
    );
}

#[tokio::test]
async fn a_configuration_file_with_one_forbidden_channel_applies_nothing() {
    let rules = EXAMPLE_RULES.replace(
        "allow = [\"read_hardware\", \"write\", \"transact\"]",
        "allow = [\"read_hardware\", \"write\", \"transact\", \"load_config\"]",
    );
    let path = rules_file("load", &rules);
    let dir = std::env::temp_dir().join(format!("access-rules-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rig = rig(|c| {
        with_rules(c, &path);
        c.config_files.dir = dir.clone();
    })
    .await;
    let led_b = "0.11.ESH10000355.B1";
    std::fs::write(
        dir.join("mixed.cfg"),
        format!(
            "format_version = 1\n[[channel]]\nname = \"{LED}\"\nvalue = \"Blue\"\n[[channel]]\nname = \"{VSET1}\"\nvalue = \"30\"\n[[channel]]\nname = \"{led_b}\"\nvalue = \"Red\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("leds.cfg"),
        format!("format_version = 1\n[[channel]]\nname = \"{LED}\"\nvalue = \"Blue\"\n"),
    )
    .unwrap();
    rig.sim.clear_write_log();
    let load = |file: &'static str| {
        let rig = &rig;
        async move {
            keyed(
                rig,
                STUDENT,
                "application/config/load",
                json!({ "FileName": file }),
                None,
            )
            .await
        }
    };
    let (status, body) = load("mixed.cfg").await;
    assert_eq!(status, 403, "{body}");
    let message = error_of(&body);
    assert!(
        message.contains(VSET1) && message.contains("students-never-touch-hv"),
        "{message}"
    );
    assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
    let (status, body) = load("leds.cfg").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(written_to(&rig, LED), [format!("{LED}=Blue")]);
    // Saving asks save_config of every channel: no rule gives it to students.
    let (status, body) = keyed(
        &rig,
        STUDENT,
        "application/config/save",
        json!({ "FileName": "mine.cfg" }),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(error_of(&body).contains("save_config"), "{body}");
    assert!(!dir.join("mine.cfg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn subscriptions_and_histories_of_channels_a_key_may_not_read_are_refused_naming_them() {
    // Students may not read the HV module even from the cache here.
    let rules = EXAMPLE_RULES.replace(
        "deny = [\"read_hardware\", \"write\"",
        "deny = [\"read_cache\", \"read_hardware\", \"write\"",
    );
    assert_ne!(rules, EXAMPLE_RULES);
    let path = rules_file("subscribe", &rules);
    let rig = rig(|c| with_rules(c, &path)).await;
    let (status, body) = keyed(
        &rig,
        STUDENT,
        "subscriptions",
        json!({ "StreamId": "no-such-stream", "Channels": [VSET1, LED], "IntervalMs": 100 }),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let message = error_of(&body);
    assert!(
        message.contains(VSET1) && message.contains("students-never-touch-hv"),
        "{message}"
    );
    // The LEDs alone pass the rules and reach the stream check.
    let (status, body) = keyed(
        &rig,
        STUDENT,
        "subscriptions",
        json!({ "StreamId": "no-such-stream", "Channels": [LED], "IntervalMs": 100 }),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    // An operator's passes the rules and reaches the stream check.
    let (status, body) = keyed(
        &rig,
        OPERATOR,
        "subscriptions",
        json!({ "StreamId": "no-such-stream", "Channels": [LED, VSET1], "IntervalMs": 100 }),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    // A channel's history is read like its value: refused the same way, by the same rule.
    let history = |key: &'static str, channel: &str| {
        let url = format!(
            "{}/v1/history?channel={channel}&from=-10m",
            rig.gateway.base_url()
        );
        let request = rig.http.get(url).header("X-Api-Key", key);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Json>().await.unwrap_or(Json::Null))
        }
    };
    let (status, body) = history(STUDENT, VSET1).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        error_of(&body).contains("students-never-touch-hv"),
        "{body}"
    );
    let (status, body) = history(STUDENT, LED).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = history(OPERATOR, VSET1).await;
    assert_eq!(status, 200, "{body}");
}

#[test]
fn the_example_config_parses_and_its_rules_compile() {
    let text = include_str!("../../config/access-example.toml");
    let config = Config::from_toml(text, "config/access-example.toml").unwrap();
    assert_eq!(config.access.rules, "config/access-example-rules.toml");
    assert_eq!(config.legacy.access_group, "students");
    let names: Vec<&str> = config.access.keys.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["student", "operator", "admin"]);
    let keys: Vec<&str> = config.access.keys.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(keys, [STUDENT, OPERATOR, ADMIN]);
    let rules = station_gateway::rules::Rules::compile(EXAMPLE_RULES, 1).unwrap();
    assert_eq!(rules.interlock_channels(), [DOOR]);
}

/// Every door a value reaches a channel by is judged by the same `write` rules and interlocks:
/// with the door open, an operator holding the lease is refused ON1 = True by
/// `values/set`, by `transact` and by loading a configuration file that sets it (before, the
/// load was judged by `load_config` alone and ON1 = True reached the station); the station's
/// write log sees none of them. With the door closed the same file loads.
#[tokio::test]
async fn a_configuration_file_load_is_judged_by_the_write_rules_and_their_interlock() {
    let path = rules_file("load-interlock", EXAMPLE_RULES);
    let dir = std::env::temp_dir().join(format!("access-rules-interlock-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rig = rig(|c| {
        with_rules(c, &path);
        c.config_files.dir = dir.clone();
    })
    .await;
    std::fs::write(
        dir.join("hv-on.cfg"),
        format!("format_version = 1\n[[channel]]\nname = \"{ON1}\"\nvalue = \"True\"\n"),
    )
    .unwrap();
    let lease = operator_lease(&rig).await;
    assert!(rig.sim.set_input(DOOR, Value::Bool(false)));
    // The gateway has seen the door open (an interlock is judged on a value at most its
    // max_age old, which the interlock watcher keeps fresh).
    rig.gateway.link().read(vec![DOOR.into()]).await.unwrap();
    rig.sim.clear_write_log();

    let (status, body) = set(&rig, OPERATOR, ON1, "True", Some(&lease)).await;
    assert_eq!(status, 403, "values/set: {body}");
    let (status, body) = keyed(
        &rig,
        OPERATOR,
        "resources/transact",
        json!({ "Name": ON1, "Value": "True" }),
        Some(&lease),
    )
    .await;
    assert_eq!(status, 403, "transact: {body}");
    let load = json!({ "FileName": "hv-on.cfg" });
    let (status, body) = keyed(
        &rig,
        OPERATOR,
        "application/config/load",
        load.clone(),
        Some(&lease),
    )
    .await;
    assert_eq!(status, 403, "config load with the door open: {body}");
    let message = error_of(&body);
    for named in [ON1, DOOR, "hv-on-only-with-the-door-closed", "reads False"] {
        assert!(message.contains(named), "{named} in {message}");
    }
    assert_eq!(written_to(&rig, ON1), Vec::<String>::new());

    assert!(rig.sim.set_input(DOOR, Value::Bool(true)));
    let (status, body) = keyed(
        &rig,
        OPERATOR,
        "application/config/load",
        load,
        Some(&lease),
    )
    .await;
    assert_eq!(status, 200, "config load with the door closed: {body}");
    assert_eq!(written_to(&rig, ON1), [format!("{ON1}=True")]);
    set(&rig, OPERATOR, ON1, "False", Some(&lease)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An acquisition reads its target from the hardware: a key the rules let sample the
/// NumericResult channel but not read the target's hardware is refused naming the target.
#[tokio::test]
async fn an_acquisition_is_judged_as_a_hardware_read_of_its_target() {
    let rules = EXAMPLE_RULES.replace(
        "allow = [\"read_hardware\", \"write\", \"transact\"]",
        "allow = [\"read_hardware\", \"write\", \"transact\"]\n\n[[rule]]\nname = \"students-sample\"\nchannels = [\"everything\"]\nusers = [\"students\"]\nallow = [\"sample\"]",
    );
    let path = rules_file("sample-target", &rules);
    let rig = rig(|c| with_rules(c, &path)).await;
    let (status, body) = keyed(
        &rig,
        STUDENT,
        "numeric-results/acquire",
        json!({ "Channel": "0.1.ESH10000158.NumericResult", "Target": MON_3V3, "Samples": 10 }),
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let message = error_of(&body);
    assert!(
        message.contains(MON_3V3) && message.contains("read_hardware"),
        "{message}"
    );
}

/// Students may switch HV on, on station st2 only; the default denies the rest.
const HV_ON_ST2_ONLY: &str = r#"
default = "deny"
[users]
students = ["student"]
[channels.hv_on]
names = ["0.4.ESH10000662.ON*"]

[[rule]]
name = "students-drive-hv-on-st2"
stations = ["st2"]
channels = ["hv_on"]
users = ["students"]
allow = ["read_hardware", "write"]
"#;

/// A gateway of one station named `st1`, by one `[[station]]` table (`table`) or by a
/// one-station file's `station.id`, with the rules at `rules`.
async fn one_station_named_st1(table: bool, rules: &Path) -> Rig {
    let sim = default_simulator().await;
    let config = config_for(&sim, |c| {
        with_rules(c, rules);
        c.station.id = "st1".into();
    });
    let gateway = if table {
        let lab = station_gateway::config::lab::Lab {
            stations: vec![station_gateway::config::lab::StationSetup {
                id: "st1".into(),
                config,
            }],
            default_station: Some("st1".into()),
        };
        let listeners = station_gateway::LabListeners {
            http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            legacy: vec![None],
        };
        station_gateway::start_lab(listeners, lab).await.unwrap()
    } else {
        station_gateway::start(
            station_gateway::Listeners {
                http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
                legacy: None,
            },
            config,
        )
        .await
        .unwrap()
    };
    within(
        Duration::from_secs(10),
        "the gateway to connect",
        gateway.connected(),
    )
    .await;
    Rig {
        sim,
        gateway,
        http: reqwest::Client::new(),
    }
}

/// A rule for station st2 is not in force on a gateway whose only station is st1, whether it
/// is one `[[station]]` table or a `[station]` with `id = "st1"`: the student is refused by
/// the default, nothing reaches the station, and explain and the status page name the rule as
/// one for a station this gateway does not serve.
#[tokio::test]
async fn a_rule_for_another_station_is_not_in_force_on_a_gateway_of_one_named_station() {
    let path = rules_file("one-named-station", HV_ON_ST2_ONLY);
    for table in [true, false] {
        let rig = one_station_named_st1(table, &path).await;
        rig.sim.clear_write_log();
        let (status, body) = set(&rig, STUDENT, ON1, "True", None).await;
        assert_eq!(status, 403, "table {table}: {body}");
        assert!(error_of(&body).contains("default"), "{body}");
        assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
        let (status, body) = keyed(
            &rig,
            ADMIN,
            "/v1/access/explain",
            json!({ "User": "student", "Channel": ON1, "Action": "write", "Value": "True" }),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["allowed"], false, "{body}");
        assert_eq!(body["rule"], "default", "{body}");
        let reported = body["rulesForOtherStations"].to_string();
        assert!(
            reported.contains("students-drive-hv-on-st2") && reported.contains("st2"),
            "{body}"
        );
        let status: Json = rig
            .http
            .get(format!("{}/status.json", rig.gateway.base_url()))
            .header("X-Api-Key", ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let shown = status["access"]["rulesForOtherStations"].to_string();
        assert!(shown.contains("students-drive-hv-on-st2"), "{status}");
        rig.gateway.stop().await;
    }
}
