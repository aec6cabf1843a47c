//! `POST api/channels/channel/configure` and `api/channels/configure`: the clients'
//! `ChannelConfigRequest` (`WebApiClient/Models/ChannelModels.cs`), one or a list, turned into
//! the channel it names and what it wants of it ([`Wanted`], the configuration files' and the
//! legacy listener's too). Unlike the other bodies, a field the contract does not have is
//! refused (naming the fields), as this endpoint always did; each field is checked after the
//! channel is found, in the order below, in this endpoint's own words (`Unit must be a
//! string`).

use serde::Deserialize;
use serde::de;
use serde_json::{Map, Value as Json};
use station_protocol::{ChannelDescriptor, Direction};

use crate::body::{Deferred, JsonBody, said};
use crate::config_files::settings::{
    GivenDetail, TYPE_FLAG_NAMES, UNDEFINED_TYPE, Wanted, names_no_type, parse_direction,
    parse_type,
};
use crate::error::ApiError;
use crate::link::ChannelTable;

/// The fields of a `ChannelConfigRequest`, as the contract spells them.
pub const FIELDS: &[&str] = &[
    "NetName",
    "Alias",
    "Enabled",
    "Direction",
    "ChannelType",
    "Description",
    "Unit",
    "GroupName",
    "DeviceName",
    "Details",
];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChannelConfigRequest {
    pub net_name: Deferred<Option<ConfigText>>,
    pub alias: Deferred<Option<ConfigText>>,
    pub enabled: Deferred<Option<ConfigFlag>>,
    pub direction: Deferred<Option<DirectionSent>>,
    pub channel_type: Deferred<Option<ChannelTypeSent>>,
    pub details: Deferred<Option<DetailsSent>>,
    pub description: Deferred<Option<ConfigText>>,
    pub unit: Deferred<Option<ConfigText>>,
    pub group_name: Deferred<Option<ConfigText>>,
    pub device_name: Deferred<Option<ConfigText>>,
}

/// One entry's channel (its position in the table) and what it wants of it, not yet checked
/// against what the channel supports.
pub struct Located {
    pub position: usize,
    pub wanted: Wanted,
}

impl ChannelConfigRequest {
    /// One entry of the body, its fields bound in any letter case; a non-null field the
    /// contract does not have is refused first.
    pub fn from_entry(entry: Map<String, Json>) -> Result<ChannelConfigRequest, ApiError> {
        if let Some((unknown, _)) = entry.iter().find(|(key, value)| {
            !value.is_null() && !FIELDS.iter().any(|f| f.eq_ignore_ascii_case(key))
        }) {
            return Err(ApiError::bad_request(format!(
                "{unknown} is not a field of ChannelConfigRequest (fields: {})",
                FIELDS.join(", ")
            )));
        }
        JsonBody::from_object(entry).typed()
    }

    /// Finds the entry's channel (`NetName` first, then `Alias`; either may also be the
    /// channel's full name, or an alias through the table) and reads what it wants.
    pub fn locate(self, table: &ChannelTable) -> Result<Located, ApiError> {
        let text = |field: Deferred<Option<ConfigText>>| {
            field
                .checked()
                .map(|text| text.map(|ConfigText(text)| text))
        };
        let net_name = text(self.net_name)?;
        let alias = text(self.alias)?;
        let find = |wanted: &str, by: fn(&ChannelDescriptor) -> &str| {
            table
                .channels
                .iter()
                .position(|ch| !wanted.is_empty() && by(ch) == wanted)
                .or_else(|| table.position(wanted))
        };
        let (position, rename) = match (&net_name, &alias) {
            (Some(net_name), alias) => {
                let found = find(net_name, |ch| &ch.net_name).ok_or_else(|| {
                    ApiError::not_found(format!("no channel with the net name {net_name:?}"))
                })?;
                (found, alias.clone())
            }
            (None, Some(alias)) => {
                let found = find(alias, |ch| &ch.alias).ok_or_else(|| {
                    ApiError::not_found(format!("no channel with the alias {alias:?}"))
                })?;
                (found, None)
            }
            (None, None) => {
                return Err(ApiError::bad_request(
                    "give NetName or Alias to say which channel to configure",
                ));
            }
        };
        let enabled = self.enabled.checked()?.map(|ConfigFlag(on)| on);
        let direction = self.direction.checked()?.map(|DirectionSent(d)| d);
        let type_flags = self.channel_type.checked()?.map(|ChannelTypeSent(t)| t);
        let details = self
            .details
            .checked()?
            .map_or_else(Vec::new, |DetailsSent(details)| details);
        Ok(Located {
            position,
            wanted: Wanted {
                alias: rename,
                description: text(self.description)?,
                unit: text(self.unit)?,
                group: text(self.group_name)?,
                device: text(self.device_name)?,
                enabled,
                direction,
                type_flags,
                details,
            },
        })
    }
}

