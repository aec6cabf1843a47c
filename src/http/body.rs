//! Request bodies: read with a size limit and time limits, parsed as JSON, and fields bound by
//! name case-insensitively (`Name` and `name` alike), with errors that name the field.
//!
//! The time limits (`http.body_timeout_ms` for the whole body from the request's arrival,
//! `http.body_idle_timeout_ms` between two of its pieces) come from the request's scope, set
//! by the accept loop with [`with_body_limits`]: every handler's [`read_body`] honours them
//! without the router passing them along, and the accept loop learns afterwards whether the
//! body timed out (to close the connection, log it once and count it).

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};
use serde_json::{Map, Value as Json};
use tokio::time::Instant;

use crate::error::ApiError;

/// How long a request body may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimeouts {
    /// The whole body, from the request's arrival.
    pub total: Duration,
    /// Between two pieces of it.
    pub idle: Duration,
}

impl BodyTimeouts {
    /// The defaults of `[http]`, for a body read outside a request's scope.
    pub const DEFAULT: BodyTimeouts = BodyTimeouts {
        total: Duration::from_secs(10),
        idle: Duration::from_secs(5),
    };
}

/// Which body limit ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyTimeout {
    /// The whole body did not come within [`BodyTimeouts::total`].
    Total(Duration),
    /// Nothing came for [`BodyTimeouts::idle`].
    Idle(Duration),
}

impl BodyTimeout {
    /// The 408 answer's message, naming the limit.
    pub fn message(self) -> String {
        match self {
            BodyTimeout::Total(limit) => {
                format!("request body not received within {}", readable(limit))
            }
            BodyTimeout::Idle(limit) => format!(
                "request body stalled: no part of it received for {}",
                readable(limit)
            ),
        }
    }
}

/// `10 s`, or `300 ms` below a whole second.
pub fn readable(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms >= 1000 && ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// One request's body limits and what became of them.
struct BodyScope {
    timeouts: BodyTimeouts,
    /// When the request arrived: the total limit counts from here.
    arrived: Instant,
    timed_out: Cell<Option<BodyTimeout>>,
}

tokio::task_local! {
    static BODY_SCOPE: BodyScope;
}

/// Runs `request` (a handler) with `timeouts` for any body it reads, counted from now; also
/// returns which body limit ran out, if one did.
///
/// A plain function returning the scoped future, and the output read by a combinator (neither
/// an `async fn` nor an `async move` block): either would hold `request` twice in its state,
/// once as captured and once as awaited, and a request's whole future is moved (copied) as it
/// is handed to hyper and boxed. `answer`'s future went from 5.3 to 3.0 KB (issue 30; 0.7 KB
/// since the request's future is boxed where `answer` makes it).
pub fn with_body_limits<F: Future>(
    timeouts: BodyTimeouts,
    request: F,
) -> impl Future<Output = (F::Output, Option<BodyTimeout>)> {
    let scope = BodyScope {
        timeouts,
        arrived: Instant::now(),
        timed_out: Cell::new(None),
    };
    BODY_SCOPE.scope(
        scope,
        request.map(|output| {
            let timed_out = BODY_SCOPE.with(|scope| scope.timed_out.get());
            (output, timed_out)
        }),
    )
}

/// Which body limit ran out for the request being answered, if one did (inside
/// [`with_body_limits`]).
pub fn timed_out() -> Option<BodyTimeout> {
    BODY_SCOPE
        .try_with(|scope| scope.timed_out.get())
        .ok()
        .flatten()
}

/// Reads the whole body, refusing one over `limit` bytes with 413 and one that does not come
/// in time with 408 (the limits of [`with_body_limits`], or [`BodyTimeouts::DEFAULT`]).
pub async fn read_body(body: Incoming, limit: usize) -> Result<bytes::Bytes, ApiError> {
    // A declared Content-Length over the limit is refused at once, not after waiting for
    // bytes that may never come.
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large(limit));
    }
    let (timeouts, arrived) = BODY_SCOPE
        .try_with(|scope| (scope.timeouts, scope.arrived))
        .unwrap_or_else(|_| (BodyTimeouts::DEFAULT, Instant::now()));
    let deadline = arrived + timeouts.total;
    let mut body = Limited::new(body, limit);
    let mut collected = bytes::BytesMut::new();
    loop {
        // A piece already buffered (usually the whole of a small body) needs no timer.
        let piece = match body.frame().now_or_never() {
            Some(piece) => Ok(piece),
            None => {
                let next_piece = (Instant::now() + timeouts.idle).min(deadline);
                tokio::time::timeout_at(next_piece, body.frame()).await
            }
        };
        let frame = match piece {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(error))) if error.is::<http_body_util::LengthLimitError>() => {
                return Err(too_large(limit));
            }
            Ok(Some(Err(error))) => {
                return Err(ApiError::bad_request(format!(
                    "the request body could not be read: {error}"
                )));
            }
            Err(_elapsed) => {
                let timed_out = if Instant::now() >= deadline {
                    BodyTimeout::Total(timeouts.total)
                } else {
                    BodyTimeout::Idle(timeouts.idle)
                };
                let _ = BODY_SCOPE.try_with(|scope| scope.timed_out.set(Some(timed_out)));
                return Err(ApiError::body_timeout(timed_out.message()));
            }
        };
        if let Ok(data) = frame.into_data() {
            collected.extend_from_slice(&data);
        }
    }
    Ok(collected.freeze())
}

