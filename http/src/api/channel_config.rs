//! `POST api/channels/channel/configure` and `POST api/channels/configure`: partial updates of
//! channels (`ChannelConfigRequest`), every entry checked against the channel table and the
//! station's word on what each channel supports before anything is sent, then one CONFIGURE
//! per changed channel under the lease's send guard.

use serde_json::{Map, Value as Json};
use station_protocol::{ChannelDescriptor, Configure, Value};

use super::call::{Answer, Call, answered, known_channels, ok};
use super::channels::channel_json;
use crate::config_files::configs_of;
use crate::config_files::settings::{
    GivenDetail, Wanted, check_aliases, parse_direction, parse_type, settings_for,
};
use crate::error::ApiError;
use crate::link::{ChannelPlace, ChannelTable};
use crate::station::{ChangeAnswer, ChangeWhat, Step, StepAction, StepsDone};

/// The fields of a `ChannelConfigRequest`, as the contract spells them.
const FIELDS: &[&str] = &[
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

/// `POST api/channels/channel/configure {ChannelConfigRequest}`.
pub(super) async fn configure_one(call: Call<'_>) -> Answer {
    let entry = parse_body(&call.raw)?;
    let Json::Object(entry) = entry else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object (one ChannelConfigRequest)",
        ));
    };
    let mut configured = configure(&call, vec![entry], false).await?;
    ok(configured.pop().unwrap_or(Json::Null))
}

/// `POST api/channels/configure [ChannelConfigRequest, ...]`.
pub(super) async fn configure_many(call: Call<'_>) -> Answer {
    let Json::Array(entries) = parse_body(&call.raw)? else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON array of ChannelConfigRequest objects",
        ));
    };
    let entries = entries
        .into_iter()
        .enumerate()
        .map(|(index, entry)| match entry {
            Json::Object(entry) => Ok(entry),
            _ => Err(ApiError::bad_request(format!(
                "entry {} is not a JSON object",
                index + 1
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    ok(Json::Array(configure(&call, entries, true).await?))
}

fn parse_body(raw: &[u8]) -> Result<Json, ApiError> {
    serde_json::from_slice(raw).map_err(|error| {
        ApiError::bad_request(format!("the request body is not valid JSON: {error}"))
    })
}

/// One entry located and read, not yet checked against what the channel supports.
struct Located {
    position: usize,
    wanted: Wanted,
}

/// Checks every entry, then configures; the channels as they are afterwards.
async fn configure(
    call: &Call<'_>,
    entries: Vec<Map<String, Json>>,
    in_list: bool,
) -> Result<Vec<Json>, ApiError> {
    let table = known_channels(call.gateway)?;
    let label = |index: usize| {
        if in_list {
            format!("entry {}: ", index + 1)
        } else {
            String::new()
        }
    };
    let located = entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            locate(&table, entry).map_err(|mut error| {
                error.message = format!("{}{}", label(index), error.message);
                // In a list an entry naming no channel is a bad entry of the request.
                if in_list {
                    error.kind = crate::error::ErrorKind::BadRequest;
                }
                error
            })
        })
        .collect::<Result<Vec<Located>, ApiError>>()?;
    let names: Vec<String> = located
        .iter()
        .map(|l| table.channels[l.position].name.clone())
        .collect();
    check_aliases(
        &table,
        located
            .iter()
            .zip(&names)
            .filter_map(|(l, name)| Some((name.as_str(), l.wanted.alias.as_deref()?))),
    )
    .map_err(ApiError::bad_request)?;
    let configs = configs_of(&call.gateway.station, &table, &names).await?;
    let mut requests = Vec::new();
    for (index, (entry, name)) in located.iter().zip(&names).enumerate() {
        let channel = &table.channels[entry.position];
        let settings = settings_for(channel, &configs[name], &entry.wanted).map_err(|why| {
            ApiError::bad_request(format!(
                "{}{} ({}): {why}",
                label(index),
                name,
                locator(channel)
            ))
        })?;
        requests.push((
            entry.position,
            Configure {
                name: name.clone(),
                settings,
            },
        ));
    }
    apply(call, requests, in_list).await
}

/// Sends the checked CONFIGUREs one after another, as one change of many steps (run to its end
/// by the station service, whoever hangs up); the channels as they are afterwards.
async fn apply(
    call: &Call<'_>,
    requests: Vec<(usize, Configure)>,
    in_list: bool,
) -> Result<Vec<Json>, ApiError> {
    let steps: Vec<Step> = requests
        .iter()
        .filter(|(_, request)| !request.settings.is_empty())
        .map(|(_, request)| Step {
            label: format!("configure {}", request.name),
            action: StepAction::Configure(request.clone()),
        })
        .collect();
    let done = if steps.is_empty() {
        StepsDone::default()
    } else {
        answered(
            call.change(ChangeWhat::Steps(steps)).await?,
            ChangeAnswer::stepped,
        )?
    };
    let mut replies = done.done.into_iter();
    let mut step = 0;
    let mut answers = Vec::new();
    for (entry, (position, request)) in requests.into_iter().enumerate() {
        if request.settings.is_empty() {
            let table = call.gateway.station.info().channels.clone();
            if let (Some(channel), Some(place)) =
                (table.channels.get(position), table.place(position))
            {
                answers.push(channel_json(place, channel, table.config(&channel.name)));
            }
            continue;
        }
        if let Some((stopped_at, error)) = &done.stopped
            && *stopped_at == step
        {
            let mut api = ApiError::from(error.clone());
            let name = &request.name;
            api.message = if in_list {
                format!(
                    "configuring {name} (entry {}) failed: {}; entries before it were configured, those after it were not",
                    entry + 1,
                    api.message
                )
            } else {
                format!("configuring {name} failed: {}", api.message)
            };
            return Err(api);
        }
        step += 1;
        if let Some(Some(reply)) = replies.next() {
            let table = call.gateway.station.info().channels.clone();
            let place = table.place(position).unwrap_or(ChannelPlace {
                position,
                device_index: 0,
                default_direction: reply.channel.direction,
            });
            answers.push(channel_json(place, &reply.channel, Some(&reply.config)));
        }
    }
    Ok(answers)
}

fn locator(channel: &ChannelDescriptor) -> String {
    if channel.net_name.is_empty() {
        format!("alias {:?}", channel.alias)
    } else {
        format!("net name {:?}", channel.net_name)
    }
}

/// A field of the entry, in any letter case; null counts as absent.
fn field<'a>(entry: &'a Map<String, Json>, name: &str) -> Option<&'a Json> {
    entry
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case(name))
        .map(|(_, value)| value)
        .filter(|value| !value.is_null())
}

