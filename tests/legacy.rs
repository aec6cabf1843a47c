//! The legacy byte-protocol listener: a 6.x client (station-cli, or the simulator's client
//! library) pointed at the gateway works as on the station, and is bound by the lease.

mod common;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use common::*;
use station_protocol::{ErrorCode, Value};
use station_simulator::{ClientError, StationClient};

/// The `station-cli` binary of the simulator crate, built if a narrower `cargo test` left it out.
fn station_cli() -> PathBuf {
    let mut dir = std::env::current_exe().unwrap();
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("station-cli");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "-p", "station-simulator", "--bin", "station-cli"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    path
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn station_cli_through_the_gateway_works_and_is_bound_by_the_lease() {
    let rig = legacy_rig(|_| {}).await;
    let cli = |args: &'static [&'static str]| {
        let legacy = rig.legacy;
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(station_cli())
                .arg("--connect")
                .arg(legacy.to_string())
                .args(args)
                .output()
                .unwrap()
        })
    };
    let hello = cli(&["hello"]).await.unwrap();
    assert!(hello.status.success(), "{}", stderr(&hello));
    assert!(stdout(&hello).contains("6.4.2"), "{}", stdout(&hello));
    let list = cli(&["list"]).await.unwrap();
    assert!(list.status.success());
    assert!(stdout(&list).contains(VMON1));
    let read = cli(&["read", MON_3V3]).await.unwrap();
    let volts: f64 = stdout(&read).trim().parse().unwrap();
    assert!((volts - 3.3).abs() < 0.1);
    let write = cli(&["write", VSET1, "12"]).await.unwrap();
    assert!(write.status.success(), "{}", stderr(&write));
    assert!(
        rig.sim
            .write_log()
            .iter()
            .any(|w| w.channel == VSET1 && w.value == Value::Float(12.0))
    );

    let lease = rig.take_lease("TAT station 3").await;
    let refused = cli(&["write", VSET1, "13"]).await.unwrap();
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("TAT station 3"),
        "{}",
        stderr(&refused)
    );
    assert!(
        !rig.sim
            .write_log()
            .iter()
            .any(|w| w.value == Value::Float(13.0)),
        "a locked write reached the station"
    );
    let read = cli(&["read", VMON1]).await.unwrap();
    assert!(read.status.success(), "{}", stderr(&read));
    let consuming = cli(&["read", "0.ESH10000023.UART01"]).await.unwrap();
    assert!(
        !consuming.status.success(),
        "a consuming read passed while the lease was held"
    );

    rig.release_lease(&lease).await;
    let write = cli(&["write", VSET1, "14"]).await.unwrap();
    assert!(write.status.success(), "{}", stderr(&write));
    assert!(
        rig.sim
            .write_log()
            .iter()
            .any(|w| w.value == Value::Float(14.0))
    );
}

#[tokio::test]
async fn while_the_lease_is_held_legacy_reads_come_from_the_cache_and_writes_get_locked() {
    let rig = legacy_rig(|c| c.legacy.read_max_age_ms = 60_000).await;
    let mut client = StationClient::connect(rig.legacy).await.unwrap();
    client.hello("test").await.unwrap();
    client.read_one(MON_3V3).await.unwrap();
    let _lease = rig.take_lease("sequence A").await;
    let before = rig.sim.reads_of(MON_3V3);
    for _ in 0..5 {
        client.read_one(MON_3V3).await.unwrap();
    }
    assert_eq!(
        rig.sim.reads_of(MON_3V3),
        before,
        "cached reads went to the hardware"
    );
    match client.write_one(VSET1, Value::Float(7.0)).await {
        Err(ClientError::Station(error)) => {
            assert_eq!(error.code, ErrorCode::Locked);
            assert!(error.message.contains("sequence A"), "{}", error.message);
        }
        other => panic!("expected LOCKED, got {other:?}"),
    }
    match client
        .transact("0.ESH10000023.UART01", Value::String("*IDN?\n".into()))
        .await
    {
        Err(ClientError::Station(error)) => assert_eq!(error.code, ErrorCode::Locked),
        other => panic!("expected LOCKED, got {other:?}"),
    }
}

