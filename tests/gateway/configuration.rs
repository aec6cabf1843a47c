//! Channel configuration and configuration files against the simulator: CONFIGURE reaching the
//! station and coming back as the channel table and a `configuration` event, the order a load
//! writes in as the station's write log shows it, and a load the link fails partway.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use common::sse::Sse;
use common::*;
use serde_json::{Value as Json, json};

const RAMP1: &str = "0.4.ESH10000662.RAMP1";
const ISET1: &str = "0.4.ESH10000662.ISET1";

fn files_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "station-gateway-config-files-{test}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn channel<'a>(channels: &'a Json, name: &str) -> &'a Json {
    channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["netName"] == name)
        .unwrap_or_else(|| panic!("no channel {name} in {channels}"))
}

#[tokio::test]
async fn a_configure_reaches_the_station_and_comes_back_as_the_table_and_one_event() -> Result<()> {
    let rig = rig(|_| {}).await;
    let (mut sse, hello) = Sse::open_hello(&rig).await?;
    let (status, body) = rig
        .post(
            "channels/channel/configure",
            json!({ "NetName": "0.4.ESH10000662.VSET1", "Unit": "kV", "Description": "set point", "Details": { "Gain": 2 } }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["unit"], "kV", "{body}");
    assert_eq!(body["details"]["gain"], 2.0, "{body}");
    // Read back at once: the table holds the station's answer before the request is answered.
    let (_, channels) = rig.get("channels").await;
    let vset = channel(&channels, VSET1);
    assert_eq!(
        (vset["unit"].as_str(), vset["description"].as_str()),
        (Some("kV"), Some("set point"))
    );
    let event = sse
        .next_named("configuration", Duration::from_secs(3))
        .await?
        .data;
    assert_eq!(event["changeType"], "Changed", "{event}");
    assert_eq!(event["generation"], hello["generation"], "{event}");
    // The station itself holds the change: a fresh LIST (a new gateway) sees it.
    let other = start_gateway(config_for(&rig.sim, |_| {})).await;
    let url = format!("{}/api/channels", other.base_url());
    let listed: Json = reqwest::get(url).await?.json().await?;
    assert_eq!(channel(&listed, VSET1)["unit"], "kV");
    // Configuring changes no value: nothing in the station's write log.
    assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
    Ok(())
}

#[tokio::test]
async fn a_load_writes_in_the_station_log_with_outputs_switched_on_last() {
    let dir = files_dir("order");
    let rig = rig(|c| c.config_files.dir = dir.clone()).await;
    let file = format!(
        "format_version = 1\n\
         [[channel]]\nname = \"{ON1}\"\nvalue = \"True\"\n\
         [[channel]]\nname = \"{VSET1}\"\nvalue = \"20\"\n\
         [[channel]]\nname = \"{ISET1}\"\nvalue = \"500\"\n\
         [[channel]]\nname = \"{RAMP1}\"\nvalue = \"100\"\n"
    );
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("on.cfg"), file).unwrap();
    rig.sim.clear_write_log();
    let (status, body) = rig
        .post("application/config/load", json!({ "FileName": "on.cfg" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let written: Vec<String> = rig
        .sim
        .write_log()
        .iter()
        .map(|w| w.channel.clone())
        .collect();
    assert_eq!(written, [VSET1, ISET1, RAMP1, ON1]);
    assert_eq!(body["applied"].as_array().unwrap().len(), 4, "{body}");
    let (_, loaded) = rig.get("application/config/loaded").await;
    assert_eq!(loaded, json!(["on.cfg"]));
    rig.write(ON1, "False").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_load_the_link_fails_partway_says_exactly_what_was_applied() {
    let dir = files_dir("partway");
    // RAMP1's writes take longer than the gateway waits.
    let sim =
        station_with_slow_channels(|name| name == RAMP1, Duration::from_secs(3), |_| {}).await;
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
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("slow.cfg"), file).unwrap();
    rig.sim.clear_write_log();
    let (status, body) = rig
        .post("application/config/load", json!({ "FileName": "slow.cfg" }))
        .await;
    assert_eq!(status, 504, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains(&format!("stopped at step 2 of 3 (write {RAMP1} = 20)")),
        "{message}"
    );
    assert!(
        message.contains(&format!("Applied before it: write {VSET1} = 10.")),
        "{message}"
    );
    assert!(message.contains("and the 1 after it"), "{message}");
    // The station agrees: VSET1 was written, ISET1 never was.
    let written: Vec<String> = rig
        .sim
        .write_log()
        .iter()
        .map(|w| w.channel.clone())
        .collect();
    assert_eq!(
        written.first().map(String::as_str),
        Some(VSET1),
        "{written:?}"
    );
    assert!(!written.iter().any(|c| c == ISET1), "{written:?}");
    let (_, loaded) = rig.get("application/config/loaded").await;
    assert_eq!(
        loaded,
        json!([]),
        "a load that stopped is not listed as loaded"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_saved_file_is_written_atomically_into_the_gateways_own_directory() {
    let dir = files_dir("save");
    let rig = rig(|c| c.config_files.dir = dir.join("nested")).await;
    rig.write(VSET1, "42").await;
    let (status, body) = rig
        .post("application/config/save", json!({ "FileName": "snap.cfg" }))
        .await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<String> = std::fs::read_dir(dir.join("nested"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["snap.cfg"], "no temporary file is left");
    let text = std::fs::read_to_string(dir.join("nested/snap.cfg")).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let vset = table["channel"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some(VSET1))
        .unwrap();
    assert_eq!(vset["value"].as_str(), Some("42"));
    rig.write(VSET1, "0").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_legacy_configure_is_locked_while_the_lease_is_held_and_an_inquiry_is_not() {
    use station_protocol::{Configure, ErrorCode, Request, Response, Value};
    use station_simulator::client::{ClientError, StationClient};
    let rig = legacy_rig(|_| {}).await;
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    client.hello("test").await.unwrap();
    let change = || {
        Request::Configure(Configure {
            name: VSET1.into(),
            settings: vec![("unit".into(), Value::String("mV".into()))],
        })
    };
    let lease = rig.take_lease("sequence A").await;
    match client.request(change()).await {
        Err(ClientError::Station(error)) => {
            assert_eq!(error.code, ErrorCode::Locked);
            assert!(error.message.contains("sequence A"), "{}", error.message);
        }
        other => panic!("expected LOCKED, got {other:?}"),
    }
    let inquiry = Request::Configure(Configure {
        name: VSET1.into(),
        settings: vec![],
    });
    match client.request(inquiry).await.unwrap() {
        Response::Configure(reply) => {
            assert_eq!(reply.channel.unit, "V");
            assert_eq!(reply.config.limits, Some((0.0, 3000.0)));
        }
        other => panic!("expected the configuration, got {other:?}"),
    }
    rig.release_lease(&lease).await;
    match client.request(change()).await.unwrap() {
        Response::Configure(reply) => assert_eq!(reply.channel.unit, "mV"),
        other => panic!("expected the configuration, got {other:?}"),
    }
    let (_, channels) = rig.get("channels").await;
    assert_eq!(channel(&channels, VSET1)["unit"], "mV");
}

#[tokio::test]
async fn a_load_goes_on_to_its_end_when_its_caller_hangs_up() {
    let dir = files_dir("hangup");
    // Each RAMP write takes 200 ms at the station: the load outlasts its caller's patience.
    let sim = station_with_slow_channels(
        |name| name.contains(".RAMP"),
        Duration::from_millis(200),
        |_| {},
    )
    .await;
    let config = config_for(&sim, |c| c.config_files.dir = dir.clone());
    let rig = rig_on(sim, config, false).await;
    let file = (1..=3).fold("format_version = 1\n".to_owned(), |text, n| {
        format!(
            "{text}[[channel]]\nname = \"0.4.ESH10000662.RAMP{n}\"\nvalue = \"{}\"\n",
            10 * n
        )
    });
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ramps.cfg"), file).unwrap();
    rig.sim.clear_write_log();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(rig.gateway.base_url() + "/api/application/config/load")
        .json(&json!({ "FileName": "ramps.cfg" }))
        .send()
        .await;
    assert!(gave_up.is_err(), "the caller was meant to give up first");
    until(
        Duration::from_secs(5),
        "all three writes of the load",
        || rig.sim.write_log().len() == 3,
    )
    .await;
    until(Duration::from_secs(2), "the load listed as loaded", || {
        let generation = rig.gateway.link().info().generation;
        rig.gateway.gateway.config_files.loaded_in(generation) == ["ramps.cfg"]
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every channel's configuration is known from the start (the link asks CONFIGURE's
/// inquiry after LIST), and again after a configuration NOTIFY: a channel the station adds
/// comes with its details by the time the `configuration` event says so.
#[tokio::test]
async fn details_are_known_from_the_start_and_after_a_channel_is_added() -> Result<()> {
    const ADC08: &str = "0.8.ESH10000590.ADC08";
    let rig = rig(|_| {}).await;
    let (status, channels) = rig.get("channels").await;
    assert_eq!(status, 200, "{channels}");
    let configured = |channels: &Json| {
        channels
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| !c["details"].is_null())
            .count()
    };
    let at_start = configured(&channels);
    assert!(
        at_start >= 48,
        "{at_start} channels with details: {channels}"
    );
    assert_eq!(
        channel(&channels, ADC08)["details"]["gain"],
        1.0,
        "{channels}"
    );
    let spec = rig
        .sim
        .profile()
        .channels
        .iter()
        .find(|c| c.descriptor.name == ADC08)
        .cloned()
        .expect("no ADC08 in the default profile");
    let (mut sse, _) = Sse::open_hello(&rig).await?;
    assert!(rig.sim.remove_channel(ADC08));
    sse.next_named("configuration", Duration::from_secs(5))
        .await?;
    assert!(rig.sim.add_channel(spec));
    let added = sse
        .next_named("configuration", Duration::from_secs(5))
        .await?;
    assert_eq!(added.data["changeType"], "Added", "{}", added.data);
    let (_, channels) = rig.get("channels").await;
    assert_eq!(
        channel(&channels, ADC08)["details"]["gain"],
        1.0,
        "{channels}"
    );
    assert_eq!(configured(&channels), at_start, "{channels}");
    Ok(())
}

/// A station slow to answer CONFIGURE's inquiry does not keep the link down: the handshake
/// stops asking, the link comes up with the configurations it has, and the late answer is
/// dropped as late (its id is below the session's).
#[tokio::test]
async fn a_slow_configuration_inquiry_does_not_keep_the_link_down() -> Result<()> {
    let sim = default_simulator().await;
    sim.set_inquiry_delay(Duration::from_millis(1000));
    let config = config_for(&sim, |c| c.station.request_timeout_ms = 300);
    let rig = rig_on(sim, config, false).await;
    let (status, channels) = rig.get("channels").await;
    assert_eq!(status, 200, "{channels}");
    assert!(channels.as_array().unwrap().len() > 50, "{channels}");
    let stats = rig.gateway.link().stats().clone();
    until(
        Duration::from_secs(5),
        "the late inquiry answer dropped",
        || station_gateway::link::LinkStats::get(&stats.late_replies) >= 1,
    )
    .await;
    let (status, body) = rig.read(MON_3V3).await;
    assert_eq!(status, 200, "{body}");
    Ok(())
}
