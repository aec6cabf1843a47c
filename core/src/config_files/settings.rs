//! A channel's configuration as people write it (REST `ChannelConfigRequest`, a configuration
//! file) turned into CONFIGURE settings (SPEC.md §6.13), checked against what the station says
//! the channel supports, before anything is sent.

use station_protocol::configure::DETAIL_PREFIX;
use station_protocol::{ChannelConfig, ChannelDescriptor, Direction, Value, ValueType};

use crate::link::ChannelTable;

/// Refuses aliases that would make one name mean two channels (names resolve station name or
/// net name first, then alias: such an alias would silently reach the other channel, or be
/// unreachable): each `(channel, alias)` against the table and against the others given, the
/// message naming both channels.
pub fn check_aliases<'a>(
    table: &ChannelTable,
    renames: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), String> {
    let mut given: Vec<(&str, &str)> = Vec::new();
    for (channel, alias) in renames {
        if let Some(other) = table.alias_clash(channel, alias) {
            let what = if other.name == alias {
                "the name"
            } else if other.net_name == alias {
                "the net name"
            } else {
                "the alias"
            };
            return Err(format!(
                "alias {alias:?} for {channel} is already {what} of {}: a name must mean one channel",
                other.name
            ));
        }
        if let Some((first, _)) = given
            .iter()
            .find(|(other, same)| *other != channel && *same == alias && !alias.is_empty())
        {
            return Err(format!(
                "alias {alias:?} is given to both {first} and {channel}: a name must mean one channel"
            ));
        }
        given.push((channel, alias));
    }
    Ok(())
}

/// Every name of the clients' `ChannelTypes` flags and its bit, in the enum's order: the .NET
/// client's `WebApiClient/Models/Enums.cs` (esharpab/esharp-accordion-projects-webapiclient at
/// c0cf42f) and the Python client's `accordionq2/enums.py` (`ChannelTypes`, accordionq2 5.28.1)
/// have the same 26 names and bits (bit 9 has none), besides `Undefined` (0, no type), which
/// [`UNDEFINED_TYPE`] names.
pub const TYPE_FLAG_NAMES: &[(u32, &str)] = &[
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
    (1 << 18, "Waveform"),
    (1 << 19, "NumericResult"),
    (1 << 20, "PseudoDigital"),
    (1 << 21, "Image"),
    (1 << 22, "Audio"),
    (1 << 23, "Video"),
    (1 << 24, "Instrument"),
    (1 << 25, "NumericResults"),
    (1 << 26, "Calibration"),
];

/// The clients' name for no type at all (`ChannelTypes.Undefined = 0`).
pub const UNDEFINED_TYPE: &str = "Undefined";

/// Channel types whose own operations a station reached over the byte protocol does not have
/// (protocol/SPEC.md has no operation for them, and the gateway answers their endpoints 404,
/// `http/src/api/unserved.rs`): a channel of such a type could be listed, but not used as one.
/// What a refusal of such a type adds to its message.
pub const TYPES_WITHOUT_OPERATIONS: &[(u32, &str)] = &[
    (1 << 17, "socket transactions (comm/socket)"),
    (1 << 21, "media (media/...)"),
    (1 << 22, "media (media/...)"),
    (1 << 23, "media (media/...)"),
    (1 << 24, "instruments (instruments)"),
    (1 << 26, "calibration tables (calibration/...)"),
];

/// `"Analog, Current"` for the flags set; a bit without a name as its number.
pub fn type_names(flags: u32) -> String {
    let mut names: Vec<String> = TYPE_FLAG_NAMES
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, n)| (*n).to_owned())
        .collect();
    let unnamed = TYPE_FLAG_NAMES
        .iter()
        .fold(flags, |rest, (bit, _)| rest & !bit);
    (0..32)
        .map(|shift| 1u32 << shift)
        .filter(|bit| unnamed & bit != 0)
        .for_each(|bit| names.push(bit.to_string()));
    if names.is_empty() {
        "Undefined".into()
    } else {
        names.join(", ")
    }
}

/// Type flags from `"Analog, Current"` (names in any case, or bit values); `None` if a part
/// is neither or nothing is set (`Undefined`, `0`: see [`names_no_type`]).
pub fn parse_type(text: &str) -> Option<u32> {
    let mut flags = 0u32;
    for part in text.split(',').map(str::trim) {
        let bit = TYPE_FLAG_NAMES
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(part))
            .map(|(bit, _)| *bit)
            .or_else(|| part.eq_ignore_ascii_case(UNDEFINED_TYPE).then_some(0))
            .or_else(|| part.parse::<u32>().ok())?;
        flags |= bit;
    }
    (flags != 0).then_some(flags)
}

