//! The station profile: a TOML description of the station to simulate, read and validated.
//!
//! `config/station.toml` documents the schema at its top and is embedded as the default.
//! Every refusal names the file, the line and the key at fault.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use station_protocol::{ChannelDescriptor, ModuleInfo, Value, ValueType};

/// The default profile's text, embedded at build time.
pub const DEFAULT_PROFILE_TOML: &str = include_str!("../../config/station.toml");

/// Channel type flag bits, as LIST and the REST contract's `channelType` carry them.
pub const TYPE_FLAGS: [(&str, u32); 9] = [
    ("Analog", 1),
    ("Digital", 2),
    ("Temperature", 8),
    ("Current", 2048),
    ("UART", 8192),
    ("SPI", 16384),
    ("I2C", 32768),
    ("ByteStream", 65536),
    ("NumericResult", 1 << 19),
];

/// The option names a `stat` channel must offer, in this order of meaning.
pub const STAT_OPTIONS: [&str; 4] = ["Off", "Ramping", "On", "Trip"];

mod parse;

/// Why a profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read station profile {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(InvalidProfile),
}

/// A profile that was read but is wrong: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidProfile {
    /// The file name (or `built-in station.toml`).
    pub origin: String,
    /// 1-based line of the offending key or table.
    pub line: usize,
    /// The key at fault, as a dotted path (`channel.max`), or empty when none applies.
    pub key: String,
    pub message: String,
}

impl fmt::Display for InvalidProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: line {}: {}", self.origin, self.line, self.message)
        } else {
            write!(
                f,
                "{}: line {}: key `{}`: {}",
                self.origin, self.line, self.key, self.message
            )
        }
    }
}

/// Who the station is and how it paces itself.
#[derive(Debug, Clone, PartialEq)]
pub struct StationInfo {
    pub name: String,
    pub firmware: String,
    pub serial: String,
    /// Requests one TCP connection may have in flight; a serial line always gets 1.
    pub tcp_window: u16,
    /// Time every request takes before it is answered.
    pub processing: Duration,
    /// How often the background task checks the outputs for trips.
    pub tick: Duration,
    /// Noise seed; `None` seeds from the OS.
    pub seed: Option<u64>,
    /// Whether RESET restarts the application (SPEC.md §6.10); false: ERROR unsupported.
    pub reset: bool,
}

/// One high-voltage output and its power-on state.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputSpec {
    pub name: String,
    pub load_mohm: f64,
    pub vset: f64,
    pub iset: f64,
    pub ramp: f64,
    pub noise_v: f64,
    pub noise_ua: f64,
}

/// Which side of a high-voltage output a channel shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HvRole {
    Vset,
    Vmon,
    Iset,
    Imon,
    On,
    Ramp,
    Stat,
}

impl HvRole {
    fn from_name(name: &str) -> Option<HvRole> {
        Some(match name {
            "vset" => HvRole::Vset,
            "vmon" => HvRole::Vmon,
            "iset" => HvRole::Iset,
            "imon" => HvRole::Imon,
            "on" => HvRole::On,
            "ramp" => HvRole::Ramp,
            "stat" => HvRole::Stat,
            _ => return None,
        })
    }

    fn value_type(self) -> ValueType {
        match self {
            HvRole::On => ValueType::Bool,
            HvRole::Stat => ValueType::Enum,
            _ => ValueType::Float,
        }
    }

    fn writable(self) -> bool {
        matches!(
            self,
            HvRole::Vset | HvRole::Iset | HvRole::On | HvRole::Ramp
        )
    }
}

/// A slowly drifting, noisy measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalogModel {
    pub nominal: f64,
    pub noise: f64,
    pub drift: f64,
    pub period_s: f64,
    pub decimals: u32,
}

