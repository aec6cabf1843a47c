//! The HTTP side of events: `GET api/events`, and `POST api/subscriptions`,
//! `PUT api/subscriptions/{id}`, `DELETE api/subscriptions/{id}` with their bodies bound
//! case-insensitively.

use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{Value as Json, json};

use super::SubscriptionRequest;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::http::Body;
use crate::http::body::JsonBody;

/// `GET api/events`: a `text/event-stream` that starts with `hello`.
pub fn open_stream(gateway: &Gateway) -> Result<Response<Body>, ApiError> {
    let opened = gateway.events.open_stream()?;
    let mut response = Response::new(opened.into_body(gateway.shutdown.clone()));
    *response.status_mut() = StatusCode::OK;
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

/// `POST api/subscriptions {StreamId, Channels, IntervalMs}` → `{id, expiresInMs}`.
pub fn create(gateway: &Gateway, body: &JsonBody) -> Result<Json, ApiError> {
    let stream_id = body.string("StreamId")?;
    let request = subscription_request(body)?;
    Ok(gateway.events.subscribe(stream_id, &request)?.to_json())
}

/// `PUT api/subscriptions/{id} {Channels, IntervalMs}` → `{id, expiresInMs}`.
pub fn update(gateway: &Gateway, id: &str, body: &JsonBody) -> Result<Json, ApiError> {
    let request = subscription_request(body)?;
    Ok(gateway.events.update(id, &request)?.to_json())
}

/// `DELETE api/subscriptions/{id}` → 200 `{}`.
pub fn delete(gateway: &Gateway, id: &str) -> Result<Json, ApiError> {
    gateway.events.unsubscribe(id)?;
    Ok(json!({}))
}

/// The id in `subscriptions/{id}`, when the path has that shape.
pub fn subscription_id(path_below_api: &str) -> Option<&str> {
    path_below_api
        .strip_prefix("subscriptions/")
        .filter(|id| !id.is_empty() && !id.contains('/'))
}
