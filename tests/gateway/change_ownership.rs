//! A change is the station service's to its end: a client that hangs up while its change is at
//! the station changes nothing about what happens to the change or to its audit line, and a
//! change of many steps that stops partway is audited `partial`, naming what was applied — from
//! the typed outcome, never from the wording of an error message.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::json;
use station_gateway::link::LinkStats;
use tokio::io::AsyncWriteExt;

const VSET1: &str = "0.4.ESH10000662.VSET1";
const ISET1: &str = "0.4.ESH10000662.ISET1";
const RAMP1: &str = "0.4.ESH10000662.RAMP1";
const RAMP2: &str = "0.4.ESH10000662.RAMP2";

/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(10);

/// The audit trail's change lines (memory-only trail: the gateway's own tail).
fn change_lines(rig: &Rig) -> Vec<String> {
    rig.gateway.gateway.audit.recent_changes()
}

/// Sends `body` as `POST /api/{path}` on a raw connection and returns the connection, the
/// request sent and not answered yet: dropping it is the client hanging up.
async fn post_raw(rig: &Rig, path: &str, body: serde_json::Value) -> tokio::net::TcpStream {
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(rig.gateway.http_addr)
        .await
        .unwrap();
    let request = format!(
        "POST /api/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// Waits until the link has sent one more frame than `before`.
async fn sent_after(rig: &Rig, before: u64, what: &str) {
    let stats = rig.gateway.link().stats().clone();
    until(BOUND, what, || LinkStats::get(&stats.frames_sent) > before).await;
}

/// One `#[tokio::test]` per lease backend for the scenario `$scenario(backend_url)`.
macro_rules! on_every_backend {
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

on_every_backend!(a_change_whose_client_hangs_up_is_applied_and_audited_with_its_outcome:
    a_change_whose_client_hangs_up_is_applied_and_audited_on_memory => "memory",
    a_change_whose_client_hangs_up_is_applied_and_audited_on_sqlite => "sqlite",
    a_change_whose_client_hangs_up_is_applied_and_audited_on_postgres => "postgres",
    a_change_whose_client_hangs_up_is_applied_and_audited_on_redis => "redis",
);

async fn a_change_whose_client_hangs_up_is_applied_and_audited_with_its_outcome(backend: &str) {
    // The station takes 800 ms over VSET1; the client hangs up as soon as the write is sent.
    let sim =
        station_with_slow_channels(|name| name == VSET1, Duration::from_millis(800), |_| {}).await;
    let config = config_for(&sim, |c| {
        c.lease.backend = backend.to_owned();
        c.lease.name = common::backends::own_lease_name("change-ownership");
    });
    let rig = rig_on(sim, config, false).await;
    let before = LinkStats::get(&rig.gateway.link().stats().frames_sent);
    let client = post_raw(
        &rig,
        "resources/value/set",
        json!({ "Name": VSET1, "Value": "1234" }),
    )
    .await;
    sent_after(&rig, before, "the write to be sent to the station").await;
    drop(client);
    until(BOUND, "the station to apply the write", || {
        rig.sim.write_log().iter().any(|w| w.channel == VSET1)
    })
    .await;
    until(BOUND, "the write's audit line", || {
        change_lines(&rig)
            .iter()
            .any(|l| l.contains(&format!("asked={VSET1}=1234")))
    })
    .await;
    let lines = change_lines(&rig);
    let line = lines
        .iter()
        .find(|l| l.contains(&format!("asked={VSET1}=1234")))
        .unwrap();
    assert!(
        line.contains("POST /api/resources/value/set 200 ") && line.contains("outcome=applied"),
        "the line of a change whose client hung up tells the truth: {line}"
    );
}

#[tokio::test]
async fn a_list_configure_that_stops_at_its_third_entry_is_audited_partial_naming_what_was_applied()
{
    // RAMP2 takes longer at the station than the gateway waits: the list stops there.
    let sim =
        station_with_slow_channels(|name| name == RAMP2, Duration::from_secs(2), |_| {}).await;
    let config = config_for(&sim, |c| c.station.request_timeout_ms = 300);
    let rig = rig_on(sim, config, false).await;
    let (status, body) = rig
        .post(
            "channels/configure",
            json!([
                { "NetName": VSET1, "Unit": "kV" },
                { "NetName": ISET1, "Unit": "mA" },
                { "NetName": RAMP2, "Unit": "kV/s" },
                { "NetName": RAMP1, "Unit": "kV/s" },
            ]),
        )
        .await;
    assert_eq!(status, 504, "{body}");
    let lines = change_lines(&rig);
    let line = lines
        .iter()
        .rfind(|l| l.contains("POST /api/channels/configure "))
        .unwrap_or_else(|| panic!("no line for the configure list: {lines:#?}"));
    assert!(line.contains("outcome=partial"), "{line}");
    assert!(
        line.contains(&format!("applied=\"configure {VSET1}; configure {ISET1}\"")),
        "the line names what was applied: {line}"
    );
    assert!(line.contains(RAMP1), "and what was not: {line}");
}

#[tokio::test]
async fn a_configuration_load_that_stops_midway_is_audited_partial_naming_what_was_applied() {
    let dir = std::env::temp_dir().join(format!("sg-change-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // RAMP1's writes take longer than the gateway waits: the load stops at its second step.
    let sim =
        station_with_slow_channels(|name| name == RAMP1, Duration::from_secs(2), |_| {}).await;
    let config = config_for(&sim, |c| {
        c.config_files.dir = dir.clone();
        c.station.request_timeout_ms = 300;
    });
    let rig = rig_on(sim, config, false).await;
    let file = format!(
        "format_version = 1\n\
         [[channel]]\nname = \"{VSET1}\"\nvalue = \"10\"\n\
         [[channel]]\nname = \"{RAMP1}\"\nvalue = \"20\"\n\
         [[channel]]\nname = \"{ISET1}\"\nvalue = \"30\"\n"
    );
    std::fs::write(dir.join("slow.cfg"), file).unwrap();
    let (status, body) = rig
        .post("application/config/load", json!({ "FileName": "slow.cfg" }))
        .await;
    assert_eq!(status, 504, "{body}");
    let lines = change_lines(&rig);
    let line = lines
        .iter()
        .rfind(|l| l.contains("POST /api/application/config/load "))
        .unwrap_or_else(|| panic!("no line for the load: {lines:#?}"));
    assert!(line.contains("outcome=partial"), "{line}");
    assert!(
        line.contains(&format!("applied=\"write {VSET1} = 10\"")),
        "the line names what was applied: {line}"
    );
    assert!(line.contains(ISET1), "and what was not: {line}");
    let _ = std::fs::remove_dir_all(&dir);
}
