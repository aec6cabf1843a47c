//! The simulated station's behaviour as a client sees it over TCP: a whole
//! session, errors, trips, bus channels, paging, the write log and profile files.

mod common;

use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use common::*;
use station_protocol::{ChangeType, ErrorCode, Notify, Value};
use station_simulator::{ClientError, Profile, ProfileError};

fn float(value: Value) -> f64 {
    match value {
        Value::Float(x) => x,
        other => panic!("not a float: {other:?}"),
    }
}

fn station_error(
    result: Result<impl std::fmt::Debug, ClientError>,
) -> station_protocol::StationError {
    match result {
        Err(ClientError::Station(error)) => error,
        other => panic!("expected a station error, got {other:?}"),
    }
}

#[tokio::test]
async fn vmon_rises_toward_vset_after_on() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    let hello = client.hello("test").await.unwrap();
    assert_eq!(hello.window, 8);
    assert_eq!(hello.firmware, "6.4.2");
    client.write_one(VSET1, Value::Float(500.0)).await.unwrap();
    let on_sent = Instant::now();
    client.write_one(ON1, Value::Bool(true)).await.unwrap();
    let on_done = Instant::now();
    // RAMP defaults to 50 V/s: each reading lies on that ramp, between what the time since ON
    // could be at the least and at the most (plus the monitor's noise), however slowly the
    // machine runs. Read until it has clearly left 0 V, on its way to 500.
    let rising = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let asked = Instant::now();
            let volts = float(client.read_one(VMON1).await.unwrap());
            let answered = Instant::now();
            let least = 50.0 * asked.saturating_duration_since(on_done).as_secs_f64() - 1.0;
            let most = 50.0 * answered.duration_since(on_sent).as_secs_f64() + 1.0;
            assert!(
                (least..=most).contains(&volts),
                "VMON1 = {volts}, expected {least:.1} to {most:.1} on a 50 V/s ramp"
            );
            if volts > 20.0 {
                return volts;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let volts = rising.await.expect("VMON1 never passed 20 V within 10 s");
    assert!(volts < 500.0, "VMON1 = {volts}");
    let micro_amps = float(client.read_one(IMON1).await.unwrap());
    assert!(
        (micro_amps - volts / 10.0).abs() < 0.5,
        "IMON1 = {micro_amps}"
    );
    assert_eq!(
        client.read_one(STAT1).await.unwrap(),
        Value::Enum("Ramping".into())
    );
    assert_eq!(client.read_one(VSET1).await.unwrap(), Value::Float(500.0));
}

#[tokio::test]
async fn measurements_look_like_the_station() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    let volts = float(client.read_one(MON_3V3).await.unwrap());
    assert!((3.28..=3.32).contains(&volts), "MON_3V3 = {volts}");
    let results = client
        .read(&[
            "Engine.FirmwareRev",
            "TempRegulator.CPU_TEMP",
            "0.7.ESH10000183.5V_EXT_VOLT",
        ])
        .await
        .unwrap();
    assert_eq!(results[0], Ok(Value::String("6.4.2".into())));
    let temp = float(results[1].clone().unwrap());
    assert!((42.0..48.0).contains(&temp), "CPU_TEMP = {temp}");
    let five = float(results[2].clone().unwrap());
    assert!((4.95..5.05).contains(&five), "5V = {five}");
    let modules = client.system().await.unwrap();
    let indexes: Vec<u16> = modules.iter().map(|m| m.index).collect();
    assert_eq!(indexes, [1, 4, 7, 8, 11]);
    assert_eq!(modules[1].product_id, "ESH10000662");
}

#[tokio::test]
async fn errors_carry_clear_messages() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    let error = station_error(client.read_one("No.Such.Channel").await);
    assert_eq!(error.code, ErrorCode::UnknownChannel);
    assert_eq!(error.message, "no such channel: No.Such.Channel");

    let error = station_error(client.write_one(VMON1, Value::Float(5.0)).await);
    assert_eq!(error.code, ErrorCode::ReadOnly);
    assert!(error.message.contains("read only"), "{}", error.message);

    let error = station_error(client.write_one(VSET1, Value::Float(3500.0)).await);
    assert_eq!(error.code, ErrorCode::BadValue);
    assert_eq!(
        error.message,
        "0.4.ESH10000662.VSET1: 3500 is outside 0 to 3000 V"
    );

    // One bad item does not spoil the others.
    let results = client
        .write(vec![
            (VSET1.to_owned(), Value::Float(100.0)),
            ("No.Such.Channel".to_owned(), Value::Float(1.0)),
        ])
        .await
        .unwrap();
    assert!(results[0].is_ok());
    assert_eq!(
        results[1].as_ref().unwrap_err().code,
        ErrorCode::UnknownChannel
    );
}