#[tokio::test]
async fn fifty_legacy_clients_reading_different_channels_each_get_their_own_answers() {
    let rig = legacy_rig(|_| {}).await;
    // Give each client a set point of its own, then have all fifty read theirs at once.
    let set_points: Vec<(String, f64)> = (0..50)
        .map(|i| {
            let channel = ["VSET1", "VSET2", "VSET3", "VSET4"][i % 4];
            (format!("0.4.ESH10000662.{channel}"), 0.0)
        })
        .collect();
    let mut writer = StationClient::connect(rig.legacy).await.unwrap();
    for (i, name) in ["VSET1", "VSET2", "VSET3", "VSET4"].iter().enumerate() {
        writer
            .write_one(
                &format!("0.4.ESH10000662.{name}"),
                Value::Float(100.0 * (i + 1) as f64),
            )
            .await
            .unwrap();
    }
    let names: Vec<String> = rig
        .gateway
        .link()
        .info()
        .channels
        .channels
        .iter()
        .filter(|c| c.readable && !c.consuming)
        .map(|c| c.name.clone())
        .collect();
    let tasks = (0..50).map(|i| {
        let addr = rig.legacy;
        let name = if i < 4 {
            set_points[i].0.clone()
        } else {
            names[i % names.len()].clone()
        };
        tokio::spawn(async move {
            let mut client = StationClient::connect(addr).await.unwrap();
            let mut values = Vec::new();
            for _ in 0..5 {
                values.push(
                    client
                        .read(&[name.as_str()])
                        .await
                        .unwrap()
                        .remove(0)
                        .unwrap(),
                );
            }
            (i, name, values)
        })
    });
    for result in futures::future::join_all(tasks).await {
        let (i, name, values) = result.unwrap();
        let descriptor = rig
            .gateway
            .link()
            .info()
            .channels
            .get(&name)
            .cloned()
            .unwrap();
        for value in &values {
            assert_eq!(
                value.value_type(),
                descriptor.value_type,
                "client {i} got a value of another channel"
            );
        }
        if i < 4 {
            assert_eq!(
                values[0],
                Value::Float(100.0 * (i + 1) as f64),
                "client {i} reading {name}"
            );
        }
        if name == "Engine.FirmwareRev" {
            assert_eq!(values[0], Value::String("6.4.2".into()));
        }
    }
}

#[tokio::test]
async fn garbage_from_one_client_drops_that_client_only_and_notifications_reach_everyone() {
    let rig = legacy_rig(|_| {}).await;
    let mut good = StationClient::connect(rig.legacy).await.unwrap();
    good.hello("good").await.unwrap();
    // Random bytes, then a frame with an opcode that is not a request.
    let mut bad = tokio::net::TcpStream::connect(rig.legacy).await.unwrap();
    use tokio::io::AsyncWriteExt;
    bad.write_all(&[
        0xA5, 0x5A, 0x01, 0xFF, 0, 0, 0, 0, 0, 200, 1, 2, 3, 4, 5, 6, 7,
    ])
    .await
    .unwrap();
    let unknown = station_protocol::RawFrame {
        opcode: 0x42,
        request_id: 9,
        payload: bytes::Bytes::new(),
    };
    bad.write_all(&unknown.to_bytes().unwrap()).await.unwrap();
    let mut reader = tokio_util::codec::FramedRead::new(bad, station_protocol::StationCodec::new());
    use futures::StreamExt;
    let reply = tokio::time::timeout(Duration::from_secs(2), reader.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply.request_id, 9);
    match station_protocol::Response::from_frame(&reply).unwrap() {
        station_protocol::Response::Error(error) => assert_eq!(error.code, ErrorCode::Unsupported),
        other => panic!("{other:?}"),
    }
    assert!(
        (good
            .read_one(MON_3V3)
            .await
            .unwrap()
            .render()
            .parse::<f64>()
            .unwrap()
            - 3.3)
            .abs()
            < 0.1
    );
    // A channel-list change on the station reaches the legacy client as a NOTIFY.
    assert!(rig.sim.remove_channel("0.8.ESH10000590.ADC08"));
    let notify = good
        .next_notification(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        matches!(
            notify,
            station_protocol::Notify::ConfigurationChanged { .. }
        ),
        "{notify:?}"
    );
}

#[tokio::test]
async fn writes_to_made_up_channel_names_are_refused_and_do_not_grow_the_cache() {
    let rig = legacy_rig(|_| {}).await;
    let mut client = StationClient::connect(rig.legacy).await.unwrap();
    let slots_before = rig.gateway.link().cache().len();
    for batch in 0..20 {
        let items: Vec<(String, Value)> = (0..50)
            .map(|i| (format!("No.Such.Channel{batch}_{i}"), Value::Float(1.0)))
            .collect();
        let results = client.write(items).await.unwrap();
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(e) if e.code == ErrorCode::UnknownChannel))
        );
    }
    assert_eq!(rig.gateway.link().cache().len(), slots_before);
}
