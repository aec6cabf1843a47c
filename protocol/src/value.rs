//! Typed values as the wire carries them (their payload encoding too), and their rendering in the
//! station's value format.
//!
//! The REST contract moves every value as a string: `"5"`, `"4.998"`, `"True"`, `"Red"`.
//! [`Value::render`] makes that string; [`Value::parse_as`] reads one back for a channel of a
//! known [`ValueType`].

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::wire::{PayloadError, Reader, Writer};

/// The type of a channel's value, as LIST describes it and values are tagged on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ValueType {
    Float = 1,
    Integer = 2,
    Bool = 3,
    Enum = 4,
    String = 5,
    Bytes = 6,
}

impl ValueType {
    pub fn from_u8(tag: u8) -> Option<ValueType> {
        Some(match tag {
            1 => ValueType::Float,
            2 => ValueType::Integer,
            3 => ValueType::Bool,
            4 => ValueType::Enum,
            5 => ValueType::String,
            6 => ValueType::Bytes,
            _ => return None,
        })
    }

    /// The lower-case name used in profiles and messages.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::Float => "float",
            ValueType::Integer => "integer",
            ValueType::Bool => "bool",
            ValueType::Enum => "enum",
            ValueType::String => "string",
            ValueType::Bytes => "bytes",
        }
    }

    pub fn from_name(name: &str) -> Option<ValueType> {
        Some(match name {
            "float" => ValueType::Float,
            "integer" => ValueType::Integer,
            "bool" => ValueType::Bool,
            "enum" => ValueType::Enum,
            "string" => ValueType::String,
            "bytes" => ValueType::Bytes,
            _ => return None,
        })
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One value of a channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Float(f64),
    Integer(i64),
    Bool(bool),
    /// The name of one of the channel's enum options, e.g. `Red`.
    Enum(String),
    String(String),
    Bytes(Bytes),
}