fn too_large(limit: usize) -> ApiError {
    ApiError::too_large(format!("the request body is over the {limit}-byte limit"))
}

/// A JSON object body with case-insensitive field access.
///
/// Its fields are kept as a list sorted by name, each name once (the last of a repeated one):
/// what `serde_json`'s map holds, without a tree's allocations and walk for the few fields a
/// body has.
#[derive(Debug)]
pub struct JsonBody(Vec<(String, Json)>);

impl JsonBody {
    /// Parses `bytes` as a JSON object; an empty body is an empty object.
    pub fn parse(bytes: &[u8]) -> Result<JsonBody, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonBody(Vec::new()));
        }
        match serde_json::from_slice::<TopLevel>(bytes) {
            Ok(TopLevel::Object(fields)) => Ok(JsonBody(fields)),
            Ok(TopLevel::Other) => Err(ApiError::bad_request(
                "the request body must be a JSON object",
            )),
            Err(error) => Err(ApiError::bad_request(format!(
                "the request body is not valid JSON: {error}"
            ))),
        }
    }

    /// A JSON object nested in a body, with the same case-insensitive access.
    pub fn from_object(object: Map<String, Json>) -> JsonBody {
        // A map's fields come sorted by name, each once.
        JsonBody(object.into_iter().collect())
    }

    /// The field called `name`, in any letter case.
    pub fn get(&self, name: &str) -> Option<&Json> {
        self.0
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
            .filter(|v| !v.is_null())
    }

    pub fn required(&self, name: &str) -> Result<&Json, ApiError> {
        self.get(name)
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} is missing")))
    }

    pub fn string(&self, name: &str) -> Result<&str, ApiError> {
        self.required(name)?
            .as_str()
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} must be a string")))
    }

    /// A value in the station's text format; numbers and booleans are taken as their text.
    pub fn value_text(&self, name: &str) -> Result<String, ApiError> {
        value_text(self.required(name)?, name)
    }

    pub fn optional_u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(value) => value
                .as_u64()
                .or_else(|| {
                    value
                        .as_f64()
                        .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 9e15)
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "the field {name} must be a whole number of 0 or more"
                    ))
                }),
        }
    }

    pub fn string_list(&self, name: &str) -> Result<Vec<String>, ApiError> {
        let wrong =
            || ApiError::bad_request(format!("the field {name} must be an array of strings"));
        self.required(name)?
            .as_array()
            .ok_or_else(wrong)?
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(wrong))
            .collect()
    }

    pub fn object(&self, name: &str) -> Result<&Map<String, Json>, ApiError> {
        self.required(name)?
            .as_object()
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} must be an object")))
    }
}

/// A body's top level: an object's fields (sorted by name, the last of a repeated name kept,
/// as `serde_json::Map` keeps them), or any other JSON value.
enum TopLevel {
    Object(Vec<(String, Json)>),
    Other,
}

impl<'de> serde::Deserialize<'de> for TopLevel {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<TopLevel, D::Error> {
        deserializer.deserialize_any(TopLevelVisitor)
    }
}

struct TopLevelVisitor;

