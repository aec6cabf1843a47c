//! `POST api/channels/channel/configure` and `POST api/channels/configure`: partial updates of
//! channels (`ChannelConfigRequest`), every entry checked against the channel table and the
//! station's word on what each channel supports before anything is sent, then one CONFIGURE
//! per changed channel under the lease's send guard.

use serde_json::{Map, Value as Json};
use station_protocol::{ChannelDescriptor, Configure, Value};

use super::call::{Answer, Call, answered, known_channels, ok};
use super::channels::channel_json;
use crate::config_files::configs_of;
use crate::config_files::settings::{check_aliases, settings_for};
use crate::error::ApiError;
use crate::link::ChannelPlace;
use crate::requests::channel_config::{ChannelConfigRequest, Located};
use crate::station::{ChangeAnswer, ChangeWhat, Step, StepAction, StepsDone};

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
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let asked = ChannelConfigRequest::from_entry(entry);
            asked
                .and_then(|asked| asked.locate(&table))
                .map_err(|mut error| {
                    // An entry naming no channel is 404 in a list as alone: the clients' docs
                    // answer a channel that does not exist with 404 (the .NET client's
                    // `docs/error-handling.md`), and nothing of the list is sent either way.
                    error.message = format!("{}{}", label(index), error.message);
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