/// Whether `text` is the clients' `Undefined` (or `0`): a name of the enum, but no type a
/// channel can be given.
pub fn names_no_type(text: &str) -> bool {
    text.split(',').map(str::trim).all(|part| {
        part.eq_ignore_ascii_case(UNDEFINED_TYPE) || part.parse::<u32>().is_ok_and(|n| n == 0)
    })
}

/// A direction from `"IN"`, `"OUT"`, `"IN, OUT"` (any case) or `1`..`3`.
pub fn parse_direction(text: &str) -> Option<Direction> {
    if let Ok(number) = text.trim().parse::<u8>() {
        return Direction::from_u8(number);
    }
    let mut bits = 0u8;
    for part in text.split(',').map(str::trim) {
        bits |= match part.to_ascii_uppercase().as_str() {
            "IN" => 1,
            "OUT" => 2,
            _ => return None,
        };
    }
    Direction::from_u8(bits)
}

/// A detail's value as given, before it is made the detail's own type.
#[derive(Debug, Clone, PartialEq)]
pub enum GivenDetail {
    Number(f64),
    Integer(i64),
    Bool(bool),
    Text(String),
}

/// What someone wants of one channel; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub alias: Option<String>,
    pub description: Option<String>,
    pub unit: Option<String>,
    pub group: Option<String>,
    pub device: Option<String>,
    pub enabled: Option<bool>,
    pub direction: Option<Direction>,
    pub type_flags: Option<u32>,
    /// Detail name as given (matched in any case) and its value.
    pub details: Vec<(String, GivenDetail)>,
}

/// The CONFIGURE settings that make `channel` what `wanted` says, only those that differ from
/// now; or what is wrong, naming the field (`Direction`, `Details.Gain`).
pub fn settings_for(
    channel: &ChannelDescriptor,
    config: &ChannelConfig,
    wanted: &Wanted,
) -> Result<Vec<(String, Value)>, String> {
    let mut settings = Vec::new();
    let mut text = |key: &str, wanted: &Option<String>, now: &str| {
        if let Some(wanted) = wanted
            && wanted != now
        {
            settings.push((key.to_owned(), Value::String(wanted.clone())));
        }
    };
    text("alias", &wanted.alias, &channel.alias);
    text("description", &wanted.description, &channel.description);
    text("unit", &wanted.unit, &channel.unit);
    text("group", &wanted.group, &channel.group);
    text("device", &wanted.device, &config.device);
    if let Some(enabled) = wanted.enabled
        && enabled != config.enabled
    {
        settings.push(("enabled".into(), Value::Bool(enabled)));
    }
    if let Some(direction) = wanted.direction {
        if direction as u8 & !(config.capability as u8) != 0 {
            return Err(format!(
                "Direction: {} is outside the channel's capability {}",
                direction.label(),
                config.capability.label()
            ));
        }
        if direction != channel.direction {
            settings.push(("direction".into(), Value::Integer(direction as i64)));
        }
    }
    if let Some(flags) = wanted.type_flags {
        if flags & !config.type_capability != 0 {
            return Err(type_outside_capability(flags, config.type_capability));
        }
        if flags != channel.type_flags {
            settings.push(("type".into(), Value::Integer(i64::from(flags))));
        }
    }
    for (given_key, given) in &wanted.details {
        let Some((key, now)) = config
            .details
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(given_key))
        else {
            let allowed: Vec<&str> = config.details.iter().map(|(k, _)| k.as_str()).collect();
            return Err(format!(
                "Details.{given_key}: not a configurable field of this channel's type ({}); it has {}",
                type_names(channel.type_flags),
                if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(", ")
                }
            ));
        };
        let mut value = detail_value(now.value_type(), given)
            .ok_or_else(|| format!("Details.{key}: must be a {}", now.value_type().name()))?;
        if let Some((_, names)) = DETAIL_ENUMS
            .iter()
            .find(|(detail, _)| detail.eq_ignore_ascii_case(key))
        {
            let given_name = value.render();
            let Some(name) = names.iter().find(|n| n.eq_ignore_ascii_case(&given_name)) else {
                return Err(format!(
                    "Details.{key}: {given_name:?} is not one of {}",
                    names.join(", ")
                ));
            };
            value = match value {
                Value::Enum(_) => Value::Enum((*name).to_owned()),
                _ => Value::String((*name).to_owned()),
            };
        }
        if &value != now {
            settings.push((format!("{DETAIL_PREFIX}{key}"), value));
        }
    }
    Ok(settings)
}

