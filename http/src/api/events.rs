//! `api/events` and `api/subscriptions...`: the event stream, and subscriptions (their bodies
//! typed in `requests/events.rs`).

use hyper::Response;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use serde_json::json;

use super::call::{Answer, Call, ok};
use crate::error::ApiError;
use crate::events::event_id::EventId;
use crate::events::{StreamStart, SubscriptionRequest};
use crate::requests::events::{SubscribeRequest, SubscriptionBody};

/// `GET api/events`: a `text/event-stream` that starts with `hello`; with `Last-Event-ID`
/// (the header, or the query parameter `lastEventId` for a client that cannot set headers)
/// the stream of that event, resumed, or a new one that says first what was lost.
pub(super) async fn open_stream(call: Call<'_>) -> Answer {
    let gateway = call.gateway;
    let last_seen = last_event_id(&call)?;
    // Who opens it, for the access rules' read rights over events about a channel, and
    // whose credentials: only the same may resume it.
    let opener = gateway.access.caller(call.headers);
    let (opened, start) = gateway
        .events
        .open_stream(call.who_if_rules(), opener, last_seen)?;
    if start != StreamStart::New {
        tracing::debug!(stream = %opened.sink.id, ?start, "an event stream reconnected");
    }
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

/// The `Last-Event-ID` a reconnecting reader sent: the header, else the query parameter
/// `lastEventId`; an empty one counts as none (the SSE standard's reconnection without an id).
fn last_event_id(call: &Call<'_>) -> Result<Option<EventId>, ApiError> {
    let header = call
        .headers
        .get("last-event-id")
        .map(|value| value.to_str().unwrap_or("\u{fffd}").to_owned());
    let query = || {
        form_urlencoded::parse(call.query.unwrap_or("").as_bytes())
            .find(|(key, _)| key == "lastEventId")
            .map(|(_, value)| value.into_owned())
    };
    match header.or_else(query) {
        Some(id) if !id.trim().is_empty() => Ok(Some(
            EventId::parse(&id).map_err(crate::events::EventsError::from)?,
        )),
        _ => Ok(None),
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
pub(super) async fn subscribe(call: Call<'_>, request: SubscribeRequest) -> Answer {
    let (stream_id, request) = request.into_parts();
    let request = request.into_request();
    may_read(&call, &request)?;
    ok(call
        .gateway
        .events
        .subscribe(&stream_id, &request)?
        .to_json())
}

/// `PUT api/subscriptions/{id} {Channels, IntervalMs, …the same options}` → `{id, expiresInMs}`.
pub(super) async fn update(call: Call<'_>, request: SubscriptionBody) -> Answer {
    let request = request.into_request();
    may_read(&call, &request)?;
    ok(call.gateway.events.update(call.id, &request)?.to_json())
}

/// `DELETE api/subscriptions/{id}` → 200 `{}`.
pub(super) async fn unsubscribe(call: Call<'_>) -> Answer {
    call.gateway.events.unsubscribe(call.id)?;
    ok(json!({}))
}
