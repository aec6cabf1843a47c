//! Typed bodies: a `#[derive(Deserialize)]` request read from a [`JsonBody`] already parsed
//! (no second parse of the body), its fields bound as `JsonBody::get` binds them, and its
//! errors in the words clients got from the field-by-field reads before.
//!
//! - **Names** in any letter case: each declared field is looked up in the object as
//!   `JsonBody::get` looks a name up (the last of a repeated name; of a name's spellings in
//!   letter case the first in byte order), nested structs alike. Declare the clients' names
//!   (`#[serde(rename_all = "PascalCase")]`).
//! - **`null` is absent**, as in every read before: a required field sent as `null` is
//!   missing, an `Option` one `None`.
//! - **Unknown fields are ignored**, as the vendor's ASP.NET model binder ignores them: only
//!   the declared ones are ever looked at.
//! - **Errors name the field** by its path from the body (`ChannelOptions.ch1.Deadband`):
//!   a missing field `the field X is missing`, a wrong type `the field X must be <what the
//!   type expects>` (a `String`'s "a string", a [`StringList`]'s "an array of strings"), a
//!   field type's own words where it has them ([`said`]).
//! - **The order of the checks** is the declared order; a field whose check must come after
//!   something the body does not say (a channel looked up) is a [`Deferred`], checked when
//!   its conversion asks.
//! - **A field as sent** beside its type, for what a change's audit line says was asked, is a
//!   [`Sent`].

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

use super::{JsonBody, Node};
use crate::error::ApiError;

impl JsonBody {
    /// The body as `T`, its fields bound as this module's doc says (any letter case, `null` as
    /// absent, unknown fields ignored, errors naming the field).
    pub fn typed<'de, T: Deserialize<'de>>(&'de self) -> Result<T, ApiError> {
        T::deserialize(NodeDeserializer {
            body: self,
            at: 0,
            path: Path::Root,
        })
        .map_err(ApiError::from)
    }
}

/// Where in the body a value is: the top level, or a field (or an entry) of an object.
#[derive(Clone, Copy)]
enum Path<'p> {
    Root,
    Field(&'p Path<'p>, &'p str),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Field(Path::Root, name) => f.write_str(name),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
        }
    }
}

/// Why a typed body was refused: 400 with [`BodyError::message`](fmt::Display).
#[derive(Debug)]
pub struct BodyError {
    what: Wrong,
    /// The message, once the error knows where in the body it is (the innermost value it
    /// passed through); `None` until then.
    placed: Option<String>,
}

#[derive(Debug)]
enum Wrong {
    /// A required field absent (or `null`), named as declared.
    Missing(&'static str),
    /// Not of the field's type: what the type expects ("a string").
    Expected(String),
    /// A field type's own words, the field's path between them ([`said`]).
    Said { before: String, after: String },
    /// A message as it is.
    Custom(String),
}

/// Marks a [`said`] message: the path goes at the first `SAID_PATH` after it.
const SAID: char = '\u{1}';
const SAID_PATH: char = '\u{2}';

/// A field type's own error, for a `Deserialize` that cannot name its field: `before`, the
/// field's path, then `after` (`said("", " must be a whole number, not \"x\"")` is
/// `MaxRetries must be a whole number, not "x"`). `before` is the gateway's text, never the
/// client's.
pub fn said<E: de::Error>(before: &str, after: impl fmt::Display) -> E {
    E::custom(format_args!("{SAID}{before}{SAID_PATH}{after}"))
}

impl BodyError {
    fn message_at(&self, path: Path<'_>) -> String {
        match &self.what {
            Wrong::Missing(field) => match path {
                Path::Root => format!("the field {field} is missing"),
                path => format!("the field {path}.{field} is missing"),
            },
            Wrong::Expected(expected) => format!("the field {path} must be {expected}"),
            Wrong::Said { before, after } => format!("{before}{path}{after}"),
            Wrong::Custom(message) => message.clone(),
        }
    }

    /// Placed at `path`, unless it was already placed deeper in.
    fn at(mut self, path: Path<'_>) -> BodyError {
        if self.placed.is_none() {
            self.placed = Some(self.message_at(path));
        }
        self
    }