/// Why a channel cannot be given the type `flags`: the station says which types the channel
/// can hold (CONFIGURE's type capability, SPEC.md §6.13), and the clients' docs say the type
/// must be within it (`docs/api/channels.md`, `ChannelConfigRequest.ChannelType`); a type the
/// byte protocol has no operations for says so too.
fn type_outside_capability(flags: u32, capability: u32) -> String {
    let outside = flags & !capability;
    let mut message = format!(
        "ChannelType: {} is outside the channel's type capability {}: this station's channel \
         cannot hold {}",
        type_names(flags),
        type_names(capability),
        type_names(outside)
    );
    let mut groups: Vec<&str> = TYPES_WITHOUT_OPERATIONS
        .iter()
        .filter(|(bit, _)| outside & bit != 0)
        .map(|(_, group)| *group)
        .collect();
    groups.dedup();
    if !groups.is_empty() {
        message.push_str(&format!(
            "; a station reached over the byte protocol has no operations for {} either",
            groups.join(", ")
        ));
    }
    message
}

/// The details whose values are names from a fixed list, as the clients' `ChannelDetailsDto`
/// documents them: a value outside the list is refused (as the vendor's station does) and one
/// in it is kept in the list's spelling.
const DETAIL_ENUMS: &[(&str, &[&str])] = &[
    ("InputConfiguration", &["RSE", "NRSE", "Differential"]),
    ("PushType", &["OpenDrain", "PushPull"]),
    ("PullType", &["None", "Down", "Up"]),
    ("ExpressionType", &["CUSTOM", "AND", "OR", "TOGGLE"]),
    ("HostRights", &["RO", "RW", "WO"]),
    ("BusType", &["RS232", "RS422", "RS485"]),
];

/// A given detail as a value of the detail's type, when it can be one.
fn detail_value(wanted: ValueType, given: &GivenDetail) -> Option<Value> {
    match (wanted, given) {
        (ValueType::Float, GivenDetail::Number(x)) => Some(Value::Float(*x)),
        (ValueType::Float, GivenDetail::Integer(i)) => Some(Value::Float(*i as f64)),
        (ValueType::Integer, GivenDetail::Integer(i)) => Some(Value::Integer(*i)),
        (ValueType::Integer, GivenDetail::Number(x)) if x.fract() == 0.0 && x.abs() < 9e15 => {
            Some(Value::Integer(*x as i64))
        }
        (ValueType::Bool, GivenDetail::Bool(b)) => Some(Value::Bool(*b)),
        (ValueType::String, GivenDetail::Text(t)) => Some(Value::String(t.clone())),
        (ValueType::Enum, GivenDetail::Text(t)) => Some(Value::Enum(t.clone())),
        (_, GivenDetail::Text(t)) => Value::parse_as(wanted, t, &[]).ok(),
        _ => None,
    }
}

/// A detail's value as a configuration file keeps it.
pub fn detail_to_toml(value: &Value) -> toml::Value {
    match value {
        Value::Float(x) => toml::Value::Float(*x),
        Value::Integer(i) => toml::Value::Integer(*i),
        Value::Bool(b) => toml::Value::Boolean(*b),
        other => toml::Value::String(other.render()),
    }
}

