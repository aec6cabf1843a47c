//! The legacy byte-protocol listener: a 6.x client (station-cli, or the simulator's client
//! library) pointed at the gateway works as on the station, and is bound by the lease.

use crate::common;

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
        let legacy = rig.legacy();
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
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
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

/// The eight set points of the default station: writable floats whose value is what was
/// written, so every read of them has one exact expected answer.
fn set_points() -> Vec<String> {
    ["VSET", "ISET"]
        .iter()
        .flat_map(|kind| (1..=4).map(move |n| format!("0.4.ESH10000662.{kind}{n}")))
        .collect()
}

#[tokio::test]
async fn fifty_legacy_clients_reading_different_channels_each_get_their_own_answers() {
    let rig = legacy_rig(|_| {}).await;
    // Each set point gets a value of its own...
    let channels = set_points();
    let value_of = |k: usize| Value::Float(10.0 * (k + 1) as f64);
    let mut writer = StationClient::connect(rig.legacy()).await.unwrap();
    for (k, name) in channels.iter().enumerate() {
        writer.write_one(name, value_of(k)).await.unwrap();
    }
    // ...and each of fifty clients reads its own ordered pair of them (8 x 7 = 56 pairs), five
    // times, all at once: an answer crossed between clients shows as a wrong pair.
    let pairs: Vec<(usize, usize)> = (0..8)
        .flat_map(|a| (0..8).filter(move |&b| b != a).map(move |b| (a, b)))
        .take(50)
        .collect();
    let tasks = pairs.iter().copied().enumerate().map(|(i, (a, b))| {
        let addr = rig.legacy();
        let names = [channels[a].clone(), channels[b].clone()];
        tokio::spawn(async move {
            let mut client = StationClient::connect(addr).await.unwrap();
            let mut answers = Vec::new();
            for _ in 0..5 {
                let values: Vec<Value> = client
                    .read(&[names[0].as_str(), names[1].as_str()])
                    .await
                    .unwrap()
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
                answers.push(values);
            }
            (i, (a, b), answers)
        })
    });
    for result in within(
        Duration::from_secs(30),
        "fifty legacy clients' reads",
        futures::future::join_all(tasks),
    )
    .await
    {
        let (i, (a, b), answers) = result.unwrap();
        for values in answers {
            assert_eq!(
                values,
                vec![value_of(a), value_of(b)],
                "client {i} reading {} and {}",
                channels[a],
                channels[b]
            );
        }
    }
}

