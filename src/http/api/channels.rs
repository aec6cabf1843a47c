//! `api/channels...`: the station's channel list in the contract's shape, and the lookup by
//! alias or net name.

use serde_json::{Value as Json, json};
use station_protocol::ChannelDescriptor;

use super::call::{Answer, Call, known_channels, ok};
use crate::error::ApiError;

/// `GET api/channels`.
pub(super) async fn list(call: Call<'_>) -> Answer {
    let channels = known_channels(call.gateway)?;
    ok(Json::Array(
        channels
            .channels
            .iter()
            .enumerate()
            .map(|(i, ch)| channel_json(i, ch))
            .collect(),
    ))
}

/// `POST api/channels/channel {Alias | NetName}`.
pub(super) async fn lookup(call: Call<'_>) -> Answer {
    let (channels, body) = (known_channels(call.gateway)?, &call.body);
    let (field, wanted) = match (body.get("Alias"), body.get("NetName")) {
        (Some(_), _) => ("alias", body.string("Alias")?),
        (None, Some(_)) => ("net name", body.string("NetName")?),
        (None, None) => return Err(ApiError::bad_request("give the field Alias or NetName")),
    };
    let found = channels
        .channels
        .iter()
        .enumerate()
        .find(|(_, ch)| match field {
            "alias" => ch.alias == wanted,
            _ => ch.net_name == wanted,
        });
    match found {
        Some((position, ch)) => ok(channel_json(position, ch)),
        None => Err(ApiError::not_found(format!(
            "no channel with the {field} {wanted:?}"
        ))),
    }
}

/// Names of the channel type flags, as the REST contract's `channelType` lists them.
const TYPE_FLAG_NAMES: &[(u32, &str)] = &[
    (1, "Analog"),
    (1 << 1, "Digital"),
    (1 << 2, "VirtualDigital"),
    (1 << 3, "Temperature"),
    (1 << 4, "Multiplexer"),
    (1 << 5, "Resistance"),
    (1 << 6, "Counter"),
    (1 << 7, "Frequency"),
    (1 << 8, "Actuator"),
    (1 << 10, "Register"),
    (1 << 11, "Current"),
    (1 << 12, "Ratiometric"),
    (1 << 13, "UART"),
    (1 << 14, "SPI"),
    (1 << 15, "I2C"),
    (1 << 16, "ByteStream"),
    (1 << 17, "Socket"),
    (1 << 19, "NumericResult"),
    (1 << 24, "Instrument"),
];

/// `"Analog, Current"` for the flags set.
fn type_flag_names(flags: u32) -> String {
    let names: Vec<&str> = TYPE_FLAG_NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        "Undefined".into()
    } else {
        names.join(", ")
    }
}

/// The contract's channel object for one descriptor.
fn channel_json(position: usize, ch: &ChannelDescriptor) -> Json {
    let usage = if ch.consuming {
        "BusSignal"
    } else if ch.writable {
        "UserAllocatable"
    } else {
        "ReadOnlySystemControl"
    };
    let device = ch
        .name
        .rsplit_once('.')
        .map(|(device, _)| device)
        .unwrap_or("");
    json!({
        "channelIndex": position,
        "index": position,
        "enabled": true,
        "usage": usage,
        "deviceName": device,
        "channelType": type_flag_names(ch.type_flags),
        "channelTypeCapability": type_flag_names(ch.type_flags),
        "alias": ch.alias,
        "netName": ch.net_name,
        "groupName": ch.group,
        "capability": ch.direction.label(),
        "description": ch.description,
        "direction": ch.direction.label(),
        "directionChanged": false,
        "defaultDirection": ch.direction.label(),
        "unit": ch.unit,
        "isVirtual": false,
        "details": {
            "name": ch.name,
            "valueType": ch.value_type.name(),
            "readable": ch.readable,
            "writable": ch.writable,
            "readConsumesData": ch.consuming,
            "options": ch.options,
        },
    })
}
