//! Request bodies: read with a size limit and time limits, parsed as JSON, and fields bound by
//! name case-insensitively (`Name` and `name` alike), with errors that name the field. A body is
//! typed once, as its route's handler takes it, right after it is read (`routes.rs`,
//! [`JsonBody::typed`], `body/typed.rs`; the types are in `requests/`), from the nodes parsed
//! here, never parsing it again.
//!
//! The time limits (`http.body_timeout_ms` for the whole body from the request's arrival,
//! `http.body_idle_timeout_ms` between two of its pieces) come from the request's scope, set
//! by the accept loop with [`with_body_limits`]: every handler's [`read_body`] honours them
//! without the router passing them along, and the accept loop learns afterwards whether the
//! body timed out (to close the connection, log it once and count it).

use std::cell::Cell;
use std::future::Future;
use std::ops::Range;
#[cfg(test)]
use std::sync::OnceLock;
use std::time::Duration;

use futures::FutureExt;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};
use serde_json::{Map, Value as Json};
use tokio::time::Instant;

use crate::error::ApiError;

pub mod media_type;
mod typed;

pub(crate) use typed::whole_of_float;
pub use typed::{BodyError, Deferred, Sent, StringList, Whole, said};

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
/// is handed to hyper and boxed. `answer`'s future went from 5.3 to 3.0 KB (0.7 KB
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
///
/// What is already buffered is taken at once, and a body that came whole (a small body's
/// usual case) needs nothing more; one still on its way is waited for in a boxed future of its
/// own. A request's future then holds the wait's state (the limits, the pieces so far, the
/// timer: 0.5 KB) only while a body is slow, not on every request. Not an `async
/// fn`, which would hold the body twice (see [`with_body_limits`]).
pub fn read_body(
    body: Incoming,
    limit: usize,
) -> impl Future<Output = Result<bytes::Bytes, ApiError>> + Send {
    // A declared Content-Length over the limit is refused at once, not after waiting for
    // bytes that may never come.
    let too_large_declared = body.size_hint().lower() > limit as u64;
    let mut body = Limited::new(body, limit);
    async move {
        if too_large_declared {
            return Err(too_large(limit));
        }
        let mut first = bytes::Bytes::new();
        if let Some(piece) = body.frame().now_or_never() {
            match piece {
                None => return Ok(first),
                Some(Err(error)) => return Err(unreadable(error, limit)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        first = data;
                    }
                    // The whole declared length came: no need to ask again for the end.
                    if body.is_end_stream() {
                        return Ok(first);
                    }
                }
            }
        }
        Box::pin(read_rest(body, limit, first)).await
    }
}

/// The rest of a body after its `first` piece (empty: none yet), within the time limits.
async fn read_rest(
    mut body: Limited<Incoming>,
    limit: usize,
    mut first: bytes::Bytes,
) -> Result<bytes::Bytes, ApiError> {
    let (timeouts, arrived) = BODY_SCOPE
        .try_with(|scope| (scope.timeouts, scope.arrived))
        .unwrap_or_else(|_| (BodyTimeouts::DEFAULT, Instant::now()));
    let deadline = arrived + timeouts.total;
    // A body in one piece is kept as it came, without a copy.
    let mut joined: Option<bytes::BytesMut> = None;
    loop {
        // A piece already buffered needs no timer.
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
            Ok(Some(Err(error))) => return Err(unreadable(error, limit)),
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
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match &mut joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut both = bytes::BytesMut::with_capacity(first.len() + data.len());
                both.extend_from_slice(&first);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
        }
        // The whole declared length came: no need to ask again for the end.
        if body.is_end_stream() {
            break;
        }
    }
    Ok(joined.map_or(first, bytes::BytesMut::freeze))
}