fn text_field(entry: &Map<String, Json>, name: &str) -> Result<Option<String>, ApiError> {
    match field(entry, name) {
        None => Ok(None),
        Some(Json::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(ApiError::bad_request(format!("{name} must be a string"))),
    }
}

/// Finds the entry's channel (`NetName` first, then `Alias`; either may also be the channel's
/// full name) and reads what it wants, refusing fields the contract does not have.
fn locate(table: &ChannelTable, entry: &Map<String, Json>) -> Result<Located, ApiError> {
    if let Some((unknown, _)) = entry.iter().find(|(key, value)| {
        !value.is_null() && !FIELDS.iter().any(|f| f.eq_ignore_ascii_case(key))
    }) {
        return Err(ApiError::bad_request(format!(
            "{unknown} is not a field of ChannelConfigRequest (fields: {})",
            FIELDS.join(", ")
        )));
    }
    let net_name = text_field(entry, "NetName")?;
    let alias = text_field(entry, "Alias")?;
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
    let enabled = match field(entry, "Enabled") {
        None => None,
        Some(Json::Bool(on)) => Some(*on),
        Some(_) => return Err(ApiError::bad_request("Enabled must be true or false")),
    };
    let direction = match field(entry, "Direction") {
        None => None,
        Some(value) => Some(
            flag_text(value)
                .as_deref()
                .and_then(parse_direction)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "Direction {value} is not IN, OUT or \"IN, OUT\""
                    ))
                })?,
        ),
    };
    let type_flags = match field(entry, "ChannelType") {
        None => None,
        Some(value) => Some(
            flag_text(value)
                .as_deref()
                .and_then(parse_type)
                .ok_or_else(|| {
                    ApiError::bad_request(format!("ChannelType {value} names no channel type"))
                })?,
        ),
    };
    let details = match field(entry, "Details") {
        None => Vec::new(),
        Some(Json::Object(details)) => details
            .iter()
            .filter(|(_, value)| !value.is_null())
            .map(|(key, value)| Ok((key.clone(), given_detail(key, value)?)))
            .collect::<Result<Vec<_>, ApiError>>()?,
        Some(_) => return Err(ApiError::bad_request("Details must be an object")),
    };
    Ok(Located {
        position,
        wanted: Wanted {
            alias: rename,
            description: text_field(entry, "Description")?,
            unit: text_field(entry, "Unit")?,
            group: text_field(entry, "GroupName")?,
            device: text_field(entry, "DeviceName")?,
            enabled,
            direction,
            type_flags,
            details,
        },
    })
}

/// A flags field as text: `"IN, OUT"` as it is, a number as its digits.
fn flag_text(value: &Json) -> Option<String> {
    match value {
        Json::String(text) => Some(text.clone()),
        Json::Number(number) => number.as_u64().map(|n| n.to_string()),
        _ => None,
    }
}

fn given_detail(key: &str, value: &Json) -> Result<GivenDetail, ApiError> {
    Ok(match value {
        Json::Bool(b) => GivenDetail::Bool(*b),
        Json::String(text) => GivenDetail::Text(text.clone()),
        Json::Number(number) => match number.as_i64() {
            Some(i) => GivenDetail::Integer(i),
            None => GivenDetail::Number(number.as_f64().unwrap_or(f64::NAN)),
        },
        _ => {
            return Err(ApiError::bad_request(format!(
                "Details.{key}: must be a number, true/false or a string"
            )));
        }
    })
}

/// A detail's value as the contract's `Details` shows it.
pub(super) fn detail_json(value: &Value) -> Json {
    match value {
        Value::Float(x) => serde_json::Number::from_f64(*x)
            .map(Json::Number)
            .unwrap_or(Json::Null),
        Value::Integer(i) => Json::from(*i),
        Value::Bool(b) => Json::Bool(*b),
        other => Json::String(other.render()),
    }
}
