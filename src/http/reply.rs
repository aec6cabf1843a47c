//! The shapes of every HTTP answer: the body type, JSON answers and error answers.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};

use crate::error::ApiError;

/// Every response body: a whole JSON document or a stream of events.
pub type Body = BoxBody<Bytes, Infallible>;

/// A JSON answer.
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    json_bytes_response(status, bytes)
}

/// A JSON answer already serialized.
pub fn json_bytes_response(status: StatusCode, bytes: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

/// An error answer: `{"error": message, "status": code}`; the reference client shows `error`.
pub fn error_response(error: &ApiError) -> Response<Body> {
    json_response(
        error.status,
        &serde_json::json!({ "error": error.message, "status": error.status.as_u16() }),
    )
}
