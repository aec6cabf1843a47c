//! `api/resources/...` bodies (the .NET client's `ResourcesGroup`: `{Name}`, `{Name, Value}`,
//! `{Names}` with the gateway's `MaxAgeMs`, `{Resources}`), and their values checked against
//! the channel table: the channel found by name or alias, writable, of its type, within the
//! limits the station gave for it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use station_protocol::{ChannelDescriptor, Value};

use super::ValueText;
use crate::body::{Deferred, StringList, Whole};
use crate::error::ApiError;
use crate::link::ChannelTable;
use crate::station::Freshness;

/// `POST api/resources/value/get {Name}`: a forced read of one channel.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceNameRequest {
    pub name: String,
}

/// `POST api/resources/values/get {Names, MaxAgeMs?}`: a read of several channels, from the
/// cache when `MaxAgeMs` is above 0.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceValuesRequest {
    pub names: StringList,
    pub max_age_ms: Option<Whole>,
}

impl ResourceValuesRequest {
    /// How fresh the values must be: while someone else holds the lease (`cache_only`: the
    /// admission lets a non-holder through only with a maximum age) every value comes from the
    /// cache however old; with a maximum age, fresh cached values serve; else the hardware.
    pub fn freshness(&self, cache_only: bool) -> Freshness<'static> {
        match self.max_age_ms {
            _ if cache_only => Freshness::CacheOnly,
            Some(Whole(ms)) if ms > 0 => Freshness::Within(Duration::from_millis(ms)),
            _ => Freshness::Hardware,
        }
    }
}

/// The `MaxAgeMs` of a read, as the lease admission reads it before the handler: a maximum
/// age above 0 asks for cached values, which a non-holder may read while the lease is held.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MaxAgeAsked {
    pub max_age_ms: Option<Whole>,
}

impl MaxAgeAsked {
    pub fn cached(&self) -> bool {
        self.max_age_ms.is_some_and(|Whole(ms)| ms > 0)
    }
}

/// `POST api/resources/value/set` and `api/resources/transact {Name, Value}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceValueRequest {
    pub name: String,
    pub value: ValueText,
}

impl ResourceValueRequest {
    /// The channel (by name or alias, as asked) and the value as its type, checked.
    pub fn into_item(self, channels: &ChannelTable) -> Result<(String, Value), ApiError> {
        let channel = channels
            .get(&self.name)
            .ok_or_else(|| ApiError::no_such_resource(&self.name))?;
        let value = checked_value(channels, channel, &self.value.0)?;
        Ok((self.name, value))
    }
}

/// `POST api/resources/values/set {Resources}`: name → value, each value checked after its
/// name is found.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceValuesSetRequest {
    pub resources: BTreeMap<String, Deferred<ValueText>>,
}

impl ResourceValuesSetRequest {
    /// Every entry checked before anything is sent: an unknown name is 404; each value the
    /// gateway can tell is wrong is named, and then nothing is written.
    pub fn into_items(self, channels: &ChannelTable) -> Result<Vec<(String, Value)>, ApiError> {
        let mut items = Vec::with_capacity(self.resources.len());
        let mut refused = Vec::new();
        for (name, text) in self.resources {
            let channel = channels
                .get(&name)
                .ok_or_else(|| ApiError::no_such_resource(&name))?;
            let text = text.checked()?;
            match checked_value(channels, channel, &text.0) {
                Ok(value) => items.push((name, value)),
                Err(error) => refused.push(error.message),
            }
        }
        if !refused.is_empty() {
            return Err(ApiError::bad_request(format!(
                "{}; nothing was sent",
                refused.join("; ")
            )));
        }
        Ok(items)
    }
}

/// A station value from request text, by the channel's type, within the limits the station
/// gave for the channel (its configuration, read at connect): checked here so that a batch
/// with one value out of range sends nothing, where the station would apply the rest.
pub fn checked_value(
    channels: &ChannelTable,
    channel: &ChannelDescriptor,
    text: &str,
) -> Result<Value, ApiError> {
    let value = parse_value(channel, text)?;
    let limits = channels
        .config(&channel.name)
        .and_then(|config| config.limits);
    let number = match &value {
        Value::Float(x) => Some(*x),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    };
    if let (Some((min, max)), Some(x)) = (limits, number)
        && !(min..=max).contains(&x)
    {
        let unit = if channel.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", channel.unit)
        };
        return Err(ApiError::bad_request(format!(
            "{}: {} is outside {} to {}{unit}",
            channel.name,
            value.render(),
            Value::Float(min).render(),
            Value::Float(max).render()
        )));
    }
    Ok(value)
}

/// A station value from request text, by the channel's type.
fn parse_value(channel: &ChannelDescriptor, text: &str) -> Result<Value, ApiError> {
    if !channel.writable {
        return Err(ApiError::bad_request(format!(
            "{} is read only",
            channel.name
        )));
    }
    Value::parse_as(channel.value_type, text, &channel.options)
        .map_err(|error| ApiError::bad_request(format!("bad value for {}: {error}", channel.name)))
}
