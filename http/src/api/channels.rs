//! `api/channels...`: the station's channel list in the contract's shape, and the lookup by
//! alias or net name.

use serde_json::{Value as Json, json};
use station_protocol::{ChannelConfig, ChannelDescriptor};

use super::call::{Answer, Call, known_channels, ok};
use super::channel_config::detail_json;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::link::ChannelPlace;
use crate::numeric::NUMERIC_RESULT_FLAG;
use crate::requests::channels::ChannelLookupRequest;

/// The clients' `ChannelTypes.VirtualDigital` bit.
const VIRTUAL_DIGITAL_FLAG: u32 = 1 << 2;

/// `GET api/channels`.
pub(super) async fn list(call: Call<'_>) -> Answer {
    let channels = known_channels(call.gateway)?;
    let mut list = Vec::with_capacity(channels.channels.len());
    for (i, ch) in channels.channels.iter().enumerate() {
        let Some(place) = channels.place(i) else {
            continue;
        };
        let mut json = channel_json(place, ch, channels.config(&ch.name));
        add_numeric_result_details(call.gateway, ch, &mut json).await;
        list.push(json);
    }
    ok(Json::Array(list))
}

/// A NumericResult channel's documented details (`ChannelDetailsDto`): its targets, the one
/// it samples (the last measured, else its first), its rate and default sample count (asked of
/// the station once per connection, `numeric::NumericResults::info`). Nothing for another
/// channel; the rate and count left out when the station cannot be asked now.
async fn add_numeric_result_details(gateway: &Gateway, ch: &ChannelDescriptor, json: &mut Json) {
    if ch.type_flags & NUMERIC_RESULT_FLAG == 0 {
        return;
    }
    let mut details = match json["details"].take() {
        Json::Object(details) => details,
        _ => serde_json::Map::new(),
    };
    let target = gateway
        .numeric
        .kept(&ch.name)
        .map(|measured| measured.target.clone())
        .or_else(|| ch.options.first().cloned());
    details.insert("targetNetName".into(), json!(target));
    details.insert("possibleTargetNames".into(), json!(ch.options));
    if let Ok(info) = gateway.numeric.info(&gateway.station, ch).await {
        details.insert("sampleRate".into(), json!(info.rate.round() as u64));
        if let Some(samples) = info.default_samples {
            details.insert("numberOfSamples".into(), json!(samples));
        }
    }
    json["details"] = Json::Object(details);
}

/// `POST api/channels/channel {NetName | Alias}`: NetName takes priority over Alias (the
/// clients' `ChannelLookupRequest`); an alias is asked only when no NetName finds a channel.
pub(super) async fn lookup(call: Call<'_>, asked: ChannelLookupRequest) -> Answer {
    let channels = known_channels(call.gateway)?;
    let (net_name_asked, alias_asked) = asked.asked()?;
    let (net_name_asked, alias_asked) = (net_name_asked.as_deref(), alias_asked.as_deref());
    let by_net_name = net_name_asked.and_then(|wanted| {
        channels
            .channels
            .iter()
            .position(|ch| net_name(ch) == wanted || ch.name == wanted)
    });
    let found = by_net_name.or_else(|| {
        alias_asked.and_then(|wanted| channels.channels.iter().position(|ch| alias(ch) == wanted))
    });
    match found {
        Some(position) => {
            let ch = &channels.channels[position];
            let place = channels.place(position).ok_or_else(|| {
                ApiError::not_found(format!("not found: the channel at {position} is gone"))
            })?;
            let mut json = channel_json(place, ch, channels.config(&ch.name));
            add_numeric_result_details(call.gateway, ch, &mut json).await;
            ok(json)
        }
        None => {
            let asked: Vec<String> = [("net name", net_name_asked), ("alias", alias_asked)]
                .into_iter()
                .filter_map(|(field, wanted)| Some(format!("the {field} {:?}", wanted?)))
                .collect();
            Err(ApiError::not_found(format!(
                "not found: no channel with {}",
                asked.join(" or ")
            )))
        }
    }
}

/// The channel's alias: the station's, or its full name where the station gives none (as a
/// station's own WebApi does: scripts look channels up by it).
fn alias(ch: &ChannelDescriptor) -> &str {
    if ch.alias.is_empty() {
        &ch.name
    } else {
        &ch.alias
    }
}

/// The channel's net name: the station's, or its full name where the station gives none.
fn net_name(ch: &ChannelDescriptor) -> &str {
    if ch.net_name.is_empty() {
        &ch.name
    } else {
        &ch.net_name
    }
}

/// `channelType` bit of a multiplexer: its options are the destination nets it accepts.
const MULTIPLEXER: u32 = 1 << 4;
/// `channelType` bit of a register: its access is the host's rights.
const REGISTER: u32 = 1 << 10;

