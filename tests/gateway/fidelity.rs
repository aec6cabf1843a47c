//! Answers as the reference clients' own sources say a station's WebApi gives them: every
//! `ChannelTypes` name the .NET client sends (`WebApiClient/Models/Enums.cs`) read as its type
//! and a type the channel cannot hold refused saying so (`docs/api/channels.md`: within the
//! channel's `ChannelTypeCapability`), and a bus device or a list entry naming no channel 404
//! (`docs/error-handling.md`: "404 Not Found: Channel, resource, or config file does not
//! exist"); an acquisition the station times itself follows its own time up to
//! `station.max_operation_ms`, not one request's timeout.

use serde_json::{Value as Json, json};

use crate::common::{VSET1, rig};

/// The default profile's buses and a NumericResult channel (10 kHz) with one of its targets.
const I2C: &str = "0.ESH10000023.I2C09";
const UART: &str = "0.ESH10000023.UART01";
const NUMERIC: &str = "0.1.ESH10000158.NumericResult";
const MON_3V3: &str = "0.1.ESH10000158.MON_3V3";

/// Every name of the .NET client's `ChannelTypes` but `Undefined`, in its order.
const CHANNEL_TYPE_NAMES: [&str; 26] = [
    "Analog",
    "Digital",
    "VirtualDigital",
    "Temperature",
    "Multiplexer",
    "Resistance",
    "Counter",
    "Frequency",
    "Actuator",
    "Register",
    "Current",
    "Ratiometric",
    "UART",
    "SPI",
    "I2C",
    "ByteStream",
    "Socket",
    "Waveform",
    "NumericResult",
    "PseudoDigital",
    "Image",
    "Audio",
    "Video",
    "Instrument",
    "NumericResults",
    "Calibration",
];

fn channel<'a>(channels: &'a Json, name: &str) -> &'a Json {
    channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["netName"] == name)
        .unwrap_or_else(|| panic!("no channel {name} in {channels}"))
}

