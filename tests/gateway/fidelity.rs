//! Answers as the reference clients' own sources say a station's WebApi gives them: every
//! `ChannelTypes` name the .NET client sends (`WebApiClient/Models/Enums.cs`) read as its type
//! and a type the channel cannot hold refused saying so (`docs/api/channels.md`: within the
//! channel's `ChannelTypeCapability`), and a bus device or a list entry naming no channel 404
//! (`docs/error-handling.md`: "404 Not Found: Channel, resource, or config file does not
//! exist").

use serde_json::{Value as Json, json};

use crate::common::{VSET1, rig};

/// The default profile's buses and a NumericResult channel.
const I2C: &str = "0.ESH10000023.I2C09";
const NUMERIC: &str = "0.1.ESH10000158.NumericResult";

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