#[tokio::test]
async fn current_above_the_limit_trips_the_output_and_notifies() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    // 10 µA through HV1's 10 MΩ load is reached at 100 V, 0.1 s into a 1000 V/s ramp.
    client.write_one(ISET1, Value::Float(10.0)).await.unwrap();
    client.write_one(RAMP1, Value::Float(1000.0)).await.unwrap();
    client.write_one(VSET1, Value::Float(500.0)).await.unwrap();
    client.write_one(ON1, Value::Bool(true)).await.unwrap();
    let notify = client
        .next_notification(Duration::from_secs(2))
        .await
        .unwrap();
    match notify {
        Notify::OutputTripped { channel, message } => {
            assert_eq!(channel, ON1);
            assert!(message.contains("tripped"), "{message}");
        }
        other => panic!("expected a trip, got {other:?}"),
    }
    assert_eq!(
        client.read_one(STAT1).await.unwrap(),
        Value::Enum("Trip".into())
    );
    assert_eq!(client.read_one(ON1).await.unwrap(), Value::Bool(false));
    // Writing ON again clears the trip.
    client.write_one(ISET1, Value::Float(100.0)).await.unwrap();
    client.write_one(ON1, Value::Bool(true)).await.unwrap();
    assert_ne!(
        client.read_one(STAT1).await.unwrap(),
        Value::Enum("Trip".into())
    );
}

#[tokio::test]
async fn uart_answers_idn_in_one_transact_and_reads_consume() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    let reply = client
        .transact(UART01, Value::String("*IDN?\n".into()))
        .await
        .unwrap();
    assert_eq!(
        reply,
        Value::String("Simulated Station,HV4,ESH10000662,6.4.2\n".into())
    );
    client
        .write_one(UART01, Value::String("*RST\n".into()))
        .await
        .unwrap();
    assert_eq!(
        client.read_one(UART01).await.unwrap(),
        Value::String("OK\n".into())
    );
    assert_eq!(
        client.read_one(UART01).await.unwrap(),
        Value::String(String::new())
    );
    assert!(sim.reads_of(UART01) >= 3);
}

#[tokio::test]
async fn i2c_reads_return_and_consume_queued_bytes() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    client
        .write_one(I2C09, Value::Bytes(Bytes::from_static(&[0x00])))
        .await
        .unwrap();
    assert_eq!(
        client.read_one(I2C09).await.unwrap(),
        Value::Bytes(Bytes::from_static(&[0x5A]))
    );
    assert_eq!(
        client.read_one(I2C09).await.unwrap(),
        Value::Bytes(Bytes::new())
    );
    let channels = client.list_all().await.unwrap();
    let i2c = channels.iter().find(|c| c.name == I2C09).unwrap();
    assert!(i2c.consuming);
    assert_eq!(i2c.type_flags, 32768);
}

#[tokio::test]
async fn leds_take_colour_names() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    assert_eq!(
        client.read_one(LED_A1).await.unwrap(),
        Value::Enum("Black".into())
    );
    client
        .write_one(LED_A1, Value::Enum("red".into()))
        .await
        .unwrap();
    assert_eq!(
        client.read_one(LED_A1).await.unwrap(),
        Value::Enum("Red".into())
    );
    let error = station_error(client.write_one(LED_A1, Value::Enum("Mauve".into())).await);
    assert_eq!(error.code, ErrorCode::BadValue);
}

#[tokio::test]
async fn list_is_paged_and_complete() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    let (total, first) = client.list_page(0, 10).await.unwrap();
    assert_eq!(first.len(), 10);
    assert_eq!(total as usize, sim.profile().channels.len());
    let (_, last) = client.list_page(total - 3, 10).await.unwrap();
    assert_eq!(last.len(), 3);
    let all = client.list_all().await.unwrap();
    assert_eq!(all, sim.profile().descriptors());
    let stat = all.iter().find(|c| c.name == STAT1).unwrap();
    assert_eq!(stat.options, ["Off", "Ramping", "On", "Trip"]);
}

#[tokio::test]
async fn fifty_names_arrive_in_one_read_frame() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    let names: Vec<String> = sim
        .profile()
        .channels
        .iter()
        .map(|c| c.descriptor.name.clone())
        .filter(|n| n != I2C09 && n != UART01)
        .cycle()
        .take(50)
        .collect();
    assert_eq!(names.len(), 50);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let before = sim.read_frames();
    let results = client.read(&names).await.unwrap();
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(sim.read_frames(), before + 1);
    assert_eq!(sim.read_batch_sizes().last(), Some(&50));
    let asked = names.iter().filter(|n| **n == MON_3V3).count() as u64;
    assert_eq!(sim.reads_of(MON_3V3), asked);
    client.read_one(MON_3V3).await.unwrap();
    assert_eq!(sim.reads_of(MON_3V3), asked + 1);
}

