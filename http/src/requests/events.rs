//! `api/subscriptions` bodies (`{StreamId}` and the subscription's `{Channels, IntervalMs,
//! Deadband?, MinIntervalMs?, MaxIntervalMs?, ChannelOptions?}`), turned into the events
//! module's [`SubscriptionRequest`]; the bounds of each option are the events module's.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de;
use serde_json::Value as Json;

use super::RequestBody;
use crate::body::{StringList, Whole, said, whole_of_float};
use crate::events::filter::{Deadband, FilterOptions};
use crate::events::{EventsError, SubscriptionRequest};

/// `POST api/subscriptions`: the stream the subscription's events go to (read before the
/// subscription itself), then the subscription, field for field as [`SubscriptionBody`].
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SubscribeRequest {
    pub stream_id: String,
    pub channels: StringList,
    pub interval_ms: IntervalMs,
    pub deadband: Option<DeadbandSent>,
    pub min_interval_ms: Option<Whole>,
    pub max_interval_ms: Option<Whole>,
    pub channel_options: Option<BTreeMap<String, ChannelFilter>>,
}

impl SubscribeRequest {
    /// The stream and the subscription.
    pub fn into_parts(self) -> (String, SubscriptionBody) {
        let SubscribeRequest {
            stream_id,
            channels,
            interval_ms,
            deadband,
            min_interval_ms,
            max_interval_ms,
            channel_options,
        } = self;
        let body = SubscriptionBody {
            channels,
            interval_ms,
            deadband,
            min_interval_ms,
            max_interval_ms,
            channel_options,
        };
        (stream_id, body)
    }
}

impl RequestBody for SubscribeRequest {}

impl RequestBody for SubscriptionBody {}

/// `POST api/subscriptions` and `PUT api/subscriptions/{id}`: what to send, how often, and
/// the filters (for every channel, and a channel's own in `ChannelOptions`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SubscriptionBody {
    pub channels: StringList,
    pub interval_ms: IntervalMs,
    pub deadband: Option<DeadbandSent>,
    pub min_interval_ms: Option<Whole>,
    pub max_interval_ms: Option<Whole>,
    pub channel_options: Option<BTreeMap<String, ChannelFilter>>,
}

/// A channel's own filters in `ChannelOptions`, replacing the subscription's field by field.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ChannelFilter {
    pub deadband: Option<DeadbandSent>,
    pub min_interval_ms: Option<Whole>,
    pub max_interval_ms: Option<Whole>,
}

impl SubscriptionBody {
    pub fn into_request(self) -> SubscriptionRequest {
        let options = filter_options(self.deadband, self.min_interval_ms, self.max_interval_ms);
        let channel_options = self
            .channel_options
            .unwrap_or_default()
            .into_iter()
            .map(|(name, own)| {
                let own = filter_options(own.deadband, own.min_interval_ms, own.max_interval_ms);
                (name, own)
            })
            .collect();
        SubscriptionRequest {
            channels: self.channels.0,
            interval_ms: self.interval_ms.0,
            options,
            channel_options,
        }
    }
}

fn filter_options(
    deadband: Option<DeadbandSent>,
    min_interval_ms: Option<Whole>,
    max_interval_ms: Option<Whole>,
) -> FilterOptions {
    let millis = |ms: Option<Whole>| ms.map(|Whole(ms)| Duration::from_millis(ms));
    FilterOptions {
        deadband: deadband.map(|sent| sent.0),
        min_interval: millis(min_interval_ms),
        max_interval: millis(max_interval_ms),
    }
}

/// `IntervalMs`: a whole number of 0 or more; anything else is refused naming its range
/// (100.5 is in range, but not whole), with the value as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalMs(pub u64);

impl<'de> Deserialize<'de> for IntervalMs {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let sent = Json::deserialize(deserializer)?;
        let whole = match &sent {
            Json::Number(number) => number
                .as_u64()
                .or_else(|| number.as_f64().and_then(whole_of_float)),
            _ => None,
        };
        whole
            .map(IntervalMs)
            .ok_or_else(|| de::Error::custom(EventsError::IntervalNotWhole(sent.to_string())))
    }
}

/// `{"Absolute": x}` or `{"Percent": p}`, the name in any letter case, one of them (a `null`
/// one as absent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeadbandSent(pub Deadband);

struct DeadbandShape;

impl de::Expected for DeadbandShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{\"Absolute\": number} or {\"Percent\": number}")
    }
}

impl<'de> Deserialize<'de> for DeadbandSent {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let shape = || de::Error::invalid_type(de::Unexpected::Other("deadband"), &DeadbandShape);
        let Json::Object(object) = Json::deserialize(deserializer)? else {
            return Err(shape());
        };
        let mut entries = object.iter().filter(|(_, value)| !value.is_null());
        let (Some((kind, amount)), None) = (entries.next(), entries.next()) else {
            return Err(shape());
        };
        let amount = amount
            .as_f64()
            .ok_or_else(|| said("the field ", format_args!(".{kind} must be a number")))?;
        if kind.eq_ignore_ascii_case("Absolute") {
            Ok(DeadbandSent(Deadband::Absolute(amount)))
        } else if kind.eq_ignore_ascii_case("Percent") {
            Ok(DeadbandSent(Deadband::Percent(amount)))
        } else {
            Err(shape())
        }
    }
}
