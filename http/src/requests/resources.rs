//! `api/resources/...` bodies (the .NET client's `ResourcesGroup`: `{Name}`, `{Name, Value}`,
//! `{Names}` with the gateway's `MaxAgeMs`, `{Resources}`), and their values checked against
//! the channel table: the channel found by name or alias, writable, of its type, within the
//! limits the station gave for it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use station_protocol::{ChannelDescriptor, Value};

use super::{RequestBody, ValueText, asked_text};
use crate::body::{Deferred, Sent, StringList, Whole};
use crate::error::ApiError;
use crate::link::ChannelTable;
use crate::station::Freshness;

/// `POST api/resources/value/get {Name}`: a forced read of one channel.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceNameRequest {
    pub name: String,
}

impl RequestBody for ResourceNameRequest {}

/// `POST api/resources/values/get {Names, MaxAgeMs?}`: a read of several channels, from the
/// cache when `MaxAgeMs` is above 0. Both fields are checked by the handler, after the lease
/// admission, which asks only whether a valid `MaxAgeMs` above 0 was sent (bad names do not
/// make a cached read a forced one: the handler refuses them).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceValuesRequest {
    pub names: Deferred<StringList>,
    pub max_age_ms: Deferred<Option<Whole>>,
}

impl ResourceValuesRequest {
    /// The names, checked, and how fresh their values must be: while someone else holds the
    /// lease (`cache_only`: the admission lets a non-holder through only with a maximum age)
    /// every value comes from the cache however old; with a maximum age, fresh cached values
    /// serve; else the hardware.
    pub fn names_and_freshness(
        self,
        cache_only: bool,
    ) -> Result<(Vec<String>, Freshness<'static>), ApiError> {
        let StringList(names) = self.names.checked()?;
        let freshness = match self.max_age_ms.checked()? {
            _ if cache_only => Freshness::CacheOnly,
            Some(Whole(ms)) if ms > 0 => Freshness::Within(Duration::from_millis(ms)),
            _ => Freshness::Hardware,
        };
        Ok((names, freshness))
    }
}

impl RequestBody for ResourceValuesRequest {
    /// A maximum age above 0 asks for cached values, which a non-holder may read while the
    /// lease is held; one the handler refuses asks for nothing cached.
    fn cached(&self) -> bool {
        self.max_age_ms
            .value()
            .is_some_and(|max_age| max_age.is_some_and(|Whole(ms)| ms > 0))
    }
}

/// `POST api/resources/value/set` and `api/resources/transact {Name, Value}`: checked by the
/// handler ([`ResourceValueRequest::checked`]), kept as sent for the audit line.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceValueRequest {
    pub name: Sent<Deferred<String>>,
    pub value: Sent<Deferred<ValueText>>,
}

impl RequestBody for ResourceValueRequest {
    /// `VSET1=100`: the value as the station's text, or as sent when it is not one.
    fn asked(&self) -> Option<String> {
        let name = self.name.text.as_deref()?;
        let value = self.value.value.value().map(|text| text.0.as_str());
        let value = value.or(self.value.text.as_deref())?;
        asked_text(&[format!("{name}={value}")])
    }
}

impl ResourceValueRequest {
    /// The name and the value, or a 400 naming the first of them that is missing or wrong.
    pub fn checked(self) -> Result<(String, ValueText), ApiError> {
        Ok((self.name.value.checked()?, self.value.value.checked()?))
    }
}

/// The channel `name` (by name or alias, as asked) and `text` as a value of its type, checked.
pub fn item(
    name: String,
    text: &ValueText,
    channels: &ChannelTable,
) -> Result<(String, Value), ApiError> {
    let channel = channels
        .get(&name)
        .ok_or_else(|| ApiError::no_such_resource(&name))?;
    let value = checked_value(channels, channel, &text.0)?;
    Ok((name, value))
}

/// `POST api/resources/values/set {Resources}`: name → value, each value checked after its
/// name is found.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ResourceValuesSetRequest {
    pub resources: BTreeMap<String, Sent<Deferred<ValueText>>>,
}

impl RequestBody for ResourceValuesSetRequest {
    /// `A=1,B=True`: each value as the station's text, or as sent when it is not one.
    fn asked(&self) -> Option<String> {
        let parts: Vec<String> = self
            .resources
            .iter()
            .map(|(name, sent)| {
                let value = sent.value.value().map(|text| text.0.as_str());
                let value = value.or(sent.text.as_deref()).unwrap_or_default();
                format!("{name}={value}")
            })
            .collect();
        asked_text(&parts)
    }
}

impl ResourceValuesSetRequest {
    /// Every entry checked before anything is sent: an unknown name is 404; each value the
    /// gateway can tell is wrong is named, and then nothing is written.
    pub fn into_items(self, channels: &ChannelTable) -> Result<Vec<(String, Value)>, ApiError> {
        let mut items = Vec::with_capacity(self.resources.len());
        let mut refused = Vec::new();
        for (name, Sent { value: text, .. }) in self.resources {
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