/// Why a string is not a value of the wanted type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("{text:?} is not a {wanted} value")]
    Malformed { text: String, wanted: ValueType },
    #[error("{text:?} is not one of {options}")]
    NotAnOption { text: String, options: String },
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::Float(_) => ValueType::Float,
            Value::Integer(_) => ValueType::Integer,
            Value::Bool(_) => ValueType::Bool,
            Value::Enum(_) => ValueType::Enum,
            Value::String(_) => ValueType::String,
            Value::Bytes(_) => ValueType::Bytes,
        }
    }

    /// The value in the station's REST value format.
    ///
    /// Floats use the shortest text that reads back to the same number, without an exponent
    /// for ordinary magnitudes and without a trailing `.0` (`500`, `4.998`, `-0.5`); booleans
    /// are `True`/`False`; enums their option name; bytes upper-case hex (`DEADBEEF`), as the
    /// reference client's bus calls send them.
    pub fn render(&self) -> String {
        match self {
            Value::Float(x) => render_float(*x),
            Value::Integer(i) => i.to_string(),
            Value::Bool(true) => "True".to_owned(),
            Value::Bool(false) => "False".to_owned(),
            Value::Enum(s) | Value::String(s) => s.clone(),
            Value::Bytes(b) => {
                let mut out = String::with_capacity(b.len() * 2);
                for byte in b.iter() {
                    out.push_str(&format!("{byte:02X}"));
                }
                out
            }
        }
    }

    /// Reads `text` as a value of type `wanted`. Enum names are matched case-insensitively
    /// against `options` and returned in their canonical spelling; an empty `options` accepts
    /// any name.
    pub fn parse_as(
        wanted: ValueType,
        text: &str,
        options: &[String],
    ) -> Result<Value, ValueError> {
        let malformed = || ValueError::Malformed {
            text: text.to_owned(),
            wanted,
        };
        let trimmed = text.trim();
        match wanted {
            ValueType::Float => {
                let x: f64 = trimmed.parse().map_err(|_| malformed())?;
                if x.is_finite() {
                    Ok(Value::Float(x))
                } else {
                    Err(malformed())
                }
            }
            ValueType::Integer => trimmed.parse().map(Value::Integer).map_err(|_| malformed()),
            ValueType::Bool => match trimmed.to_ascii_lowercase().as_str() {
                "true" | "1" | "on" => Ok(Value::Bool(true)),
                "false" | "0" | "off" => Ok(Value::Bool(false)),
                _ => Err(malformed()),
            },
            ValueType::Enum => {
                if options.is_empty() {
                    return Ok(Value::Enum(trimmed.to_owned()));
                }
                options
                    .iter()
                    .find(|option| option.eq_ignore_ascii_case(trimmed))
                    .map(|option| Value::Enum(option.clone()))
                    .ok_or_else(|| ValueError::NotAnOption {
                        text: text.to_owned(),
                        options: options.join(", "),
                    })
            }
            ValueType::String => Ok(Value::String(unescape(text))),
            ValueType::Bytes => parse_hex(trimmed)
                .map(|b| Value::Bytes(b.into()))
                .ok_or_else(malformed),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

fn render_float(x: f64) -> String {
    if x == 0.0 {
        return "0".to_owned(); // also turns -0 into 0
    }
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 {
        return (x as i64).to_string();
    }
    // `zmij` writes the shortest digits that read back as `x`, as `Display` does, without
    // `core::fmt` (a cached read's answer renders one value each). Up to 15 significant
    // digits that shortest text is the only one (a double carries almost 16), so the two
    // agree; past that they may round an exact tie differently. Longer texts, exponents
    // (`1e-7`, which `Display` writes out) and `1e15.0`-like whole numbers go to `Display`.
    let mut buffer = zmij::Buffer::new();
    let text = buffer.format(x);
    let significant = text
        .bytes()
        .filter(u8::is_ascii_digit)
        .skip_while(|digit| *digit == b'0')
        .count();
    if !x.is_finite() || significant > 15 || text.contains('e') || text.ends_with(".0") {
        return format!("{x}");
    }
    text.to_owned()
}

/// Hex with optional spaces and `0x` prefixes: `DEADBEEF`, `de ad be ef`, `0xDE 0xAD`.
fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let digits: String = text
        .split_whitespace()
        .map(|part| {
            part.strip_prefix("0x")
                .or_else(|| part.strip_prefix("0X"))
                .unwrap_or(part)
        })
        .collect();
    if !digits.len().is_multiple_of(2) || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(digits.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Turns the two-character escapes `\n`, `\r`, `\t` and `\\` of a command line into bytes,
/// so `*IDN?\n` typed in a shell or sent from a script means what the user meant.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// A value as a payload carries it: its type tag, then the value.
pub(crate) fn put_value(out: &mut BytesMut, value: &Value) {
    out.put_u8(value.value_type() as u8);
    match value {
        Value::Float(x) => out.put_f64(*x),
        Value::Integer(i) => out.put_i64(*i),
        Value::Bool(b) => out.put_u8(u8::from(*b)),
        Value::Enum(s) | Value::String(s) => out.put_string(s),
        Value::Bytes(b) => out.put_blob(b),
    }
}

pub(crate) fn get_value(r: &mut Reader) -> Result<Value, PayloadError> {
    let tag = r.at("value type").u8()?;
    let kind = ValueType::from_u8(tag).ok_or(PayloadError::BadTag("value type", tag))?;
    r.at("value");
    Ok(match kind {
        ValueType::Float => Value::Float(r.f64()?),
        ValueType::Integer => Value::Integer(r.i64()?),
        ValueType::Bool => Value::Bool(r.bool()?),
        ValueType::Enum => Value::Enum(r.string()?),
        ValueType::String => Value::String(r.string()?),
        ValueType::Bytes => Value::Bytes(r.bytes()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_station_format() {
        assert_eq!(Value::Float(500.0).render(), "500");
        assert_eq!(Value::Float(4.998).render(), "4.998");
        assert_eq!(Value::Float(-0.5).render(), "-0.5");
        assert_eq!(Value::Float(-0.0).render(), "0");
        assert_eq!(Value::Integer(-7).render(), "-7");
        assert_eq!(Value::Bool(true).render(), "True");
        assert_eq!(Value::Bool(false).render(), "False");
        assert_eq!(Value::Enum("Red".into()).render(), "Red");
        assert_eq!(
            Value::Bytes(Bytes::from_static(&[0xDE, 0xAD, 0x01])).render(),
            "DEAD01"
        );
    }

    #[test]
    fn parses_by_type() {
        assert_eq!(
            Value::parse_as(ValueType::Float, " 500 ", &[]),
            Ok(Value::Float(500.0))
        );
        assert!(Value::parse_as(ValueType::Float, "NaN", &[]).is_err());
        assert!(Value::parse_as(ValueType::Float, "five", &[]).is_err());
        assert_eq!(
            Value::parse_as(ValueType::Bool, "True", &[]),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            Value::parse_as(ValueType::Bool, "false", &[]),
            Ok(Value::Bool(false))
        );
        assert!(Value::parse_as(ValueType::Bool, "maybe", &[]).is_err());
        let colours = vec!["Black".to_owned(), "Red".to_owned()];
        assert_eq!(
            Value::parse_as(ValueType::Enum, "red", &colours),
            Ok(Value::Enum("Red".into()))
        );
        assert!(matches!(
            Value::parse_as(ValueType::Enum, "Mauve", &colours),
            Err(ValueError::NotAnOption { .. })
        ));
        assert_eq!(
            Value::parse_as(ValueType::Bytes, "de ad 0x01", &[]),
            Ok(Value::Bytes(Bytes::from_static(&[0xDE, 0xAD, 0x01])))
        );
        assert!(Value::parse_as(ValueType::Bytes, "ABC", &[]).is_err());
        // `u8::from_str_radix` takes a sign; hex text must not.
        assert!(Value::parse_as(ValueType::Bytes, "+1+2", &[]).is_err());
        assert!(Value::parse_as(ValueType::Bytes, "DE é", &[]).is_err());
        assert_eq!(
            Value::parse_as(ValueType::String, "*IDN?\\n", &[]),
            Ok(Value::String("*IDN?\n".into()))
        );
    }

    #[test]
    fn float_rendering_reads_back() {
        for x in [3.3, 1.0 / 3.0, 1e-7, 123456.789, 2.5e20] {
            let text = Value::Float(x).render();
            assert_eq!(text.parse::<f64>().unwrap(), x, "{text}");
        }
    }

    /// The text `Display` writes (as rendering did before it took `zmij`'s digits).
    fn displayed(x: f64) -> String {
        if x == 0.0 {
            "0".to_owned()
        } else if x.fract() == 0.0 && x.abs() < 1e15 {
            format!("{}", x as i64)
        } else {
            format!("{x}")
        }
    }

    #[test]
    fn floats_render_as_display_writes_them() {
        let edges = [
            3.3,
            -3.3,
            0.1,
            1e-5,
            1.5e-5,
            1e-4,
            0.00012,
            1e-7,
            1e15,
            1.5e15,
            1e16,
            1e21,
            2.5e20,
            123456.789,
            1.0 / 3.0,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            f64::EPSILON,
            5e-324,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            999999999999999.9,
            0.30000000000000004,
        ];
        for x in edges {
            assert_eq!(Value::Float(x).render(), displayed(x), "{x:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn every_float_renders_as_display_writes_it(bits in proptest::prelude::any::<u64>()) {
            let x = f64::from_bits(bits);
            proptest::prop_assert_eq!(Value::Float(x).render(), displayed(x));
        }

        #[test]
        fn decimal_floats_render_as_display_writes_them(
            x in -1e9f64..1e9, scale in -12i32..16,
        ) {
            let x = x * 10f64.powi(scale);
            proptest::prop_assert_eq!(Value::Float(x).render(), displayed(x));
        }

        #[test]
        fn rendering_reads_back(
            x in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO,
            i in proptest::prelude::any::<i64>(),
            b in proptest::prelude::any::<bool>(),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..16),
        ) {
            let cases = [
                Value::Float(x),
                Value::Integer(i),
                Value::Bool(b),
                Value::Bytes(raw.into()),
            ];
            for value in cases {
                let text = value.render();
                proptest::prop_assert_eq!(
                    Value::parse_as(value.value_type(), &text, &[]),
                    Ok(value.clone()),
                    "{}", text
                );
            }
        }
    }
}