/// What a channel does when read or written.
#[derive(Debug, Clone, PartialEq)]
pub enum ChannelModel {
    Constant(Value),
    Uptime,
    Analog(AnalogModel),
    /// A stored value, optionally bounded.
    Setting {
        default: Value,
        range: Option<(f64, f64)>,
    },
    /// One side of output `output` (an index into [`Profile::outputs`]).
    Hv {
        output: usize,
        role: HvRole,
        range: Option<(f64, f64)>,
    },
    SupplyCurrent {
        idle: f64,
        per_kv: f64,
        noise: f64,
        decimals: u32,
    },
    I2c {
        registers: Vec<u8>,
    },
    Uart {
        replies: BTreeMap<String, String>,
        unknown: String,
    },
    /// A NumericResult channel: samples one of its targets (the descriptor's options) at
    /// `sample_rate` per second (SAMPLE, SPEC.md §6.12); a READ gives `default_samples`.
    NumericResult {
        sample_rate: f64,
        default_samples: u32,
    },
}

/// One channel: what LIST says about it and how it behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelSpec {
    pub descriptor: ChannelDescriptor,
    /// Extra time a request touching this channel takes.
    pub latency: Duration,
    pub model: ChannelModel,
}

impl ChannelSpec {
    /// A plain stored-value channel, e.g. one a test adds at run time.
    pub fn setting(descriptor: ChannelDescriptor) -> ChannelSpec {
        let default = zero_value(descriptor.value_type, &descriptor.options);
        ChannelSpec {
            descriptor,
            latency: Duration::ZERO,
            model: ChannelModel::Setting {
                default,
                range: None,
            },
        }
    }
}

/// A whole validated station profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Where the profile came from, for messages.
    pub origin: String,
    pub station: StationInfo,
    pub modules: Vec<ModuleInfo>,
    pub outputs: Vec<OutputSpec>,
    /// Channels in LIST order, templates already expanded.
    pub channels: Vec<ChannelSpec>,
    /// The bus channels' devices (`[[bus]]`).
    pub buses: Vec<crate::devices::BusSpec>,
}

impl Profile {
    /// The channel descriptors in LIST order.
    pub fn descriptors(&self) -> Vec<ChannelDescriptor> {
        self.channels.iter().map(|c| c.descriptor.clone()).collect()
    }
}

/// The zero value of a type: what a new stored channel holds before it is written.
pub(crate) fn zero_value(value_type: ValueType, options: &[String]) -> Value {
    match value_type {
        ValueType::Float => Value::Float(0.0),
        ValueType::Integer => Value::Integer(0),
        ValueType::Bool => Value::Bool(false),
        ValueType::Enum => Value::Enum(options.first().cloned().unwrap_or_default()),
        ValueType::String => Value::String(String::new()),
        ValueType::Bytes => Value::Bytes(bytes::Bytes::new()),
    }
}

