//! Every JSON request body as a type, one per endpoint body, named after the clients' models
//! (`WebApiClient/Models/*.cs`; where the models and `contract.md` disagree, the clients win),
//! and each turned here into what the core runs: a change's items, a read's names and
//! freshness, a subscription, a lease's owner and time to live, a bus transaction, what a
//! channel's configuration should become. The value checks (the channel's type and limits, a
//! TTL's range, a deadband's shape, a bus's bytes and enums) and the alias resolution (through
//! [`ChannelTable::get`](crate::link::ChannelTable::get)) live in these conversions, so every
//! front end that needs them takes them from here.
//!
//! A body is typed once, by the request entry right after it is read (the route table's row
//! names its handler's request type, `api/mod.rs`), and its [`RequestBody`] tells what the
//! request asks before its handler runs: the audit line's `asked=` and whether a read asks for
//! cached values. It is read into its type by
//! [`JsonBody::typed`](crate::body::JsonBody::typed): fields
//! in any letter case, `null` as absent, unknown fields ignored (as the vendor's ASP.NET model
//! binder ignores them; `ChannelConfigRequest` alone refuses them, as it always did), and the
//! messages clients got from the field-by-field reads before.
//! A field whose check must wait for something the body does not say (a channel looked up
//! first) is a [`Deferred`](crate::body::Deferred), checked in the order the conversion asks.

pub mod access;
pub mod channel_config;
pub mod channels;
pub mod comm;
pub mod config_files;
pub mod events;
pub mod lease;
pub mod numeric;
pub mod resources;
pub mod safe_stop;

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Visitor};

use crate::error::ApiError;

/// What a typed request body tells the request entry before its handler runs.
pub trait RequestBody {
    /// What a change asked for, for its audit line's `asked=` (`VSET1=100`, `file=bench3.cfg`,
    /// `device=…I2C09,action=Send,address=50,data=6401`): never a lease id or credential (those
    /// never travel in these bodies). `None`: nothing its body says.
    fn asked(&self) -> Option<String> {
        None
    }

    /// Whether a read asks for cached values (a `MaxAgeMs` above 0), which a non-holder may
    /// read while the lease is held (`LeaseNeed::ByMaxAge`).
    fn cached(&self) -> bool {
        false
    }
}

/// The request of an endpoint whose body is not JSON or not read (a GET, a DELETE, an upload,
/// a reset): any JSON object sent is accepted and ignored.
#[derive(Debug, Deserialize)]
pub struct NoBody {}

impl RequestBody for NoBody {}

/// The longest `asked=` field; longer ones end in `...`.
const MOST_ASKED_CHARS: usize = 400;

/// A change's `asked=` from its parts (`key=value` each), joined by commas and cut at
/// [`MOST_ASKED_CHARS`]; `None` for none.
pub fn asked_text(parts: &[String]) -> Option<String> {
    if parts.is_empty() {
        return None;
    }
    let mut joined = parts.join(",");
    if joined.chars().count() > MOST_ASKED_CHARS {
        joined = joined.chars().take(MOST_ASKED_CHARS).collect::<String>() + "...";
    }
    Some(joined)
}

/// Refuses (400 naming `field`) text that holds a control character (NUL, ESC, DEL, the C1
/// range, or a bidirectional override): an owner's or a reason's text is shown back in answers
/// and refusals, on the status page, in the log and the audit trail, where such a character
/// hides or rewrites what is shown.
pub fn refuse_control_characters(field: &str, text: &str) -> Result<(), ApiError> {
    let Some((at, bad)) = text
        .chars()
        .enumerate()
        .find(|(_, c)| c.is_control() || is_bidi_control(*c))
    else {
        return Ok(());
    };
    Err(ApiError::bad_request(format!(
        "the field {field} holds the control character U+{:04X} (character {}): it is shown back in answers, logs and the audit trail, so it must be printable text",
        u32::from(bad),
        at + 1
    )))
}

/// The Unicode characters that reorder text as it is shown (embeddings, overrides, isolates).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// A station value as the clients send it: text as it is, a number as its JSON text, a
/// boolean as `True` or `False` (the station's text format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueText(pub String);

impl<'de> Deserialize<'de> for ValueText {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = ValueText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string such as \"5\" or \"True\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ValueText, E> {
                Ok(ValueText(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<ValueText, E> {
                Ok(ValueText(text))
            }

            fn visit_bool<E: de::Error>(self, value: bool) -> Result<ValueText, E> {
                Ok(ValueText(if value { "True" } else { "False" }.to_owned()))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<ValueText, E> {
                Ok(ValueText(serde_json::Number::from(value).to_string()))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<ValueText, E> {
                Ok(ValueText(serde_json::Number::from(value).to_string()))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<ValueText, E> {
                serde_json::Number::from_f64(value)
                    .map(|number| ValueText(number.to_string()))
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Float(value), &self))
            }
        }
        deserializer.deserialize_any(Text)
    }
}

/// `true` or `false`, nothing else (`the field X must be true or false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FlagVisitor;
        impl Visitor<'_> for FlagVisitor {
            type Value = Flag;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true or false")
            }

            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Flag, E> {
                Ok(Flag(value))
            }
        }
        deserializer.deserialize_bool(FlagVisitor)
    }
}

/// A whole number that may be negative (to be refused with the range it is checked against):
/// an integer, or a float with no fraction below 9e15 in size (`the field X must be a whole
/// number`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Integer(pub i64);

impl<'de> Deserialize<'de> for Integer {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IntegerVisitor;
        impl Visitor<'_> for IntegerVisitor {
            type Value = Integer;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number")
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Integer, E> {
                Ok(Integer(value))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Integer, E> {
                i64::try_from(value)
                    .ok()
                    .or_else(|| integer_of_float(value as f64))
                    .map(Integer)
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Unsigned(value), &self))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Integer, E> {
                integer_of_float(value)
                    .map(Integer)
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Float(value), &self))
            }
        }
        deserializer.deserialize_i64(IntegerVisitor)
    }
}

/// A float as a whole number, when it is one below 9e15 in size.
fn integer_of_float(value: f64) -> Option<i64> {
    (value.fract() == 0.0 && value.abs() < 9e15).then_some(value as i64)
}

/// A finite number (`the field X must be a number`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finite(pub f64);

impl<'de> Deserialize<'de> for Finite {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FiniteVisitor;
        impl Visitor<'_> for FiniteVisitor {
            type Value = Finite;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Finite, E> {
                Ok(Finite(value as f64))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Finite, E> {
                Ok(Finite(value as f64))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Finite, E> {
                Some(value)
                    .filter(|x| x.is_finite())
                    .map(Finite)
                    .ok_or_else(|| E::invalid_type(de::Unexpected::Float(value), &self))
            }
        }
        deserializer.deserialize_f64(FiniteVisitor)
    }
}

#[cfg(test)]
mod tests;
