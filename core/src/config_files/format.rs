//! The station configuration file format: TOML with a format version, one `[[channel]]` table
//! per channel (its configuration and, for a writable setting, its value in the station's
//! text format). docs/rest-api.md's "Station configuration files" describes it for people.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

/// The format version this gateway writes and reads.
pub const FORMAT_VERSION: i64 = 1;

/// A whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub format_version: i64,
    /// When it was saved (RFC 3339, UTC), for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub saved_at: String,
    /// The station it was saved from (HELLO's name and serial), for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub station: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub serial: String,
    #[serde(default, rename = "channel")]
    pub channels: Vec<ChannelEntry>,
}

/// One channel: every field but `name` is optional, and only what is given is applied.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelEntry {
    /// The channel's full station name, e.g. `0.4.ESH10000662.VSET1`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `"IN"`, `"OUT"` or `"IN, OUT"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    /// Type names as the REST contract spells them, e.g. `"Analog, Current"`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub channel_type: Option<String>,
    /// A writable, non-consuming channel's value in the station's text format (`"500"`,
    /// `"True"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Type-specific details by the station's names (`Gain = 1.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<BTreeMap<String, toml::Value>>,
}

/// Why a text is not a configuration file this gateway reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not UTF-8 text")]
    NotText,
    #[error("not TOML: {0}")]
    NotToml(String),
    #[error("no format_version: not a station configuration file")]
    NoVersion,
    #[error("format_version {0} is not one this gateway reads (it reads {FORMAT_VERSION})")]
    WrongVersion(String),
    #[error("{0}")]
    Invalid(String),
}

const HEADER: &str = "\
# Station configuration saved by station-gateway: the channels' configuration and the values
# of the writable settings. See docs/rest-api.md, \"Station configuration files\", for the format.
";

impl ConfigFile {
    /// Reads a file's bytes, checking the format version first.
    pub fn parse(bytes: &[u8]) -> Result<ConfigFile, FormatError> {
        let text = std::str::from_utf8(bytes).map_err(|_| FormatError::NotText)?;
        let table: toml::Table = text
            .parse()
            .map_err(|error: toml::de::Error| FormatError::NotToml(first_line(&error)))?;
        match table.get("format_version") {
            None => return Err(FormatError::NoVersion),
            Some(toml::Value::Integer(FORMAT_VERSION)) => {}
            Some(other) => return Err(FormatError::WrongVersion(other.to_string())),
        }
        let file: ConfigFile = toml::Value::Table(table)
            .try_into()
            .map_err(|error: toml::de::Error| FormatError::Invalid(first_line(&error)))?;
        let mut seen = HashSet::new();
        for (index, channel) in file.channels.iter().enumerate() {
            if channel.name.is_empty() {
                return Err(FormatError::Invalid(format!(
                    "channel {} has an empty name",
                    index + 1
                )));
            }
            if !seen.insert(channel.name.as_str()) {
                return Err(FormatError::Invalid(format!(
                    "channel {} is listed twice",
                    channel.name
                )));
            }
            if let Some(details) = &channel.details {
                for (key, value) in details {
                    if matches!(
                        value,
                        toml::Value::Array(_) | toml::Value::Table(_) | toml::Value::Datetime(_)
                    ) {
                        return Err(FormatError::Invalid(format!(
                            "channel {}: detail {key} must be a number, a bool or a string",
                            channel.name
                        )));
                    }
                }
            }
        }
        Ok(file)
    }

    /// The file's text: a comment saying what it is, then the TOML.
    pub fn render(&self) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        format!("{HEADER}\n{body}")
    }
}

fn first_line(error: &toml::de::Error) -> String {
    error
        .to_string()
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ConfigFile {
        ConfigFile {
            format_version: FORMAT_VERSION,
            saved_at: "2026-12-01T12:00:00.000Z".into(),
            station: "Simulated Station".into(),
            serial: "ESH10000023".into(),
            channels: vec![
                ChannelEntry {
                    name: "0.4.ESH10000662.VSET1".into(),
                    alias: Some("HV1 set point".into()),
                    unit: Some("V".into()),
                    enabled: Some(true),
                    direction: Some("OUT".into()),
                    channel_type: Some("Analog".into()),
                    value: Some("500".into()),
                    details: Some(BTreeMap::from([
                        ("Gain".into(), toml::Value::Float(1.5)),
                        ("Offset".into(), toml::Value::Float(0.0)),
                    ])),
                    ..ChannelEntry::default()
                },
                ChannelEntry {
                    name: "0.4.ESH10000662.ON1".into(),
                    value: Some("False".into()),
                    ..ChannelEntry::default()
                },
            ],
        }
    }

    #[test]
    fn a_file_round_trips_through_its_text() {
        let text = sample().render();
        assert!(text.starts_with("# Station configuration"), "{text}");
        assert!(text.contains("format_version = 1"), "{text}");
        assert!(text.contains("[[channel]]"), "{text}");
        assert_eq!(ConfigFile::parse(text.as_bytes()).unwrap(), sample());
    }

    #[test]
    fn the_format_version_is_checked_first() {
        assert_eq!(
            ConfigFile::parse(b"format_version = 2\n[[channel]]\nbogus = 1\n"),
            Err(FormatError::WrongVersion("2".into()))
        );
        assert_eq!(
            ConfigFile::parse(b"[[channel]]\nname = \"X\"\n"),
            Err(FormatError::NoVersion)
        );
        assert_eq!(
            ConfigFile::parse(b"format_version = \"1\"\n"),
            Err(FormatError::WrongVersion("\"1\"".into()))
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert_eq!(ConfigFile::parse(&[0xff, 0xfe]), Err(FormatError::NotText));
        assert!(matches!(
            ConfigFile::parse(b"format_version = = 1"),
            Err(FormatError::NotToml(_))
        ));
        let unknown =
            ConfigFile::parse(b"format_version = 1\n[[channel]]\nname = \"X\"\ncolour = \"red\"\n");
        assert!(
            matches!(&unknown, Err(FormatError::Invalid(m)) if m.contains("colour")),
            "{unknown:?}"
        );
        let twice = ConfigFile::parse(
            b"format_version = 1\n[[channel]]\nname = \"X\"\n[[channel]]\nname = \"X\"\n",
        );
        assert_eq!(
            twice,
            Err(FormatError::Invalid("channel X is listed twice".into()))
        );
        let nested = ConfigFile::parse(
            b"format_version = 1\n[[channel]]\nname = \"X\"\ndetails = { Gain = [1] }\n",
        );
        assert!(matches!(nested, Err(FormatError::Invalid(m)) if m.contains("Gain")));
        assert!(matches!(
            ConfigFile::parse(b"format_version = 1\n[[channel]]\nname = \"\"\n"),
            Err(FormatError::Invalid(_))
        ));
    }
}
