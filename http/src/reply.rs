//! The shapes of every HTTP answer: the body type, JSON answers and error answers. The one
//! place an answer's status is written: 200, 204, or an error's by its kind (`crate::error`).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use http_body_util::combinators::BoxBody;
use hyper::body::{Frame, SizeHint};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};

use crate::error::{ApiError, ErrorKind};

/// Every response body: a whole document (JSON, text, a file) or a stream of events. A whole
/// one is held as it is, not boxed: most answers are whole, and a box is an allocation more
/// for every request.
#[derive(Debug)]
pub enum Body {
    /// The whole answer.
    Whole(Full<Bytes>),
    /// An answer sent as it comes: an event stream.
    Streamed(BoxBody<Bytes, Infallible>),
}

impl Body {
    /// A whole answer of `bytes`.
    pub fn whole(bytes: impl Into<Bytes>) -> Body {
        Body::Whole(Full::new(bytes.into()))
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Whole(whole) => Pin::new(whole).poll_frame(cx),
            Body::Streamed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Whole(whole) => whole.is_end_stream(),
            Body::Streamed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Whole(whole) => whole.size_hint(),
            Body::Streamed(body) => body.size_hint(),
        }
    }
}

/// A JSON answer: 200.
pub fn json_response(value: &serde_json::Value) -> Response<Body> {
    json_with_status(StatusCode::OK, value)
}

/// A JSON answer already serialized: 200.
pub fn json_bytes_response(bytes: Vec<u8>) -> Response<Body> {
    bytes_with_status(StatusCode::OK, bytes)
}

/// A 200 answer of another type than JSON (`text/csv; charset=utf-8`, ...).
pub fn typed_response(content_type: &'static str, bytes: Vec<u8>) -> Response<Body> {
    let mut response = bytes_with_status(StatusCode::OK, bytes);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// 204: done, nothing to say.
pub fn no_content() -> Response<Body> {
    let mut response = Response::new(Body::whole(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// An error answer: `{"error": message, "status": code}`; both clients show `error` (the first
/// key `accordionq2/_base.py` 5.28.1 looks at, the one the .NET client's `ApiGroupBase.cs` reads).
/// Its kind goes with it in the response's extensions, for the metrics ([`error_kind`]).
pub fn error_response(error: &ApiError) -> Response<Body> {
    let status = error.status();
    let mut response = json_with_status(
        status,
        &serde_json::json!({ "error": error.message, "status": status.as_u16() }),
    );
    if let Some(seconds) = error.retry_after_seconds() {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    if !error.allow.is_empty() {
        response
            .headers_mut()
            .insert(ALLOW, error.allow.header_value());
    }
    response.extensions_mut().insert(error.kind);
    response
}

/// An error answer that carries what was done besides: `details` (a JSON object) with the
/// error's `error` and `status` added, status, headers and kind as [`error_response`]'s. For an
/// action that ended short of what was asked (a safe stop whose safe state is not confirmed):
/// the client sees the failure and everything it needs to know of what did happen.
pub fn error_response_with(error: &ApiError, mut details: serde_json::Value) -> Response<Body> {
    let mut response = error_response(error);
    if let Some(object) = details.as_object_mut() {
        object.insert("error".into(), error.message.clone().into());
        object.insert("status".into(), error.status().as_u16().into());
        *response.body_mut() =
            Body::whole(serde_json::to_vec(&details).unwrap_or_else(|_| b"null".to_vec()));
    }
    response
}

/// The kind of error an answer tells, when it is one.
pub fn error_kind<B>(response: &Response<B>) -> Option<ErrorKind> {
    response.extensions().get::<ErrorKind>().copied()
}

fn json_with_status(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    bytes_with_status(status, bytes)
}

fn bytes_with_status(status: StatusCode, bytes: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Body::whole(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}