/// A body that could not be read: over the limit (413) or broken off (400).
fn unreadable(error: Box<dyn std::error::Error + Send + Sync>, limit: usize) -> ApiError {
    if error.is::<http_body_util::LengthLimitError>() {
        too_large(limit)
    } else {
        // With its causes: hyper's "error reading a body from connection" says why only in
        // them ("end of file before message length reached": the client ended its side, or
        // its connection, before the body was whole).
        let mut message = format!("the request body could not be read: {error}");
        let mut cause = error.source();
        while let Some(error) = cause {
            message.push_str(": ");
            message.push_str(&error.to_string());
            cause = error.source();
        }
        ApiError::bad_request(message)
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::too_large(format!("the request body is over the {limit}-byte limit"))
}

/// A JSON object body with case-insensitive field access.
///
/// Parsed once, as a `serde_json::Value` parse would parse it (the same bodies refused with
/// the same errors), into a flat list of [`Node`]s, its strings as spans of the body kept as
/// sent: a cached read's body costs one pass, one list and no copy of its names.
/// A field is looked up as `serde_json`'s map would hold it: the last of a repeated name, and
/// of a name's spellings in letter case the first in byte order. A field read as a
/// `serde_json::Value` (`JsonBody::get`, tests only) is made when first read and kept.
#[derive(Debug)]
pub struct JsonBody {
    /// The body as sent: the spans of [`Node::Text`] are of it.
    text: bytes::Bytes,
    /// The top-level object and everything in it, in the order sent; empty for no body.
    nodes: Vec<Node>,
    /// The values `JsonBody::get` made, each by its node's index (tests only).
    #[cfg(test)]
    made: OnceLock<Vec<(usize, OnceLock<Json>)>>,
}

/// One node of a parsed body. A container is followed by what it holds, up to `end` (the
/// index after its last node): an array by its items, an object by name, value, name, value.
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    /// A string without escapes, as sent (a span of the body).
    Text(Range<usize>),
    /// A string with escapes, unescaped.
    Unescaped(String),
    Array {
        end: usize,
    },
    Object {
        end: usize,
    },
}

/// The UTF-8 byte-order mark.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

impl JsonBody {
    /// Parses `bytes` as a JSON object; an empty body is an empty object.
    pub fn parse(bytes: &[u8]) -> Result<JsonBody, ApiError> {
        JsonBody::from_bytes(bytes::Bytes::copy_from_slice(bytes))
    }

