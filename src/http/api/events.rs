//! `api/events` and `api/subscriptions...`: the event stream, and subscriptions with their
//! bodies bound case-insensitively.

use hyper::Response;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use serde_json::json;

use super::call::{Answer, Call, ok};
use crate::error::ApiError;
use crate::events::SubscriptionRequest;
use crate::http::body::JsonBody;

/// `GET api/events`: a `text/event-stream` that starts with `hello`.
pub(super) async fn open_stream(call: Call<'_>) -> Answer {
    let gateway = call.gateway;
    let opened = gateway.events.open_stream()?;
    let mut response = Response::new(opened.into_body(gateway.shutdown.clone()));
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
        .optional_u64("IntervalMs")?
        .ok_or_else(|| ApiError::bad_request("the field IntervalMs is missing"))?;
    Ok(SubscriptionRequest {
        channels,
        interval_ms,
    })
}

/// The access rules' read rights over every channel of a subscription, decided by the station
/// service; a refusal (403) names the channel and the rule.
fn may_read(call: &Call<'_>, request: &SubscriptionRequest) -> Result<(), ApiError> {
    call.gateway
        .station
        .may_read(&call.who(), &request.channels)
        .map_err(|refusal| {
            ApiError::from(crate::link::LinkError::Refused(
                crate::link::GuardRefusal::Access(Box::new(refusal)),
            ))
        })
}

/// `POST api/subscriptions {StreamId, Channels, IntervalMs}` → `{id, expiresInMs}`.
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

/// `PUT api/subscriptions/{id} {Channels, IntervalMs}` → `{id, expiresInMs}`.
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