impl<'de> serde::de::Visitor<'de> for TopLevelVisitor {
    type Value = TopLevel;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TopLevel, A::Error> {
        let mut fields: Vec<(String, Json)> = Vec::with_capacity(map.size_hint().unwrap_or(4));
        while let Some(field) = map.next_entry::<String, Json>()? {
            fields.push(field);
        }
        // Stable: a repeated name's entries stay in the order sent.
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        if fields.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            // Keep the last of each repeated name: reversed, it is the first of its run.
            fields.reverse();
            fields.dedup_by(|later, kept| later.0 == kept.0);
            fields.reverse();
        }
        Ok(TopLevel::Object(fields))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<TopLevel, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(TopLevel::Other)
    }

    fn visit_bool<E>(self, _: bool) -> Result<TopLevel, E> {
        Ok(TopLevel::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<TopLevel, E> {
        Ok(TopLevel::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<TopLevel, E> {
        Ok(TopLevel::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<TopLevel, E> {
        Ok(TopLevel::Other)
    }

    fn visit_str<E>(self, _: &str) -> Result<TopLevel, E> {
        Ok(TopLevel::Other)
    }

    fn visit_unit<E>(self) -> Result<TopLevel, E> {
        Ok(TopLevel::Other)
    }
}

/// A JSON value as station value text: strings as they are, numbers and booleans as text.
pub fn value_text(value: &Json, field: &str) -> Result<String, ApiError> {
    match value {
        Json::String(text) => Ok(text.clone()),
        Json::Number(number) => Ok(number.to_string()),
        Json::Bool(true) => Ok("True".into()),
        Json::Bool(false) => Ok("False".into()),
        _ => Err(ApiError::bad_request(format!(
            "the field {field} must be a string such as \"5\" or \"True\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields a body is read by are those `serde_json`'s map would give: sorted by name,
    /// the last of a repeated name, the first of a name's spellings in that order.
    #[test]
    fn fields_are_the_ones_serde_jsons_map_would_hold() {
        let bodies: [&[u8]; 7] = [
            br#"{"Name": "A", "Name": "B"}"#,
            br#"{"name": "low", "NAME": "up", "Name": "mixed"}"#,
            br#"{"Name": null, "name": "A"}"#,
            br#"{"b": 1, "a": 2, "B": 3, "b": 4, "c": {"x": 1}}"#,
            br#"{}"#,
            br#"{"Names": ["x", "y"], "MaxAgeMs": 600000}"#,
            br#"{"z": 1, "y": 2, "x": 3, "w": 4, "v": 5, "u": 6, "t": 7, "s": 8, "z": 9}"#,
        ];
        for bytes in bodies {
            let body = JsonBody::parse(bytes).unwrap();
            let Json::Object(map) = serde_json::from_slice::<Json>(bytes).unwrap() else {
                panic!("not an object")
            };
            let from_map = JsonBody::from_object(map);
            assert_eq!(format!("{:?}", body.0), format!("{:?}", from_map.0));
            for name in ["name", "NAME", "b", "B", "names", "z", "missing"] {
                assert_eq!(body.get(name), from_map.get(name), "{name} in {bytes:?}");
            }
        }
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused_naming_why() {
        for bytes in [&b"[1, 2]"[..], b"5", b"\"text\"", b"true", b"null", b"-1.5"] {
            let error = JsonBody::parse(bytes).unwrap_err();
            assert_eq!(
                error.message, "the request body must be a JSON object",
                "{bytes:?}"
            );
        }
        let error = JsonBody::parse(b"{\"a\": ").unwrap_err();
        assert!(
            error
                .message
                .starts_with("the request body is not valid JSON: "),
            "{}",
            error.message
        );
    }

    #[test]
    fn escaped_names_and_lists_read_as_sent() {
        // An escaped name is unescaped; a list's errors name what was wrong.
        let bytes = br#"{"Na\u006des": ["a", "b\"c", "\u00e9"], "Max\tAge": 5, "Other": {"x": 1}}"#;
        let body = JsonBody::parse(bytes).unwrap();
        let expected = vec!["a".to_owned(), "b\"c".to_owned(), "é".to_owned()];
        assert_eq!(body.string_list("names").unwrap(), expected);
        assert!(body.get("NAMES").unwrap().is_array());
        assert_eq!(body.string_list("Names").unwrap(), expected);
        assert_eq!(body.optional_u64("max\tage").unwrap(), Some(5));
        assert_eq!(body.object("other").unwrap()["x"], 1);
        for (bytes, message) in [
            (
                &br#"{"Names": ["a", 1]}"#[..],
                "must be an array of strings",
            ),
            (br#"{"Names": null}"#, "is missing"),
            (br#"{"Names": "a"}"#, "must be an array of strings"),
            (br#"{}"#, "is missing"),
        ] {
            let error = JsonBody::parse(bytes)
                .unwrap()
                .string_list("Names")
                .unwrap_err();
            assert!(
                error.message.contains(message),
                "{bytes:?}: {}",
                error.message
            );
        }
    }

    #[test]
    fn fields_bind_in_any_case() {
        let body = JsonBody::parse(br#"{"name": "A", "MAXAGEMS": 5}"#).unwrap();
        assert_eq!(body.string("Name").unwrap(), "A");
        assert_eq!(body.optional_u64("MaxAgeMs").unwrap(), Some(5));
    }

    #[test]
    fn errors_name_the_field() {
        let body = JsonBody::parse(br#"{"Names": "A", "MaxAgeMs": -1}"#).unwrap();
        assert!(
            body.string_list("Names")
                .unwrap_err()
                .message
                .contains("Names")
        );
        assert!(
            body.optional_u64("MaxAgeMs")
                .unwrap_err()
                .message
                .contains("MaxAgeMs")
        );
        assert!(
            body.string("Value")
                .unwrap_err()
                .message
                .contains("Value is missing")
        );
        assert!(JsonBody::parse(b"[1]").is_err());
        assert!(
            JsonBody::parse(b"{")
                .unwrap_err()
                .message
                .contains("not valid JSON")
        );
    }
}
