//! `api/channels...`: the station's channel list in the contract's shape, and the lookup by
//! alias or net name.

use serde_json::{Value as Json, json};
use station_protocol::{ChannelConfig, ChannelDescriptor};

use super::call::{Answer, Call, known_channels, ok};
use super::channel_config::detail_json;
use crate::config_files::settings::type_names;
use crate::error::ApiError;

/// `GET api/channels`.
pub(super) async fn list(call: Call<'_>) -> Answer {
    let channels = known_channels(call.gateway)?;
    ok(Json::Array(
        channels
            .channels
            .iter()
            .enumerate()
            .map(|(i, ch)| channel_json(i, ch, channels.config(&ch.name)))
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
        Some((position, ch)) => ok(channel_json(position, ch, channels.config(&ch.name))),
        None => Err(ApiError::not_found(format!(
            "no channel with the {field} {wanted:?}"
        ))),
    }
}

/// The contract's channel object for one descriptor, with its configuration when the station
/// has told it (CONFIGURE): enabled, device, capabilities and type-specific details.
pub(super) fn channel_json(
    position: usize,
    ch: &ChannelDescriptor,
    config: Option<&ChannelConfig>,
) -> Json {
    let usage = if ch.consuming {
        "BusSignal"
    } else if ch.writable {
        "UserAllocatable"
    } else {
        "ReadOnlySystemControl"
    };
    let device = match config {
        Some(config) => config.device.clone(),
        None => ch
            .name
            .rsplit_once('.')
            .map(|(device, _)| device.to_owned())
            .unwrap_or_default(),
    };
    let capability = config.map(|c| c.capability).unwrap_or(ch.direction);
    let type_capability = config.map(|c| c.type_capability).unwrap_or(ch.type_flags);
    let mut details = json!({
        "name": ch.name,
        "valueType": ch.value_type.name(),
        "readable": ch.readable,
        "writable": ch.writable,
        "readConsumesData": ch.consuming,
        "options": ch.options,
    });
    for (key, value) in config.iter().flat_map(|c| &c.details) {
        details[lower_camel(key)] = detail_json(value);
    }
    json!({
        "channelIndex": position,
        "index": position,
        "enabled": config.is_none_or(|c| c.enabled),
        "usage": usage,
        "deviceName": device,
        "channelType": type_names(ch.type_flags),
        "channelTypeCapability": type_names(type_capability),
        "alias": ch.alias,
        "netName": ch.net_name,
        "groupName": ch.group,
        "capability": capability.label(),
        "description": ch.description,
        "direction": ch.direction.label(),
        "directionChanged": false,
        "defaultDirection": ch.direction.label(),
        "unit": ch.unit,
        "isVirtual": false,
        "details": details,
    })
}

/// `Gain` → `gain`, `PullType` → `pullType`: the contract's keys for details.
fn lower_camel(key: &str) -> String {
    let mut chars = key.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}