/// A detail as a configuration file gives it.
pub fn detail_from_toml(value: &toml::Value) -> Option<GivenDetail> {
    Some(match value {
        toml::Value::Float(x) => GivenDetail::Number(*x),
        toml::Value::Integer(i) => GivenDetail::Integer(*i),
        toml::Value::Boolean(b) => GivenDetail::Bool(*b),
        toml::Value::String(s) => GivenDetail::Text(s.clone()),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel() -> (ChannelDescriptor, ChannelConfig) {
        let descriptor = ChannelDescriptor {
            name: "0.4.X.ON1".into(),
            alias: "HV1 enable".into(),
            net_name: "HV1_ON".into(),
            type_flags: 2,
            direction: Direction::Out,
            unit: String::new(),
            description: String::new(),
            group: "HV4".into(),
            readable: true,
            writable: true,
            consuming: false,
            value_type: ValueType::Bool,
            options: vec![],
        };
        let config = ChannelConfig {
            enabled: true,
            capability: Direction::InOut,
            type_capability: 2 | 4,
            device: "0.4.X".into(),
            limits: None,
            details: vec![("PullType".into(), Value::String("None".into()))],
        };
        (descriptor, config)
    }

    #[test]
    fn only_what_differs_becomes_a_setting() {
        let (descriptor, config) = channel();
        let wanted = Wanted {
            alias: Some("HV1 enable".into()),
            unit: Some("".into()),
            group: Some("HV".into()),
            enabled: Some(false),
            direction: Some(Direction::InOut),
            type_flags: Some(2),
            details: vec![("pulltype".into(), GivenDetail::Text("Up".into()))],
            ..Wanted::default()
        };
        assert_eq!(
            settings_for(&descriptor, &config, &wanted).unwrap(),
            vec![
                ("group".into(), Value::String("HV".into())),
                ("enabled".into(), Value::Bool(false)),
                ("direction".into(), Value::Integer(3)),
                ("detail.PullType".into(), Value::String("Up".into())),
            ]
        );
    }

    /// A detail whose values the clients list (`PullType`: None, Down or Up) takes only those,
    /// in any case, kept in the list's spelling (`Sideways` is refused, not stored).
    #[test]
    fn an_enum_detail_takes_only_the_names_the_clients_list() {
        let (descriptor, config) = channel();
        let pull = |given: &str| {
            settings_for(
                &descriptor,
                &config,
                &Wanted {
                    details: vec![("PullType".into(), GivenDetail::Text(given.into()))],
                    ..Wanted::default()
                },
            )
        };
        let refused = pull("Sideways").unwrap_err();
        assert_eq!(
            refused,
            "Details.PullType: \"Sideways\" is not one of None, Down, Up"
        );
        assert_eq!(
            pull("down").unwrap(),
            vec![("detail.PullType".into(), Value::String("Down".into()))]
        );
        assert_eq!(pull("NONE").unwrap(), vec![]);
    }

    /// A type outside the channel's capability names what it cannot hold; one the byte
    /// protocol has no operations for (media, calibration, ...) says that too.
    #[test]
    fn a_type_the_channel_cannot_hold_is_named_with_why() {
        let (descriptor, config) = channel();
        let typed = |flags: u32| {
            settings_for(
                &descriptor,
                &config,
                &Wanted {
                    type_flags: Some(flags),
                    ..Wanted::default()
                },
            )
        };
        assert_eq!(typed(4).unwrap(), vec![("type".into(), Value::Integer(4))]);
        assert_eq!(typed(2).unwrap(), vec![]);
        let numeric = typed(1 << 19).unwrap_err();
        assert_eq!(
            numeric,
            "ChannelType: NumericResult is outside the channel's type capability Digital, \
             VirtualDigital: this station's channel cannot hold NumericResult"
        );
        let media = typed((1 << 21) | (1 << 22) | 2).unwrap_err();
        assert!(
            media.contains("cannot hold Image, Audio")
                && media.ends_with(
                    "a station reached over the byte protocol has no operations for media \
                     (media/...) either"
                ),
            "{media}"
        );
        let calibration = typed(1 << 26).unwrap_err();
        assert!(
            calibration.contains("calibration tables (calibration/...)"),
            "{calibration}"
        );
    }

    /// The names are the clients' enum's, so a type the station reports reads back by name.
    #[test]
    fn type_names_and_parse_type_are_each_others_inverse() {
        for (bit, name) in TYPE_FLAG_NAMES {
            assert_eq!(type_names(*bit), *name);
            assert_eq!(parse_type(name), Some(*bit));
        }
        assert_eq!(type_names(1 << 9), "512");
        assert_eq!(parse_type("Undefined"), None);
        assert!(names_no_type("Undefined") && names_no_type("0") && !names_no_type("Analog"));
    }

    #[test]
    fn what_the_channel_cannot_do_names_the_field() {
        let (mut descriptor, mut config) = channel();
        config.capability = Direction::Out;
        descriptor.direction = Direction::Out;
        let refused = |wanted: Wanted| settings_for(&descriptor, &config, &wanted).unwrap_err();
        assert!(
            refused(Wanted {
                direction: Some(Direction::In),
                ..Wanted::default()
            })
            .starts_with("Direction:")
        );
        assert!(
            refused(Wanted {
                type_flags: Some(1),
                ..Wanted::default()
            })
            .starts_with("ChannelType:")
        );
        let gain = refused(Wanted {
            details: vec![("Gain".into(), GivenDetail::Number(2.0))],
            ..Wanted::default()
        });
        assert!(
            gain.starts_with("Details.Gain:") && gain.contains("PullType"),
            "{gain}"
        );
        assert!(
            refused(Wanted {
                details: vec![("PullType".into(), GivenDetail::Bool(true))],
                ..Wanted::default()
            })
            .starts_with("Details.PullType: must be a string")
        );
    }

    #[test]
    fn directions_and_types_read_as_the_contract_writes_them() {
        assert_eq!(parse_direction("IN, OUT"), Some(Direction::InOut));
        assert_eq!(parse_direction("out"), Some(Direction::Out));
        assert_eq!(parse_direction("2"), Some(Direction::Out));
        assert_eq!(parse_direction("sideways"), None);
        assert_eq!(parse_type("Analog, current"), Some(1 | 2048));
        assert_eq!(
            parse_type(&type_names(1 | 4096 | (1 << 9))),
            Some(1 | 4096 | (1 << 9))
        );
        assert_eq!(parse_type("Undefined"), None);
        assert_eq!(type_names(0), "Undefined");
    }
}
