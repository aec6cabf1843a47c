//! `api/events` and `api/subscriptions...`: the event stream, and subscriptions with their
//! bodies bound case-insensitively.

use hyper::Response;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use serde_json::json;

use super::call::{Answer, Call, ok};
use crate::error::ApiError;
use std::time::Duration;

use serde_json::Value as Json;

use crate::body::JsonBody;
use crate::events::SubscriptionRequest;
use crate::events::filter::{Deadband, FilterOptions};

/// `GET api/events`: a `text/event-stream` that starts with `hello`.
pub(super) async fn open_stream(call: Call<'_>) -> Answer {
    let gateway = call.gateway;
    // Who opens it, for the access rules' read rights over events about a channel.
    let opened = gateway.events.open_stream(call.who_if_rules())?;
    let mut response = Response::new(super::super::reply::Body::Streamed(
        opened.into_body(gateway.shutdown.clone()),
    ));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Reverse proxies (nginx) must pass events through at once, not buffer them.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

fn subscription_request(body: &JsonBody) -> Result<SubscriptionRequest, ApiError> {
    let channels = body.string_list("Channels")?;
    let interval_ms = body
        .optional_u64("IntervalMs")
        .map_err(|_| {
            // Its range and that it must be whole, not only "0 or more" (100.5 is in range).
            let got = body
                .get("IntervalMs")
                .map(Json::to_string)
                .unwrap_or_default();
            ApiError::from(crate::events::EventsError::IntervalNotWhole(got))
        })?
        .ok_or_else(|| ApiError::bad_request("the field IntervalMs is missing"))?;
    let options = filter_options(body, "")?;
    let mut channel_options = Vec::new();
    if body.get("ChannelOptions").is_some() {
        for (name, own) in body.object("ChannelOptions")? {
            let field = format!("ChannelOptions.{name}");
            let own = own.as_object().ok_or_else(|| {
                ApiError::bad_request(format!("the field {field} must be an object"))
            })?;
            let own = filter_options(&JsonBody::from_object(own.clone()), &format!("{field}."))?;
            channel_options.push((name.clone(), own));
        }
    }
    Ok(SubscriptionRequest {
        channels,
        interval_ms,
        options,
        channel_options,
    })
}

/// `Deadband`, `MinIntervalMs` and `MaxIntervalMs` of a subscription or of one of its
/// channels (`field` prefixes the names in an error); their bounds are the events module's.
fn filter_options(body: &JsonBody, field: &str) -> Result<FilterOptions, ApiError> {
    let named = |error: ApiError| ApiError::bad_request(format!("{field}{}", error.message));
    let millis = |name: &str| -> Result<Option<Duration>, ApiError> {
        Ok(body
            .optional_u64(name)
            .map_err(named)?
            .map(Duration::from_millis))
    };
    let deadband = match body.get("Deadband") {
        None => None,
        Some(deadband) => Some(deadband_of(deadband, &format!("{field}Deadband"))?),
    };
    Ok(FilterOptions {
        deadband,
        min_interval: millis("MinIntervalMs")?,
        max_interval: millis("MaxIntervalMs")?,
    })
}

/// `{"Absolute": x}` or `{"Percent": p}`, in any letter case.
fn deadband_of(deadband: &Json, field: &str) -> Result<Deadband, ApiError> {
    let shape = || {
        ApiError::bad_request(format!(
            "the field {field} must be {{\"Absolute\": number}} or {{\"Percent\": number}}"
        ))
    };
    let object = deadband.as_object().ok_or_else(shape)?;
    let mut entries = object.iter().filter(|(_, value)| !value.is_null());
    let (Some((kind, amount)), None) = (entries.next(), entries.next()) else {
        return Err(shape());
    };
    let amount = amount.as_f64().ok_or_else(|| {
        ApiError::bad_request(format!("the field {field}.{kind} must be a number"))
    })?;
    if kind.eq_ignore_ascii_case("Absolute") {
        Ok(Deadband::Absolute(amount))
    } else if kind.eq_ignore_ascii_case("Percent") {
        Ok(Deadband::Percent(amount))
    } else {
        Err(shape())
    }
}

/// The access rules' read rights over every channel of a subscription, decided by the station
/// service; a refusal (403) names the channel and the rule.
fn may_read(call: &Call<'_>, request: &SubscriptionRequest) -> Result<(), ApiError> {
    call.gateway
        .station
        .may_read(&call.who(), &request.channels)
        .map_err(|refusal| {
            ApiError::from(crate::link::LinkError::Refused(
                crate::link::GuardRefusal::from(refusal),
            ))
        })
}

/// `POST api/subscriptions {StreamId, Channels, IntervalMs, Deadband?, MinIntervalMs?,
/// MaxIntervalMs?, ChannelOptions?}` → `{id, expiresInMs}`.
pub(super) async fn subscribe(call: Call<'_>) -> Answer {
    let stream_id = call.body.string("StreamId")?;
    let request = subscription_request(&call.body)?;
    may_read(&call, &request)?;
    ok(call
        .gateway
        .events
        .subscribe(stream_id, &request)?
        .to_json())
}

/// `PUT api/subscriptions/{id} {Channels, IntervalMs, …the same options}` → `{id, expiresInMs}`.
pub(super) async fn update(call: Call<'_>) -> Answer {
    let request = subscription_request(&call.body)?;
    may_read(&call, &request)?;
    ok(call.gateway.events.update(call.id, &request)?.to_json())
}

/// `DELETE api/subscriptions/{id}` → 200 `{}`.
pub(super) async fn unsubscribe(call: Call<'_>) -> Answer {
    call.gateway.events.unsubscribe(call.id)?;
    ok(json!({}))
}