    /// [`JsonBody::parse`] of a body already in [`bytes::Bytes`], kept without a copy.
    pub fn from_bytes(mut text: bytes::Bytes) -> Result<JsonBody, ApiError> {
        // A UTF-8 byte-order mark, as some Windows tools write it before the JSON, is not text.
        if text.starts_with(UTF8_BOM) {
            text = text.slice(UTF8_BOM.len()..);
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonBody::empty());
        }
        let mut nodes = Vec::with_capacity(16);
        let mut deserializer = serde_json::Deserializer::from_slice(&text);
        let seed = TopLevel(IntoNodes {
            nodes: &mut nodes,
            base: text.as_ptr() as usize,
            len: text.len(),
        });
        // What `serde_json::from_slice` does: the value, then nothing but white space.
        let parsed = serde::de::DeserializeSeed::deserialize(seed, &mut deserializer)
            .and_then(|is_object| deserializer.end().map(|()| is_object));
        match parsed {
            Ok(true) => Ok(JsonBody {
                text,
                nodes,
                #[cfg(test)]
                #[cfg(test)]
                made: OnceLock::new(),
            }),
            Ok(false) => Err(ApiError::bad_request(
                "the request body must be a JSON object",
            )),
            Err(error) => Err(not_json(error)),
        }
    }

    /// A body without fields.
    pub fn empty() -> JsonBody {
        JsonBody {
            text: bytes::Bytes::new(),
            nodes: Vec::new(),
            #[cfg(test)]
            made: OnceLock::new(),
        }
    }

    /// A JSON object nested in a body, with the same case-insensitive access.
    pub fn from_object(object: Map<String, Json>) -> JsonBody {
        let mut nodes = Vec::new();
        push_json(&mut nodes, Json::Object(object));
        JsonBody {
            text: bytes::Bytes::new(),
            nodes,
            #[cfg(test)]
            made: OnceLock::new(),
        }
    }

    /// The node of the field called `name`, in any letter case, unless it is absent or `null`.
    #[cfg(test)]
    fn field(&self, name: &str) -> Option<usize> {
        self.field_in(0, name)
    }

    /// [`JsonBody::field`] of the object at node `object` (none when it is not an object).
    fn field_in(&self, object: usize, name: &str) -> Option<usize> {
        let name = name.as_bytes();
        let mut found: Option<(&[u8], usize)> = None;
        for (key, value) in self.fields_of(object) {
            let Some(key) = self.string_at(key) else {
                continue;
            };
            // Sent as looked up, the usual case, before the slower comparison in any case.
            if (key == name || key.eq_ignore_ascii_case(name))
                && found.is_none_or(|(kept, _)| key <= kept)
            {
                found = Some((key, value));
            }
        }
        found
            .map(|(_, value)| value)
            .filter(|&value| !matches!(self.nodes[value], Node::Null))
    }

    /// The top level's fields as (name, value) nodes, in the order sent.
    #[cfg(test)]
    fn fields(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.fields_of(0)
    }

    /// The fields of the object at node `object` as (name, value) nodes, in the order sent;
    /// none when it is not an object.
    fn fields_of(&self, object: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let end = match self.nodes.get(object) {
            Some(Node::Object { end }) => *end,
            _ => 0,
        };
        let mut at = object + 1;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (key, value) = (at, at + 1);
            at = self.after(value);
            Some((key, value))
        })
    }

    /// The index after the value at `at` and all it holds.
    fn after(&self, at: usize) -> usize {
        match self.nodes.get(at) {
            Some(Node::Array { end } | Node::Object { end }) => *end,
            _ => at + 1,
        }
    }

    /// The string at node `at`, as bytes; `None` for another kind of node.
    fn string_at(&self, at: usize) -> Option<&[u8]> {
        match &self.nodes[at] {
            Node::Text(span) => Some(&self.text[span.clone()]),
            Node::Unescaped(text) => Some(text.as_bytes()),
            _ => None,
        }
    }

    /// The value at node `at` as a `serde_json::Value`.
    fn json_at(&self, at: usize) -> Json {
        match &self.nodes[at] {
            Node::Null => Json::Null,
            Node::Bool(value) => Json::Bool(*value),
            Node::Number(number) => Json::Number(number.clone()),
            Node::Text(span) => Json::String(text_of(&self.text[span.clone()])),
            Node::Unescaped(text) => Json::String(text.clone()),
            Node::Array { end } => {
                let mut items = Vec::new();
                let mut item = at + 1;
                while item < *end {
                    items.push(self.json_at(item));
                    item = self.after(item);
                }
                Json::Array(items)
            }
            Node::Object { end } => {
                let mut object = Map::new();
                let mut key = at + 1;
                while key < *end {
                    let name = self.string_at(key).map(text_of).unwrap_or_default();
                    object.insert(name, self.json_at(key + 1));
                    key = self.after(key + 1);
                }
                Json::Object(object)
            }
        }
    }

    /// The field called `name`, in any letter case: for tests only, as the reference the typed
    /// reads are compared against. The gateway reads no field by name: a body is typed once,
    /// as its route's handler takes it (`api/mod.rs`).
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&Json> {
        let at = self.field(name)?;
        let made = self.made.get_or_init(|| {
            self.fields()
                .map(|(_, value)| (value, OnceLock::new()))
                .collect()
        });
        let (_, value) = made.iter().find(|(node, _)| *node == at)?;
        Some(value.get_or_init(|| self.json_at(at)))
    }

    // The field reads the handlers used before their bodies were typed (`requests/`): kept,
    // for tests only, as the reference the typed reads are compared against
    // (`body/typed/tests.rs`), message for message.
    #[cfg(test)]
    pub fn required(&self, name: &str) -> Result<&Json, ApiError> {
        self.get(name)
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} is missing")))
    }

    #[cfg(test)]
    pub fn string(&self, name: &str) -> Result<&str, ApiError> {
        self.required(name)?
            .as_str()
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} must be a string")))
    }

    #[cfg(test)]
    /// A value in the station's text format; numbers and booleans are taken as their text.
    pub fn value_text(&self, name: &str) -> Result<String, ApiError> {
        value_text(self.required(name)?, name)
    }

    #[cfg(test)]
    pub fn optional_u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        let Some(at) = self.field(name) else {
            return Ok(None);
        };
        let whole = |number: &serde_json::Number| {
            number.as_u64().or_else(|| {
                number
                    .as_f64()
                    .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 9e15)
                    .map(|f| f as u64)
            })
        };
        match &self.nodes[at] {
            Node::Number(number) => whole(number),
            _ => None,
        }
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "the field {name} must be a whole number of 0 or more"
            ))
        })
    }

    #[cfg(test)]
    /// A list of strings, made straight from the body.
    pub fn string_list(&self, name: &str) -> Result<Vec<String>, ApiError> {
        let wrong =
            || ApiError::bad_request(format!("the field {name} must be an array of strings"));
        let at = self
            .field(name)
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} is missing")))?;
        let Node::Array { end } = self.nodes[at] else {
            return Err(wrong());
        };
        // Strings are one node each: an array of nothing else holds one node an item.
        ((at + 1)..end)
            .map(|item| self.string_at(item).map(text_of).ok_or_else(wrong))
            .collect()
    }

    #[cfg(test)]
    pub fn object(&self, name: &str) -> Result<&Map<String, Json>, ApiError> {
        self.required(name)?
            .as_object()
            .ok_or_else(|| ApiError::bad_request(format!("the field {name} must be an object")))
    }

    /// Every field as `serde_json`'s map holds it: sorted by name, the last of a repeated
    /// name (for tests).
    #[cfg(test)]
    fn entries(&self) -> Vec<(String, Json)> {
        let mut entries: Vec<(String, Json)> = self
            .fields()
            .map(|(key, value)| {
                let name = self.string_at(key).map(text_of).unwrap_or_default();
                (name, self.json_at(value))
            })
            .collect();
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, kept| later.0 == kept.0);
        entries
    }
}