    fn expected(what: &str) -> BodyError {
        BodyError {
            what: Wrong::Expected(what.to_owned()),
            placed: None,
        }
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.placed {
            Some(message) => f.write_str(message),
            None => f.write_str(&self.message_at(Path::Root)),
        }
    }
}

impl std::error::Error for BodyError {}

impl de::Error for BodyError {
    fn custom<T: fmt::Display>(message: T) -> BodyError {
        let message = message.to_string();
        let what = match message
            .strip_prefix(SAID)
            .and_then(|said| said.split_once(SAID_PATH))
        {
            Some((before, after)) => Wrong::Said {
                before: before.to_owned(),
                after: after.to_owned(),
            },
            None => Wrong::Custom(message),
        };
        BodyError { what, placed: None }
    }

    fn invalid_type(_: de::Unexpected<'_>, expected: &dyn de::Expected) -> BodyError {
        BodyError::expected(&expected.to_string())
    }

    fn invalid_value(_: de::Unexpected<'_>, expected: &dyn de::Expected) -> BodyError {
        BodyError::expected(&expected.to_string())
    }

    fn missing_field(field: &'static str) -> BodyError {
        BodyError {
            what: Wrong::Missing(field),
            placed: None,
        }
    }
}

impl From<BodyError> for ApiError {
    fn from(error: BodyError) -> ApiError {
        ApiError::bad_request(error.to_string())
    }
}

/// One node of the body (and what it holds) as a serde `Deserializer`.
struct NodeDeserializer<'de, 'p> {
    body: &'de JsonBody,
    at: usize,
    path: Path<'p>,
}

impl<'de> NodeDeserializer<'de, '_> {
    fn node(&self) -> Option<&'de Node> {
        self.body.nodes.get(self.at)
    }

    /// The object's entries, or (the top level of an empty body) none.
    fn is_object(&self) -> bool {
        matches!(self.node(), Some(Node::Object { .. }) | None)
    }
}