/// Text: `X must be a string`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigText(pub String);

impl<'de> Deserialize<'de> for ConfigText {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Json::deserialize(deserializer)? {
            Json::String(text) => Ok(ConfigText(text)),
            _ => Err(said("", " must be a string")),
        }
    }
}

/// `Enabled`: `X must be true or false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigFlag(pub bool);

impl<'de> Deserialize<'de> for ConfigFlag {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Json::deserialize(deserializer)? {
            Json::Bool(on) => Ok(ConfigFlag(on)),
            _ => Err(said("", " must be true or false")),
        }
    }
}

/// A flags field as text: `"IN, OUT"` as it is, a number as its digits.
fn flag_text(value: &Json) -> Option<String> {
    match value {
        Json::String(text) => Some(text.clone()),
        Json::Number(number) => number.as_u64().map(|n| n.to_string()),
        _ => None,
    }
}

/// `Direction`: the clients' `DirectionTypes` by name (`"IN, OUT"`) or number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectionSent(pub Direction);

impl<'de> Deserialize<'de> for DirectionSent {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Json::deserialize(deserializer)?;
        flag_text(&value)
            .as_deref()
            .and_then(parse_direction)
            .map(DirectionSent)
            .ok_or_else(|| said("", format_args!(" {value} is not IN, OUT or \"IN, OUT\"")))
    }
}

/// `ChannelType`: the clients' `ChannelTypes` flags by name (every name of the enum, any case,
/// `"Analog, Current"` for several, as Newtonsoft's `StringEnumConverter` writes a `[Flags]`
/// enum) or number. `Undefined` is a name of the enum but gives a channel no type: refused
/// saying so. Whether the channel can hold the type is checked with the channel's own
/// capability later (`settings_for`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelTypeSent(pub u32);

impl<'de> Deserialize<'de> for ChannelTypeSent {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Json::deserialize(deserializer)?;
        let text = flag_text(&value);
        if let Some(flags) = text.as_deref().and_then(parse_type) {
            return Ok(ChannelTypeSent(flags));
        }
        if text.as_deref().is_some_and(names_no_type) {
            return Err(said(
                "",
                format_args!(
                    " {value} is {UNDEFINED_TYPE}, no type: give the type the channel is to have, \
                     within its channelTypeCapability"
                ),
            ));
        }
        let names: Vec<&str> = TYPE_FLAG_NAMES.iter().map(|(_, name)| *name).collect();
        Err(said(
            "",
            format_args!(
                " {value} names no channel type; the types are {} (several joined by \", \"), or \
                 their bit values",
                names.join(", ")
            ),
        ))
    }
}

/// `Details`: the type-specific fields to change, each a number, a boolean or text (a `null`
/// one as absent), checked against the channel's type later.
#[derive(Debug, Clone, PartialEq)]
pub struct DetailsSent(pub Vec<(String, GivenDetail)>);

impl<'de> Deserialize<'de> for DetailsSent {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Json::Object(details) = Json::deserialize(deserializer)? else {
            return Err(said("", " must be an object"));
        };
        details
            .into_iter()
            .filter(|(_, value)| !value.is_null())
            .map(|(key, value)| {
                let given = match value {
                    Json::Bool(b) => GivenDetail::Bool(b),
                    Json::String(text) => GivenDetail::Text(text),
                    Json::Number(number) => match number.as_i64() {
                        Some(i) => GivenDetail::Integer(i),
                        None => GivenDetail::Number(number.as_f64().unwrap_or(f64::NAN)),
                    },
                    _ => {
                        return Err(said(
                            "",
                            format_args!(".{key}: must be a number, true/false or a string"),
                        ));
                    }
                };
                Ok((key, given))
            })
            .collect::<Result<Vec<_>, D::Error>>()
            .map(DetailsSent)
    }
}