/// `details`: the channel type's own fields (the clients' `ChannelDetailsDto`), as far as the
/// station's descriptor and its configuration (CONFIGURE: gain, offset, pull type, baud rate)
/// know them; null where they know none. Nothing is invented.
fn details(ch: &ChannelDescriptor, config: Option<&ChannelConfig>) -> Json {
    let mut details = serde_json::Map::new();
    for (key, value) in config.iter().flat_map(|c| &c.details) {
        details.insert(lower_camel(key), detail_json(value));
    }
    if ch.type_flags & MULTIPLEXER != 0 && !ch.options.is_empty() {
        details.insert("destinationNets".into(), json!(ch.options));
    }
    if ch.type_flags & REGISTER != 0 {
        let rights = match (ch.readable, ch.writable) {
            (true, true) => "RW",
            (false, true) => "WO",
            _ => "RO",
        };
        details.insert("hostRights".into(), json!(rights));
    }
    if details.is_empty() {
        Json::Null
    } else {
        Json::Object(details)
    }
}

/// The contract's channel object for one descriptor.
/// The contract's channel object for one descriptor, with its configuration when the station
/// has told it (CONFIGURE): enabled, device, capabilities and type-specific details.
pub(super) fn channel_json(
    place: ChannelPlace,
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
    json!({
        "channelIndex": place.position,
        "index": place.device_index,
        "enabled": config.is_none_or(|c| c.enabled),
        "usage": usage,
        "deviceName": device,
        // The whole value, bits the clients' name table lacks included (SPEC.md §9).
        "channelType": ch.type_flags,
        "channelTypeCapability": type_capability,
        "alias": alias(ch),
        "netName": net_name(ch),
        "groupName": ch.group,
        "capability": capability.label(),
        "description": ch.description,
        "direction": ch.direction.label(),
        "directionChanged": ch.direction != place.default_direction,
        "defaultDirection": place.default_direction.label(),
        "unit": ch.unit,
        // Software-only: a VirtualDigital channel is an expression over other channels.
        "isVirtual": ch.type_flags & VIRTUAL_DIGITAL_FLAG != 0,
        "details": details(ch, config),
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

#[cfg(test)]
mod tests {
    use station_protocol::{Direction, ValueType};

    use super::*;

    fn descriptor(type_flags: u32, options: &[&str]) -> ChannelDescriptor {
        ChannelDescriptor {
            name: "0.4.ESH1.X1".into(),
            alias: String::new(),
            net_name: "NET".into(),
            type_flags,
            direction: Direction::In,
            unit: String::new(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable: false,
            consuming: false,
            value_type: ValueType::Enum,
            options: options.iter().map(|o| o.to_string()).collect(),
        }
    }

    fn at(position: usize) -> ChannelPlace {
        ChannelPlace {
            position,
            device_index: position,
            default_direction: Direction::In,
        }
    }

    /// The clients' model: `index` is the position within the device,
    /// `channelIndex` the station-wide one; `defaultDirection` the direction the channel had
    /// when first listed and `directionChanged` whether it differs now; `isVirtual` for a
    /// VirtualDigital channel.
    #[test]
    fn index_default_direction_and_virtual_follow_the_clients_model() {
        let place = ChannelPlace {
            position: 7,
            device_index: 2,
            default_direction: Direction::Out,
        };
        let json = channel_json(place, &descriptor(2, &[]), None);
        assert_eq!(json["channelIndex"], 7);
        assert_eq!(json["index"], 2);
        assert_eq!(json["direction"], "IN");
        assert_eq!(json["defaultDirection"], "OUT");
        assert_eq!(json["directionChanged"], true);
        assert_eq!(json["isVirtual"], false);
        let unchanged = ChannelPlace {
            default_direction: Direction::In,
            ..place
        };
        let virtual_digital = channel_json(unchanged, &descriptor(1 << 2, &[]), None);
        assert_eq!(virtual_digital["directionChanged"], false);
        assert_eq!(virtual_digital["defaultDirection"], "IN");
        assert_eq!(virtual_digital["isVirtual"], true);
    }

    #[test]
    fn channel_type_carries_every_bit_and_names_default_to_the_full_name() {
        // Analog | bit 9 | Waveform | NumericResults | Calibration: bits without a name here.
        let flags = 1 | (1 << 9) | (1 << 18) | (1 << 25) | (1 << 26);
        let json = channel_json(at(3), &descriptor(flags, &[]), None);
        assert_eq!(json["channelType"], flags);
        assert_eq!(json["channelTypeCapability"], flags);
        assert_eq!(json["alias"], "0.4.ESH1.X1");
        assert_eq!(json["netName"], "NET");
    }

    #[test]
    fn details_are_the_types_own_fields_or_null() {
        assert_eq!(
            channel_json(at(0), &descriptor(1, &[]), None)["details"],
            Json::Null
        );
        // An enum's options are not a multiplexer's destinations.
        assert_eq!(
            channel_json(at(0), &descriptor(2, &["Off", "On"]), None)["details"],
            Json::Null
        );
        let mux = channel_json(at(0), &descriptor(MULTIPLEXER, &["NET_A", "NET_B"]), None);
        assert_eq!(
            mux["details"],
            json!({ "destinationNets": ["NET_A", "NET_B"] })
        );
        let register = channel_json(at(0), &descriptor(REGISTER, &[]), None);
        assert_eq!(register["details"], json!({ "hostRights": "RO" }));
    }
}