#[tokio::test]
async fn write_log_holds_applied_writes_only() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    client.write_one(VSET1, Value::Float(500.0)).await.unwrap();
    let _ = client.write_one(VSET1, Value::Float(3500.0)).await;
    let _ = client.write_one(VMON1, Value::Float(1.0)).await;
    client
        .write_one(LED_A1, Value::Enum("green".into()))
        .await
        .unwrap();
    let log = sim.write_log();
    let applied: Vec<(&str, &Value)> = log.iter().map(|w| (w.channel.as_str(), &w.value)).collect();
    assert_eq!(
        applied,
        [
            (VSET1, &Value::Float(500.0)),
            (LED_A1, &Value::Enum("Green".into()))
        ]
    );
    assert_eq!(log[0].connection, log[1].connection);
    assert!(log[0].peer.starts_with("127.0.0.1:"), "{}", log[0].peer);
    assert!(log[0].at <= log[1].at);
}

#[tokio::test]
async fn channel_list_changes_are_announced() {
    let sim = start_default().await;
    let mut client = client(&sim).await;
    let before = client.list_all().await.unwrap().len();
    assert!(sim.remove_channel(VMON1));
    let notify = client
        .next_notification(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(matches!(
        notify,
        Notify::ConfigurationChanged {
            change: ChangeType::Removed,
            ..
        }
    ));
    assert_eq!(client.list_all().await.unwrap().len(), before - 1);
    let error = station_error(client.read_one(VMON1).await);
    assert_eq!(error.code, ErrorCode::UnknownChannel);

    let mut descriptor = sim.profile().channels[0].descriptor.clone();
    descriptor.name = "0.12.ESH10000999.NEW".into();
    descriptor.writable = true;
    assert!(sim.add_setting_channel(descriptor));
    let notify = client
        .next_notification(Duration::from_secs(2))
        .await
        .unwrap();
    assert!(matches!(
        notify,
        Notify::ConfigurationChanged {
            change: ChangeType::Added,
            ..
        }
    ));
    client
        .write_one("0.12.ESH10000999.NEW", Value::String("hi".into()))
        .await
        .unwrap();
    assert_eq!(
        client.read_one("0.12.ESH10000999.NEW").await.unwrap(),
        Value::String("hi".into())
    );
}

#[tokio::test]
async fn another_profile_file_changes_the_station_and_a_bad_one_is_refused() {
    let dir = std::env::temp_dir().join(format!("station-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let good = dir.join("small.toml");
    let text = station_simulator::profile::DEFAULT_PROFILE_TOML
        .replace("name = \"Simulated Station\"", "name = \"Bench 7\"")
        .replace("tcp_window = 8", "tcp_window = 2");
    std::fs::write(&good, text).unwrap();
    let profile = Profile::from_file(&good).unwrap();
    let sim = station_simulator::Simulator::start(profile, any_port())
        .await
        .unwrap();
    let hello = client(&sim).await.hello("test").await.unwrap();
    assert_eq!((hello.station.as_str(), hello.window), ("Bench 7", 2));

    let bad = dir.join("bad.toml");
    let text = station_simulator::profile::DEFAULT_PROFILE_TOML
        .replace("load_mohm = 20.0", "load_mohm = \"twenty\"");
    let line = text.lines().position(|l| l.contains("\"twenty\"")).unwrap() + 1;
    std::fs::write(&bad, text).unwrap();
    let error = Profile::from_file(&bad).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, ProfileError::Invalid(_)));
    assert!(message.contains(&bad.display().to_string()), "{message}");
    assert!(message.contains(&format!("line {line}")), "{message}");
    assert!(message.contains("output.load_mohm"), "{message}");

    let missing = Profile::from_file(dir.join("missing.toml")).unwrap_err();
    assert!(missing.to_string().contains("missing.toml"), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The door interlock: a read-only input, closed at start, opened and closed by the control
/// port's `door open` / `door closed`.
#[tokio::test]
async fn the_control_port_opens_and_closes_the_door_interlock() {
    const DOOR: &str = "Interlock.DOOR_CLOSED";
    let sim = start_default().await;
    let mut client = client(&sim).await;
    client.hello("test").await.unwrap();
    assert_eq!(client.read_one(DOOR).await.unwrap(), Value::Bool(true));
    let refused = station_error(client.write_one(DOOR, Value::Bool(false)).await);
    assert_eq!(refused.code, ErrorCode::ReadOnly);
    let answer = station_simulator::control::execute(&sim, "door open").await;
    assert!(answer.starts_with("ok: door open"), "{answer}");
    assert_eq!(client.read_one(DOOR).await.unwrap(), Value::Bool(false));
    let answer = station_simulator::control::execute(&sim, "door closed").await;
    assert!(answer.starts_with("ok: door closed"), "{answer}");
    assert_eq!(client.read_one(DOOR).await.unwrap(), Value::Bool(true));
    let answer = station_simulator::control::execute(&sim, "door ajar").await;
    assert!(answer.starts_with("error: door open|closed"), "{answer}");
}