/// A string node's bytes as text: they came from a `&str` of the body, or from a `String`
/// (so the lossy form is never taken).
fn text_of(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `value` as nodes, after those in `nodes`.
fn push_json(nodes: &mut Vec<Node>, value: Json) {
    match value {
        Json::Null => nodes.push(Node::Null),
        Json::Bool(value) => nodes.push(Node::Bool(value)),
        Json::Number(number) => nodes.push(Node::Number(number)),
        Json::String(text) => nodes.push(Node::Unescaped(text)),
        Json::Array(items) => {
            let at = nodes.len();
            nodes.push(Node::Array { end: 0 });
            for item in items {
                push_json(nodes, item);
            }
            nodes[at] = Node::Array { end: nodes.len() };
        }
        Json::Object(object) => {
            let at = nodes.len();
            nodes.push(Node::Object { end: 0 });
            for (name, value) in object {
                nodes.push(Node::Unescaped(name));
                push_json(nodes, value);
            }
            nodes[at] = Node::Object { end: nodes.len() };
        }
    }
}

fn not_json(error: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("the request body is not valid JSON: {error}"))
}

/// Where a value's nodes go.
struct IntoNodes<'a> {
    nodes: &'a mut Vec<Node>,
    /// Where the body starts in memory: a borrowed string's span is taken from its address.
    base: usize,
    /// The body's length.
    len: usize,
}

impl IntoNodes<'_> {
    /// The span of `text` in the body; `None` if it is not the body's (it always is: the body
    /// is parsed from its slice).
    fn span(&self, text: &str) -> Option<Range<usize>> {
        let start = (text.as_ptr() as usize).checked_sub(self.base)?;
        Some(start..start + text.len()).filter(|span| span.end <= self.len)
    }

    fn reborrow(&mut self) -> IntoNodes<'_> {
        IntoNodes {
            nodes: self.nodes,
            base: self.base,
            len: self.len,
        }
    }
}

/// A body's top level: an object into nodes (`true`), or any other JSON value skipped
/// (`false`), as the body's parse skipped it before (it is refused anyway).
struct TopLevel<'a>(IntoNodes<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for TopLevel<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TopLevel<'_> {
    type Value = bool;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        self.0.visit_map(map).map(|()| true)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
}