/// A number's value as f64, for range checks.
pub(crate) fn numeric(value: &Value) -> Option<f64> {
    match value {
        Value::Float(x) => Some(*x),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(text: &str) -> InvalidProfile {
        match Profile::from_toml_str(text, "bad.toml") {
            Err(ProfileError::Invalid(invalid)) => invalid,
            other => panic!("expected an invalid profile, got {other:?}"),
        }
    }

    #[test]
    fn default_profile_is_the_station_of_the_profile_document() {
        let profile = Profile::default_station();
        assert_eq!(profile.station.firmware, "6.4.2");
        assert_eq!(profile.modules.len(), 5);
        assert_eq!(profile.outputs.len(), 4);
        let names: Vec<_> = profile
            .channels
            .iter()
            .map(|c| c.descriptor.name.as_str())
            .collect();
        for expected in [
            "Engine.Uptime",
            "Engine.FirmwareRev",
            "TempRegulator.CPU_TEMP",
            "0.1.ESH10000158.MON_3V3",
            "0.4.ESH10000662.VSET1",
            "0.4.ESH10000662.STAT4",
            "0.8.ESH10000590.ADC08",
            "0.11.ESH10000355.F1",
            "0.ESH10000023.I2C09",
            "0.ESH10000023.UART01",
            "Interlock.DOOR_CLOSED",
        ] {
            assert!(names.contains(&expected), "{expected} missing");
        }
        // Engine, CPU temperature, base rails, HV, ..., NumericResults, the door interlock.
        assert_eq!(names.len(), 2 + 1 + 2 + 28 + 2 + 8 + 6 + 3 + 3 + 1);
        assert_eq!(profile.buses.len(), 3);
        let uart = profile
            .channels
            .iter()
            .find(|c| c.descriptor.name == "0.ESH10000023.UART01")
            .map(|c| &c.descriptor)
            .expect("the UART");
        assert!(uart.consuming);
        assert_eq!(uart.type_flags, 8192 | 65536);
    }

    const MINIMAL: &str = r#"
[station]
name = "S"
firmware = "1"
serial = "X"

[[output]]
name = "HV1"
load_mohm = 10.0

[[channel]]
name = "A.B"
direction = "in"
access = "r"
value_type = "float"
model = "hv"
output = "HV1"
role = "vmon"
"#;

    #[test]
    fn a_minimal_profile_is_accepted() {
        let profile = Profile::from_toml_str(MINIMAL, "min.toml").unwrap();
        assert_eq!(profile.channels.len(), 1);
        assert_eq!(profile.station.tcp_window, 8);
    }

    /// On a station a channel's alias and net name are its full name unless configured.
    #[test]
    fn alias_and_net_name_default_to_the_full_name() {
        let profile = Profile::from_toml_str(MINIMAL, "min.toml").unwrap();
        let channel = &profile.channels[0].descriptor;
        assert_eq!(
            (channel.alias.as_str(), channel.net_name.as_str()),
            ("A.B", "A.B")
        );
        let text = MINIMAL.replace("model = \"hv\"", "model = \"hv\"\nalias = \"Rail\"");
        let profile = Profile::from_toml_str(&text, "min.toml").unwrap();
        let channel = &profile.channels[0].descriptor;
        assert_eq!(
            (channel.alias.as_str(), channel.net_name.as_str()),
            ("Rail", "A.B")
        );
        for spec in &Profile::default_station().channels {
            let d = &spec.descriptor;
            assert_eq!((&d.alias, &d.net_name), (&d.name, &d.name), "{}", d.name);
        }
    }

    #[test]
    fn a_wrong_reference_names_the_line_and_key() {
        let text = MINIMAL.replace("output = \"HV1\"", "output = \"HV9\"");
        let error = invalid(&text);
        assert_eq!(error.key, "channel.output");
        assert_eq!(error.line, 17);
        assert!(error.message.contains("HV9"), "{}", error.message);
        assert!(
            error
                .to_string()
                .starts_with("bad.toml: line 17: key `channel.output`")
        );
    }

    #[test]
    fn a_wrong_type_names_the_line_and_key() {
        let text = MINIMAL.replace("load_mohm = 10.0", "load_mohm = \"ten\"");
        let error = invalid(&text);
        assert_eq!(error.key, "output.load_mohm");
        assert_eq!(error.line, 9);
    }

    #[test]
    fn an_unknown_key_names_the_line_and_key() {
        let text = MINIMAL.replace("load_mohm = 10.0", "load_mohm = 10.0\nlod = 3");
        let error = invalid(&text);
        assert_eq!(error.key, "output.lod");
        assert_eq!(error.line, 10);
    }

    #[test]
    fn a_missing_key_names_the_table_and_key() {
        let text = MINIMAL.replace("access = \"r\"\n", "");
        let error = invalid(&text);
        assert!(error.key.contains("access"), "{error}");
    }

    #[test]
    fn a_measured_role_cannot_be_writable() {
        let text = MINIMAL.replace("access = \"r\"", "access = \"rw\"");
        let error = invalid(&text);
        assert_eq!(error.key, "channel.access");
        assert_eq!(error.line, 14);
    }

    #[test]
    fn each_expands_templates() {
        let text = MINIMAL
            .replace("name = \"A.B\"", "each = [\"1\"]\nname = \"A.B{n}\"")
            .replace("output = \"HV1\"", "output = \"HV{n}\"");
        let profile = Profile::from_toml_str(&text, "t.toml").unwrap();
        assert_eq!(profile.channels[0].descriptor.name, "A.B1");
    }
}