#[tokio::test]
async fn garbage_from_one_client_is_skipped_or_refused_and_notifications_reach_every_client() {
    let rig = legacy_rig(|_| {}).await;
    let mut good = Vec::new();
    for n in 0..3 {
        let mut client = StationClient::connect(rig.legacy()).await.unwrap();
        client.hello(&format!("good {n}")).await.unwrap();
        good.push(client);
    }
    // Random bytes, then a frame with an opcode that is not a request.
    let mut bad = tokio::net::TcpStream::connect(rig.legacy()).await.unwrap();
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
    let mut reader = tokio_util::codec::Framed::new(bad, station_protocol::StationCodec::new());
    use futures::{SinkExt, StreamExt};
    let reply = within(
        Duration::from_secs(2),
        "an answer to the bad frame",
        reader.next(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(reply.request_id, 9);
    match station_protocol::Response::from_frame(&reply).unwrap() {
        station_protocol::Response::Error(error) => assert_eq!(error.code, ErrorCode::Unsupported),
        other => panic!("{other:?}"),
    }
    // The garbage was skipped (the codec resynchronised on the next frame), not taken as a
    // request: the same connection is still served, and nothing was written.
    let read = station_protocol::Request::Read {
        names: vec![MON_3V3.to_owned()],
    };
    reader.send(read.to_frame(10).unwrap()).await.unwrap();
    let reply = within(
        Duration::from_secs(2),
        "an answer after the garbage",
        reader.next(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(reply.request_id, 10);
    assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
    for client in &mut good {
        let volts: f64 = client
            .read_one(MON_3V3)
            .await
            .unwrap()
            .render()
            .parse()
            .unwrap();
        assert!((volts - 3.3).abs() < 0.1, "{volts}");
    }
    // A channel-list change on the station reaches every legacy client as a NOTIFY.
    assert!(rig.sim.remove_channel("0.8.ESH10000590.ADC08"));
    for (n, client) in good.iter_mut().enumerate() {
        let notify = client
            .next_notification(Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("client {n}: no NOTIFY: {e}"));
        assert!(
            matches!(
                notify,
                station_protocol::Notify::ConfigurationChanged { .. }
            ),
            "client {n}: {notify:?}"
        );
    }
}

/// Reads the first frame a refused connection gets, then expects the gateway to close it.
async fn refusal_of(addr: std::net::SocketAddr) -> Option<station_protocol::RawFrame> {
    use futures::StreamExt;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut reader =
        tokio_util::codec::FramedRead::new(stream, station_protocol::StationCodec::new());
    let first = within(Duration::from_secs(5), "the refusal", reader.next())
        .await
        .map(|frame| frame.unwrap());
    if first.is_some() {
        let end = within(
            Duration::from_secs(5),
            "the refused connection to close",
            reader.next(),
        )
        .await;
        assert!(end.is_none(), "the refused connection stayed open: {end:?}");
    }
    first
}

#[tokio::test]
async fn a_client_not_on_the_allow_list_is_closed_unserved_and_counted() {
    let rig = legacy_rig(|c| c.legacy.allow = vec!["10.200.0.1".into()]).await;
    assert!(
        refusal_of(rig.legacy()).await.is_none(),
        "a client not on legacy.allow got a frame"
    );
    let metrics = &rig.gateway.gateway.metrics;
    assert_eq!(metrics.legacy_refused.get(), 1);
    assert_eq!(metrics.legacy_connections.get(), 0);
    // On the list: served.
    let rig = legacy_rig(|c| c.legacy.allow = vec!["10.200.0.1".into(), "127.0.0.1".into()]).await;
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    client.hello("allowed").await.unwrap();
    assert_eq!(rig.gateway.gateway.metrics.legacy_refused.get(), 0);
}

#[tokio::test]
async fn clients_past_the_limit_get_busy_and_are_counted_and_a_freed_place_is_taken_again() {
    let rig = legacy_rig(|c| c.legacy.max_clients = 2).await;
    let gateway = rig.gateway.gateway.clone();
    let metrics = &gateway.metrics;
    let mut first = StationClient::connect(rig.legacy()).await.unwrap();
    first.hello("first").await.unwrap();
    let mut second = StationClient::connect(rig.legacy()).await.unwrap();
    second.hello("second").await.unwrap();
    let frame = refusal_of(rig.legacy())
        .await
        .expect("no answer past the limit");
    match station_protocol::Response::from_frame(&frame).unwrap() {
        station_protocol::Response::Error(error) => {
            assert_eq!(error.code, ErrorCode::Busy);
            assert!(
                error.message.contains("too many legacy clients"),
                "{}",
                error.message
            );
        }
        other => panic!("expected BUSY, got {other:?}"),
    }
    assert_eq!(metrics.legacy_refused.get(), 1);
    assert_eq!(metrics.legacy_connections.get(), 2);
    // The first leaves: once the gateway has seen it go, a new client is served.
    drop(first);
    until(
        Duration::from_secs(5),
        "the first client's place freed",
        || metrics.legacy_clients.get() == 1,
    )
    .await;
    let mut third = StationClient::connect(rig.legacy()).await.unwrap();
    third.hello("third").await.unwrap();
    second.read_one(MON_3V3).await.unwrap();
    let text = reqwest::get(format!("{}/metrics", rig.gateway.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.lines()
            .any(|l| l == "station_gateway_legacy_refused_total 1"),
        "{text}"
    );
}

#[tokio::test]
async fn writes_to_made_up_channel_names_are_refused_and_do_not_grow_the_cache() {
    let rig = legacy_rig(|_| {}).await;
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
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

/// RESET from a legacy client is a change: LOCKED (and nothing sent) while the lease is held,
/// carried out through the link while nobody holds it.
#[tokio::test]
async fn a_legacy_reset_is_a_change_under_the_lease() {
    use station_protocol::{Request, Reset, Response};
    let rig = legacy_rig(|_| {}).await;
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    client.hello("test").await.unwrap();
    let reset = || {
        Request::Reset(Reset {
            requester: "legacy test".into(),
        })
    };
    let lease = rig.take_lease("sequence B").await;
    match client.request(reset()).await {
        Ok(Response::Error(error)) => {
            assert_eq!(error.code, ErrorCode::Locked);
            assert!(error.message.contains("sequence B"), "{}", error.message);
        }
        Err(ClientError::Station(error)) => assert_eq!(error.code, ErrorCode::Locked),
        other => panic!("expected LOCKED, got {other:?}"),
    }
    assert_eq!(rig.sim.resets(), 0, "a locked RESET reached the station");
    rig.release_lease(&lease).await;
    let generation = rig.gateway.link().info().generation;
    assert!(matches!(client.request(reset()).await, Ok(Response::Reset)));
    assert_eq!(rig.sim.resets(), 1);
    rig.reconnected_after(generation).await;
}

/// Names resolve in one place for every front end, the legacy port too: a channel's
/// alias reads, writes and transacts like its name.
#[tokio::test]
async fn a_legacy_client_reads_writes_and_transacts_by_alias() {
    const VSET3: &str = "0.4.ESH10000662.VSET3";
    let rig = legacy_rig(|_| {}).await;
    let (status, body) = rig
        .post(
            "channels/channel/configure",
            serde_json::json!({ "NetName": VSET3, "Alias": "Bench VSET3" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let mut client = StationClient::connect(rig.legacy()).await.unwrap();
    client
        .write_one("Bench VSET3", Value::Float(9.0))
        .await
        .unwrap();
    assert!(
        rig.sim
            .write_log()
            .iter()
            .any(|w| w.channel == VSET3 && w.value == Value::Float(9.0))
    );
    assert_eq!(
        client.read_one("Bench VSET3").await.unwrap(),
        Value::Float(9.0)
    );
    assert_eq!(
        client
            .transact("Bench VSET3", Value::Float(10.0))
            .await
            .unwrap(),
        Value::Float(10.0)
    );
    assert_eq!(client.read_one(VSET3).await.unwrap(), Value::Float(10.0));
    // An alias that is another channel's name is refused, naming both, and never sent.
    let clash = station_protocol::Request::Configure(station_protocol::Configure {
        name: "Bench VSET3".into(),
        settings: vec![("alias".into(), Value::String(VSET1.into()))],
    });
    match client.request(clash).await {
        Err(ClientError::Station(error)) => {
            assert_eq!(error.code, ErrorCode::BadSettings, "{error:?}");
            assert!(
                error.message.contains(VSET3) && error.message.contains(VSET1),
                "{}",
                error.message
            );
        }
        other => panic!("a clashing alias was answered {other:?}"),
    }
    let (_, channels) = rig.get("channels").await;
    let vset3 = channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["netName"] == VSET3)
        .unwrap();
    assert_eq!(vset3["alias"], "Bench VSET3");
}