/// One value into nodes, parsed as `serde_json::Value` parses it (`deserialize_any`).
impl<'de> serde::de::DeserializeSeed<'de> for IntoNodes<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for IntoNodes<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("any valid JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let at = self.nodes.len();
        self.nodes.push(Node::Object { end: 0 });
        while map.next_key_seed(self.reborrow())?.is_some() {
            map.next_value_seed(self.reborrow())?;
        }
        let end = self.nodes.len();
        self.nodes[at] = Node::Object { end };
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let at = self.nodes.len();
        self.nodes.push(Node::Array { end: 0 });
        while seq.next_element_seed(self.reborrow())?.is_some() {}
        let end = self.nodes.len();
        self.nodes[at] = Node::Array { end };
        Ok(())
    }

    fn visit_bool<E>(self, value: bool) -> Result<(), E> {
        self.nodes.push(Node::Bool(value));
        Ok(())
    }

    fn visit_i64<E>(self, value: i64) -> Result<(), E> {
        self.nodes.push(Node::Number(value.into()));
        Ok(())
    }

    fn visit_u64<E>(self, value: u64) -> Result<(), E> {
        self.nodes.push(Node::Number(value.into()));
        Ok(())
    }

    fn visit_f64<E>(self, value: f64) -> Result<(), E> {
        // What `serde_json::Value` makes of a float: a number, or `null` for one it cannot
        // hold (none comes from parsing JSON text).
        self.nodes
            .push(serde_json::Number::from_f64(value).map_or(Node::Null, Node::Number));
        Ok(())
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<(), E> {
        let node = self
            .span(text)
            .map_or_else(|| Node::Unescaped(text.to_owned()), Node::Text);
        self.nodes.push(node);
        Ok(())
    }

    fn visit_str<E>(self, text: &str) -> Result<(), E> {
        self.nodes.push(Node::Unescaped(text.to_owned()));
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.nodes.push(Node::Null);
        Ok(())
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
            assert_eq!(body.entries(), from_map.entries());
            for name in ["name", "NAME", "b", "B", "names", "z", "missing"] {
                assert_eq!(body.get(name), from_map.get(name), "{name} in {bytes:?}");
            }
        }
    }

    /// Random objects, some of them broken, read through `JsonBody` and through a
    /// `serde_json::Value` parse (what `JsonBody` kept before it kept spans): the same bodies
    /// refused with the same message, the same fields, lists and numbers read.
    #[test]
    fn bodies_read_as_a_value_parse_reads_them() {
        const LEAVES: [&str; 22] = [
            "null",
            "true",
            "0",
            "-0",
            "600000",
            "1.5",
            "-1",
            "1e400",
            "18446744073709551616",
            r#""x""#,
            r#""""#,
            r#""\ud800""#,
            r#""\ud83d\ude00""#,
            r#""b\"c""#,
            "\"\u{e9}\"",
            "\"\\u0041\"",
            "[]",
            "{}",
            r#"["a", "b"]"#,
            r#"["a", 1]"#,
            r#"[null]"#,
            "\"\t\"",
        ];
        const NAMES: [&str; 9] = [
            r#""Names""#,
            r#""names""#,
            r#""NAMES""#,
            r#""MaxAgeMs""#,
            r#""maxagems""#,
            r#""Na\u006des""#,
            r#""""#,
            r#""\ud800""#,
            r#""x y""#,
        ];
        const LOOKED_UP: [&str; 6] = ["Names", "names", "MaxAgeMs", "", "x y", "missing"];
        // xorshift64*: the same bodies every run.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |below: usize| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % below
        };
        let mut refused = 0;
        for _ in 0..20_000 {
            let mut text = String::from(" {");
            for at in 0..next(5) {
                if at > 0 {
                    text.push(',');
                }
                text.push_str(NAMES[next(NAMES.len())]);
                text.push_str(if next(2) == 0 { ":" } else { " : " });
                let leaf = LEAVES[next(LEAVES.len())];
                if next(8) == 0 {
                    text.push_str(&format!("[{leaf}, {{\"n\": {leaf}}}]"));
                } else {
                    text.push_str(leaf);
                }
            }
            text.push_str("} ");
            let mut bytes = text.into_bytes();
            match next(10) {
                0 => bytes.truncate(next(bytes.len())),
                1 => bytes.insert(next(bytes.len()), b",:{}[]\"\\\xff"[next(9)]),
                _ => {}
            }
            let body = JsonBody::parse(&bytes);
            if bytes.iter().all(u8::is_ascii_whitespace) {
                // Nothing sent: no fields (a GET's body, or a POST's without one).
                assert!(body.unwrap().entries().is_empty());
                continue;
            }
            if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
                // Not an object at all (a character put before it): refused, as before, by
                // the same skipping parse of a body that is not an object.
                assert!(body.is_err(), "{bytes:?}");
                continue;
            }
            let map = match serde_json::from_slice::<Json>(&bytes) {
                Ok(Json::Object(map)) => map,
                Ok(_) => panic!("an object's top level: {bytes:?}"),
                Err(error) => {
                    refused += 1;
                    let message = match body {
                        Err(refusal) => refusal.message,
                        Ok(_) => panic!("taken: {:?} ({error})", String::from_utf8_lossy(&bytes)),
                    };
                    assert_eq!(message, not_json(error).message, "{bytes:?}");
                    continue;
                }
            };
            let body = body.unwrap_or_else(|error| panic!("{bytes:?}: {}", error.message));
            let before = JsonBody::from_object(map);
            for name in LOOKED_UP {
                let case = format!("{name} in {:?}", String::from_utf8_lossy(&bytes));
                // Lists and numbers first: they are read from the body's text when no one
                // read the field before.
                let lists = (body.string_list(name), before.string_list(name));
                assert_eq!(
                    lists.0.map_err(|error| error.message),
                    lists.1.map_err(|error| error.message),
                    "{case}"
                );
                let numbers = (body.optional_u64(name), before.optional_u64(name));
                assert_eq!(
                    numbers.0.map_err(|error| error.message),
                    numbers.1.map_err(|error| error.message),
                    "{case}"
                );
                assert_eq!(body.get(name), before.get(name), "{case}");
                assert_eq!(
                    body.string_list(name).map_err(|error| error.message),
                    before.string_list(name).map_err(|error| error.message),
                    "{case}, once parsed"
                );
            }
            assert_eq!(body.entries(), before.entries());
        }
        // Both kinds came up often enough to mean something.
        assert!((2_000..18_000).contains(&refused), "{refused} refused");
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