#[tokio::test]
async fn every_channel_type_name_of_the_dotnet_client_is_a_type_and_one_a_channel_cannot_hold_says_so()
 {
    let rig = rig(|_| {}).await;
    // The NumericResult channel is given its own type by name: nothing to change, 200.
    let (status, body) = rig
        .post(
            "channels/channel/configure",
            json!({ "NetName": NUMERIC, "ChannelType": "NumericResult" }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["channelType"], 1 << 19, "{body}");
    // Every name is read as a type: the channel holds it (200) or the answer says it cannot.
    for name in CHANNEL_TYPE_NAMES {
        let (status, body) = rig
            .post(
                "channels/channel/configure",
                json!({ "NetName": NUMERIC, "ChannelType": name }),
            )
            .await;
        let message = body["error"].as_str().unwrap_or_default();
        match name {
            "NumericResult" => assert_eq!(status, 200, "{name}: {body}"),
            _ => {
                assert_eq!(status, 400, "{name}: {body}");
                assert!(
                    message.contains(&format!("cannot hold {name}")),
                    "{name}: {message}"
                );
            }
        }
    }
    // A type whose operations the byte protocol lacks says that too, in a list as alone.
    let (status, body) = rig
        .post(
            "channels/configure",
            json!([
                { "NetName": VSET1, "Description": "not to be kept" },
                { "NetName": VSET1, "ChannelType": "Analog, Image" },
            ]),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.starts_with("entry 2: ")
            && message.contains("cannot hold Image")
            && message.contains("no operations for media"),
        "{message}"
    );
    // `Undefined` is the enum's too, and no type: said so.
    let (status, body) = rig
        .post(
            "channels/channel/configure",
            json!({ "NetName": VSET1, "ChannelType": "Undefined" }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("no type"),
        "{body}"
    );
    let (_, channels) = rig.get("channels").await;
    assert_ne!(channel(&channels, VSET1)["description"], "not to be kept");
    assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
}

#[tokio::test]
async fn a_bus_device_no_channel_is_is_404_and_one_of_another_bus_400() {
    let rig = rig(|_| {}).await;
    for (path, body) in [
        (
            "comm/i2c",
            json!({ "DeviceName": "No.Such.Bus", "Address": "50", "Action": "Scan" }),
        ),
        (
            "comm/spi",
            json!({ "DeviceName": "No.Such.Bus", "Action": "Receive", "NumberOfBytesToReceive": 1 }),
        ),
        (
            "comm/uart",
            json!({ "DeviceName": "No.Such.Bus", "Action": "Receive", "BaudRate": 9600 }),
        ),
    ] {
        let (status, answer) = rig.post(path, body).await;
        assert_eq!(status, 404, "{path}: {answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .contains("DeviceName: no such device: \"No.Such.Bus\""),
            "{answer}"
        );
    }
    // A channel that exists but is not that kind of bus stays a bad field.
    let (status, answer) = rig
        .post(
            "comm/spi",
            json!({ "DeviceName": I2C, "Action": "Receive", "NumberOfBytesToReceive": 1 }),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
}

#[tokio::test]
async fn a_list_with_an_entry_naming_no_channel_is_404_as_one_alone_and_changes_nothing() {
    let rig = rig(|_| {}).await;
    let (status, alone) = rig
        .post(
            "channels/channel/configure",
            json!({ "NetName": "NO_SUCH_NET", "Unit": "V" }),
        )
        .await;
    assert_eq!(status, 404, "{alone}");
    let (status, listed) = rig
        .post(
            "channels/configure",
            json!([
                { "NetName": VSET1, "Description": "changed by a bad list" },
                { "NetName": "NO_SUCH_NET", "Unit": "V" },
            ]),
        )
        .await;
    assert_eq!(status, 404, "{listed}");
    assert_eq!(
        listed["error"],
        format!("entry 2: {}", alone["error"].as_str().unwrap()),
        "{listed}"
    );
    let (_, channels) = rig.get("channels").await;
    assert_ne!(
        channel(&channels, VSET1)["description"],
        "changed by a bad list"
    );
}

/// An acquisition the station times itself follows its own time, not one request's timeout
/// (neither client caps `Samples`: the .NET client's `NumericResultModels.cs`, accordionq2's
/// `numeric_results.py`): 10 000 samples at 10 kHz (1 s) with a request timeout of 500 ms are
/// measured, in frames that each come within half a request timeout.
#[tokio::test]
async fn a_measurement_longer_than_the_request_timeout_follows_its_own_time() {
    let rig = rig(|config| config.station.request_timeout_ms = 500).await;
    let started = std::time::Instant::now();
    let (status, body) = rig
        .post(
            "numeric-results/measure",
            json!({
                "ChannelNetName": NUMERIC, "TargetNetName": MON_3V3,
                "Samples": 10_000, "ReducedSet": false,
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["sampleCount"], 10_000, "{body}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    let (status, samples) = rig
        .get(&format!("numeric-results/result/samples?channel={NUMERIC}"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(samples.as_array().map(Vec::len), Some(10_000));
}

/// Past `station.max_operation_ms` an operation the station times itself is refused before
/// anything is sent, naming the key: an acquisition (with the largest count that fits) and a
/// UART receive's `TimeoutMs`.
#[tokio::test]
async fn an_operation_longer_than_max_operation_ms_is_400_naming_it() {
    let rig = rig(|config| config.station.max_operation_ms = 1_000).await;
    let (status, body) = rig
        .post(
            "numeric-results/measure",
            json!({ "ChannelNetName": NUMERIC, "TargetNetName": MON_3V3, "Samples": 50_000 }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("station.max_operation_ms = 1000 ms")
            && message.contains("at most 10000 samples fit"),
        "{message}"
    );
    let (status, body) = rig
        .post(
            "comm/uart",
            json!({
                "DeviceName": UART, "Action": "Receive", "BaudRate": 9600,
                "NumberOfBytesToReceive": 8, "TimeoutMs": 1_001,
            }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("0 to 1000") && message.contains("(station.max_operation_ms)"),
        "{message}"
    );
    assert!(rig.sim.write_log().is_empty(), "{:?}", rig.sim.write_log());
}

/// A lease's end waits for an acquisition of it only until the station has started it (its
/// first samples): what follows is data, nothing the station could still change. A safe stop
/// pressed 300 ms into a 3 s measurement under the lease is answered well before the
/// measurement ends, and the measurement still delivers every sample to its caller.
#[tokio::test]
async fn a_safe_stop_during_a_long_acquisition_does_not_wait_for_it_to_end() {
    let rig = rig(|config| {
        config.station.request_timeout_ms = 500;
        config.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: "0.4.ESH10000662.ON1".into(),
            value: "False".into(),
        }];
    })
    .await;
    let lease = rig.take_lease("TAT station 3").await;
    let measuring = {
        let http = rig.http.clone();
        let url = rig.url("numeric-results/measure");
        let lease = lease.clone();
        tokio::spawn(async move {
            let response = http
                .post(url)
                .header("X-Lease-Id", lease)
                .json(&json!({
                    "ChannelNetName": NUMERIC, "TargetNetName": MON_3V3,
                    "Samples": 30_000, "ReducedSet": false,
                }))
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), std::time::Instant::now())
        })
    };
    // Once the station works on it (its first samples come within half a request timeout).
    crate::common::until(
        std::time::Duration::from_secs(10),
        "the acquisition to be at the station",
        || rig.sim.requests_in_progress() > 0,
    )
    .await;
    let pressed = std::time::Instant::now();
    let response = rig
        .http
        .post(format!("{}/v1/safe-stop", rig.gateway.base_url()))
        .json(&json!({ "Reason": "drill" }))
        .send()
        .await
        .unwrap();
    let answered = std::time::Instant::now();
    let status = response.status().as_u16();
    let body: Json = response.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (measured, ended) = measuring.await.unwrap();
    assert!(
        answered < ended,
        "the safe stop was answered {:?} after it was pressed, once the 3 s acquisition had ended: its lease's end waited for the whole acquisition",
        answered - pressed
    );
    assert_eq!(measured, 200, "the measurement runs to its end");
}