impl<'de> de::Deserializer<'de> for NodeDeserializer<'de, '_> {
    type Error = BodyError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, BodyError> {
        let (body, at, path) = (self.body, self.at, self.path);
        let visited = match self.node() {
            // An empty body is an empty object.
            None => visitor.visit_map(Entries {
                body,
                next: at,
                end: at,
                path,
                value: at,
            }),
            Some(Node::Null) => visitor.visit_unit(),
            Some(Node::Bool(value)) => visitor.visit_bool(*value),
            Some(Node::Number(number)) => {
                if let Some(value) = number.as_u64() {
                    visitor.visit_u64(value)
                } else if let Some(value) = number.as_i64() {
                    visitor.visit_i64(value)
                } else {
                    visitor.visit_f64(number.as_f64().unwrap_or(f64::NAN))
                }
            }
            Some(Node::Text(span)) => match std::str::from_utf8(&body.text[span.clone()]) {
                Ok(text) => visitor.visit_borrowed_str(text),
                Err(_) => visitor.visit_string(super::text_of(&body.text[span.clone()])),
            },
            Some(Node::Unescaped(text)) => visitor.visit_borrowed_str(text),
            Some(Node::Array { end }) => visitor.visit_seq(Items {
                body,
                next: at + 1,
                end: *end,
                path,
            }),
            Some(Node::Object { end }) => visitor.visit_map(Entries {
                body,
                next: at + 1,
                end: *end,
                path,
                value: at,
            }),
        };
        visited.map_err(|error| error.at(path))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, BodyError> {
        let path = self.path;
        match self.node() {
            Some(Node::Null) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
        .map_err(|error| error.at(path))
    }

    /// A [`Sent`] is given its node's text, then the node.
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, BodyError> {
        let path = self.path;
        if name == SENT {
            let text = self.node().map(|_| sent_text(self.body.json_at(self.at)));
            return visitor
                .visit_seq(SentParts {
                    text,
                    node: Some(self),
                })
                .map_err(|error| error.at(path));
        }
        visitor
            .visit_newtype_struct(self)
            .map_err(|error| error.at(path))
    }

    /// Each declared field looked up in any letter case, `null` as absent, the rest ignored.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, BodyError> {
        let path = self.path;
        if !self.is_object() {
            return Err(BodyError::expected("an object").at(path));
        }
        visitor
            .visit_map(DeclaredFields {
                body: self.body,
                object: self.at,
                fields,
                path,
                value: None,
            })
            .map_err(|error| error.at(path))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, BodyError> {
        if !self.is_object() {
            return Err(BodyError::expected("an object").at(self.path));
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, BodyError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct enum identifier
    }
}

/// An array's items, each at the array's path.
struct Items<'de, 'p> {
    body: &'de JsonBody,
    next: usize,
    end: usize,
    path: Path<'p>,
}

impl<'de> SeqAccess<'de> for Items<'de, '_> {
    type Error = BodyError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, BodyError> {
        if self.next >= self.end {
            return Ok(None);
        }
        let at = self.next;
        self.next = self.body.after(at);
        seed.deserialize(NodeDeserializer {
            body: self.body,
            at,
            path: self.path,
        })
        .map(Some)
    }
}

/// Every entry of an object as sent, each value at its name's path (for a map: `Resources`).
struct Entries<'de, 'p> {
    body: &'de JsonBody,
    /// The next name's node.
    next: usize,
    end: usize,
    path: Path<'p>,
    /// The value's node of the name last given.
    value: usize,
}

impl<'de> MapAccess<'de> for Entries<'de, '_> {
    type Error = BodyError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, BodyError> {
        if self.next >= self.end {
            return Ok(None);
        }
        let key = self.next;
        self.value = key + 1;
        self.next = self.body.after(key + 1);
        seed.deserialize(NodeDeserializer {
            body: self.body,
            at: key,
            path: self.path,
        })
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, BodyError> {
        let name = self.body.string_at(self.value - 1).unwrap_or_default();
        let name = String::from_utf8_lossy(name);
        let path = Path::Field(&self.path, &name);
        // Placed here too: a value's type may refuse it after its deserializer returned.
        seed.deserialize(NodeDeserializer {
            body: self.body,
            at: self.value,
            path,
        })
        .map_err(|error| error.at(path))
    }
}

/// A struct's declared fields, each looked up in the object as `JsonBody::get` looks it up;
/// absent or `null` ones are not given (serde's derive makes them missing, or `None`).
struct DeclaredFields<'de, 'p> {
    body: &'de JsonBody,
    object: usize,
    /// The declared fields not yet looked up.
    fields: &'static [&'static str],
    path: Path<'p>,
    /// The field last given and its value's node.
    value: Option<(&'static str, usize)>,
}

impl<'de> MapAccess<'de> for DeclaredFields<'de, '_> {
    type Error = BodyError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, BodyError> {
        while let Some((&field, rest)) = self.fields.split_first() {
            self.fields = rest;
            if let Some(at) = self.body.field_in(self.object, field) {
                self.value = Some((field, at));
                let name = de::value::BorrowedStrDeserializer::<BodyError>::new(field);
                return seed.deserialize(name).map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, BodyError> {
        let Some((field, at)) = self.value.take() else {
            return Err(de::Error::custom("a value asked for before its field"));
        };
        let path = Path::Field(&self.path, field);
        seed.deserialize(NodeDeserializer {
            body: self.body,
            at,
            path,
        })
        .map_err(|error| error.at(path))
    }
}

/// A field checked when its conversion asks ([`Deferred::checked`]), not when the body is
/// read: for a check that comes after one the body does not decide (a channel looked up
/// first), so that a request wrong in both ways is answered as it was before. Absent, it is
/// missing then (`Deferred<Option<T>>` for an optional field).
#[derive(Debug)]
pub struct Deferred<T>(Result<T, String>);

impl<T> Deferred<T> {
    /// The field, or its 400.
    pub fn checked(self) -> Result<T, ApiError> {
        self.0.map_err(ApiError::bad_request)
    }

    /// [`Deferred::checked`] without taking the field.
    pub fn check(&self) -> Result<&T, ApiError> {
        self.0
            .as_ref()
            .map_err(|message| ApiError::bad_request(message.clone()))
    }

    /// The field, if it is of its type (its 400 kept for [`Deferred::checked`]).
    pub fn value(&self) -> Option<&T> {
        self.0.as_ref().ok()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Deferred<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // The error is placed (named) by the field's own deserializer before it comes here.
        Ok(Deferred(
            T::deserialize(deserializer).map_err(|error| error.to_string()),
        ))
    }
}

/// A field as typed (`value`) and as the client sent it (`text`: a string as it is, anything
/// else as its JSON), for what a change's audit line says was asked whatever the type makes of
/// it: `"0x50"` stays `0x50` and `5.0` stays `5.0`, and a value a [`Deferred`] refuses is still
/// shown. Absent (or `null`), `value` is `T`'s absence (`None` for an `Option`, a `Deferred`'s
/// "missing") and `text` is `None`; any other error of `T` is the body's.
#[derive(Debug)]
pub struct Sent<T> {
    pub value: T,
    pub text: Option<String>,
}

/// The name [`NodeDeserializer`] knows a [`Sent`] by.
const SENT: &str = "$station_http::body::Sent";

/// A value's text as a [`Sent`] keeps it.
fn sent_text(value: serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text,
        other => other.to_string(),
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Sent<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let reached = Cell::new(false);
        let visitor = SentVisitor {
            reached: &reached,
            value: PhantomData,
        };
        match deserializer.deserialize_newtype_struct(SENT, visitor) {
            // Never reached: the field is absent (serde's stand-in for a missing field refuses
            // everything but an `Option`); `T` says what it is then.
            Err(error) if !reached.get() => Ok(Sent {
                value: T::deserialize(Absent(error))?,
                text: None,
            }),
            sent => sent,
        }
    }
}

struct SentVisitor<'r, T> {
    reached: &'r Cell<bool>,
    value: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for SentVisitor<'_, T> {
    type Value = Sent<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }

    /// From [`NodeDeserializer`]: the text, then the value.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Sent<T>, A::Error> {
        self.reached.set(true);
        let text: Option<String> = seq.next_element()?;
        let value = seq
            .next_element()?
            .ok_or_else(|| de::Error::custom("a sent value without its value"))?;
        Ok(Sent { value, text })
    }

    /// From another deserializer: the value alone.
    fn visit_newtype_struct<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Sent<T>, D::Error> {
        self.reached.set(true);
        Ok(Sent {
            value: T::deserialize(deserializer)?,
            text: None,
        })
    }
}

/// A [`Sent`]'s text, then its node.
struct SentParts<'de, 'p> {
    text: Option<String>,
    node: Option<NodeDeserializer<'de, 'p>>,
}

impl<'de> SeqAccess<'de> for SentParts<'de, '_> {
    type Error = BodyError;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, BodyError> {
        if let Some(text) = self.text.take() {
            return seed
                .deserialize(de::value::StringDeserializer::<BodyError>::new(text))
                .map(Some);
        }
        match self.node.take() {
            Some(node) => seed.deserialize(node).map(Some),
            None => Ok(None),
        }
    }
}

/// An absent field, as serde's stand-in for one says it: `None` for an `Option`, its error
/// (`the field X is missing`) for anything else.
struct Absent<E>(E);

impl<'de, E: de::Error> de::Deserializer<'de> for Absent<E> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, E> {
        Err(self.0)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_none()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

/// A list of strings: `the field X must be an array of strings` for anything else, an item
/// of another type included.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StringList(pub Vec<String>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Strings;
        impl<'de> Visitor<'de> for Strings {
            type Value = StringList;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of strings")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StringList, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(4));
                loop {
                    match seq.next_element::<String>() {
                        Ok(Some(item)) => items.push(item),
                        Ok(None) => return Ok(StringList(items)),
                        Err(_) => return Err(de::Error::invalid_type(de::Unexpected::Seq, &self)),
                    }
                }
            }
        }
        deserializer.deserialize_seq(Strings)
    }
}

/// A whole number of 0 or more, as `optional_u64` took it: an integer, or a float with no
/// fraction below 9e15 (`5.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole(pub u64);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct WholeVisitor;
        impl Visitor<'_> for WholeVisitor {
            type Value = Whole;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of 0 or more")
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Whole, E> {
                Ok(Whole(value))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Whole, E> {
                whole_of_float(value)
                    .map(Whole)
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Float(value), &self))
            }
        }
        deserializer.deserialize_u64(WholeVisitor)
    }
}

/// A float as a whole number of 0 or more, when it is one below 9e15.
pub(crate) fn whole_of_float(value: f64) -> Option<u64> {
    (value >= 0.0 && value.fract() == 0.0 && value < 9e15).then_some(value as u64)
}

#[cfg(test)]
mod tests;
