//! The station profile: a TOML description of the station to simulate, read and validated.
//!
//! `config/station.toml` documents the schema at its top and is embedded as the default.
//! Every refusal names the file, the line and the key at fault.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use station_protocol::{ChannelDescriptor, Direction, ModuleInfo, Value, ValueType};
use toml::Spanned;

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
    /// The station of `config/station.toml`, embedded in the binary.
    pub fn default_station() -> Profile {
        match Profile::from_toml_str(DEFAULT_PROFILE_TOML, "built-in station.toml") {
            Ok(profile) => profile,
            // The embedded file is checked by a unit test; reaching this is a build defect.
            Err(error) => unreachable!("the embedded default profile is invalid: {error}"),
        }
    }

    /// Reads and validates a profile file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Profile, ProfileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Profile::from_toml_str(&text, &path.display().to_string())
    }

    /// Reads and validates profile text; `origin_name` names it in error messages.
    pub fn from_toml_str(text: &str, origin_name: &str) -> Result<Profile, ProfileError> {
        let source = Source {
            text,
            origin: origin_name,
        };
        let raw: RawProfile = toml::from_str(text).map_err(|error| source.toml_error(&error))?;
        build(&source, raw).map_err(ProfileError::Invalid)
    }

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

// ---- raw TOML shape -----------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    station: RawStation,
    #[serde(default)]
    module: Vec<RawModule>,
    #[serde(default)]
    output: Vec<Spanned<RawOutput>>,
    #[serde(default)]
    channel: Vec<Spanned<RawChannel>>,
    #[serde(default)]
    bus: Vec<Spanned<crate::devices::RawBus>>,
}

fn default_window() -> u16 {
    8
}

fn default_tick_ms() -> u64 {
    50
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStation {
    name: String,
    firmware: String,
    serial: String,
    #[serde(default = "default_window")]
    tcp_window: u16,
    #[serde(default)]
    processing_ms: u64,
    #[serde(default = "default_tick_ms")]
    tick_ms: u64,
    seed: Option<u64>,
    #[serde(default = "default_reset")]
    reset: bool,
}

fn default_reset() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModule {
    index: u16,
    name: String,
    product_id: String,
    revision: u32,
    serial: String,
}

fn default_iset() -> f64 {
    100.0
}

fn default_ramp() -> f64 {
    50.0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutput {
    name: String,
    load_mohm: f64,
    #[serde(default)]
    vset: f64,
    #[serde(default = "default_iset")]
    iset: f64,
    #[serde(default = "default_ramp")]
    ramp: f64,
    #[serde(default)]
    noise_v: f64,
    #[serde(default)]
    noise_ua: f64,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawChannel {
    each: Option<Vec<String>>,
    name: String,
    /// Defaults to `name`, as on a station.
    alias: Option<String>,
    /// Defaults to `name`, as on a station.
    net_name: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    unit: String,
    #[serde(default)]
    types: Vec<String>,
    direction: String,
    access: String,
    value_type: String,
    #[serde(default)]
    options: Vec<String>,
    #[serde(default)]
    latency_ms: u64,
    model: String,
    // Keys of particular models.
    value: Option<toml::Value>,
    nominal: Option<f64>,
    noise: Option<f64>,
    decimals: Option<u32>,
    drift: Option<f64>,
    period_s: Option<f64>,
    default: Option<toml::Value>,
    min: Option<f64>,
    max: Option<f64>,
    output: Option<String>,
    role: Option<String>,
    idle: Option<f64>,
    per_kv: Option<f64>,
    registers: Option<Vec<u8>>,
    replies: Option<BTreeMap<String, String>>,
    unknown: Option<String>,
    targets: Option<Vec<String>>,
    sample_rate: Option<f64>,
    default_samples: Option<u32>,
}

// ---- validation ---------------------------------------------------------------------------

/// The profile text and its name, for locating errors.
struct Source<'a> {
    text: &'a str,
    origin: &'a str,
}

impl Source<'_> {
    fn line_at(&self, offset: usize) -> usize {
        let offset = offset.min(self.text.len());
        self.text.as_bytes()[..offset]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn line_text(&self, line: usize) -> &str {
        self.text.lines().nth(line.saturating_sub(1)).unwrap_or("")
    }

    /// The header of the table a line belongs to (`channel`, `station`), or empty at top level.
    fn table_of_line(&self, line: usize) -> String {
        self.text
            .lines()
            .take(line)
            .collect::<Vec<_>>()
            .iter()
            .rev()
            .find_map(|l| {
                let l = l.trim();
                l.starts_with('[')
                    .then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned())
            })
            .unwrap_or_default()
    }

    fn toml_error(&self, error: &toml::de::Error) -> ProfileError {
        let message = error.message().trim().to_owned();
        let Some(span) = error.span() else {
            return ProfileError::Invalid(InvalidProfile {
                origin: self.origin.to_owned(),
                line: 1,
                key: String::new(),
                message,
            });
        };
        let line = self.line_at(span.start);
        let line_text = self.line_text(line).trim();
        let table = self.table_of_line(line);
        let key_here = if line_text.starts_with('[') {
            // The error is about the table itself (e.g. a missing field): name that field.
            backticked(&message).unwrap_or_default()
        } else {
            line_text
                .split_once('=')
                .map(|(key, _)| key.trim().trim_matches('"').to_owned())
                .unwrap_or_default()
        };
        let key = match (table.is_empty(), key_here.is_empty()) {
            (true, _) => key_here,
            (false, true) => table,
            (false, false) => format!("{table}.{key_here}"),
        };
        ProfileError::Invalid(InvalidProfile {
            origin: self.origin.to_owned(),
            line,
            key,
            message,
        })
    }

    /// An error about `key` of the table spanning `span`, located at that key's line.
    fn invalid(
        &self,
        span: &Range<usize>,
        table: &str,
        key: &str,
        message: String,
    ) -> InvalidProfile {
        let line = self.key_line(span, key);
        InvalidProfile {
            origin: self.origin.to_owned(),
            line,
            key: if key.is_empty() {
                table.to_owned()
            } else {
                format!("{table}.{key}")
            },
            message,
        }
    }

    /// The line where `key` is set inside the table spanning `span`, else the table's line.
    fn key_line(&self, span: &Range<usize>, key: &str) -> usize {
        let start = span.start.min(self.text.len());
        let end = span.end.clamp(start, self.text.len());
        let mut offset = start;
        for line in self.text[start..end].split_inclusive('\n') {
            let trimmed = line.trim_start();
            if !key.is_empty()
                && let Some(rest) = trimmed.strip_prefix(key)
                && rest.trim_start().starts_with('=')
            {
                return self.line_at(offset);
            }
            offset += line.len();
        }
        self.line_at(start)
    }
}

/// The first `quoted` word of a message, e.g. the field of "missing field `name`".
fn backticked(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_owned())
}

fn build(source: &Source<'_>, raw: RawProfile) -> Result<Profile, InvalidProfile> {
    let station_span = 0..source.text.len();
    let station = StationInfo {
        name: raw.station.name,
        firmware: raw.station.firmware,
        serial: raw.station.serial,
        tcp_window: raw.station.tcp_window,
        reset: raw.station.reset,
        processing: Duration::from_millis(raw.station.processing_ms),
        tick: Duration::from_millis(raw.station.tick_ms),
        seed: raw.station.seed,
    };
    if station.tcp_window == 0 {
        return Err(source.invalid(
            &station_span,
            "station",
            "tcp_window",
            "must be at least 1".into(),
        ));
    }
    if station.tick.is_zero() {
        return Err(source.invalid(
            &station_span,
            "station",
            "tick_ms",
            "must be at least 1".into(),
        ));
    }
    let modules = raw
        .module
        .into_iter()
        .map(|m| ModuleInfo {
            index: m.index,
            name: m.name,
            product_id: m.product_id,
            revision: m.revision,
            serial: m.serial,
        })
        .collect();

    let mut outputs = Vec::with_capacity(raw.output.len());
    let mut output_index = HashMap::new();
    for spanned in raw.output {
        let span = spanned.span();
        let o = spanned.into_inner();
        let bad = |key: &str, message: String| source.invalid(&span, "output", key, message);
        if output_index.contains_key(&o.name) {
            return Err(bad("name", format!("output {:?} is defined twice", o.name)));
        }
        if !(o.load_mohm.is_finite() && o.load_mohm > 0.0) {
            return Err(bad(
                "load_mohm",
                format!("must be a positive resistance, not {}", o.load_mohm),
            ));
        }
        for (key, value) in [
            ("vset", o.vset),
            ("iset", o.iset),
            ("ramp", o.ramp),
            ("noise_v", o.noise_v),
            ("noise_ua", o.noise_ua),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(bad(key, format!("must be zero or more, not {value}")));
            }
        }
        output_index.insert(o.name.clone(), outputs.len());
        outputs.push(OutputSpec {
            name: o.name,
            load_mohm: o.load_mohm,
            vset: o.vset,
            iset: o.iset,
            ramp: o.ramp,
            noise_v: o.noise_v,
            noise_ua: o.noise_ua,
        });
    }

    let mut channels = Vec::new();
    let mut seen = HashMap::new();
    for spanned in raw.channel {
        let span = spanned.span();
        let template = spanned.into_inner();
        let instances = match &template.each {
            None => vec![template.clone()],
            Some(entries) if entries.is_empty() => {
                return Err(source.invalid(&span, "channel", "each", "is empty".into()));
            }
            Some(entries) => entries
                .iter()
                .map(|entry| substitute(&template, entry))
                .collect(),
        };
        for raw_channel in instances {
            let spec = build_channel(source, &span, raw_channel, &output_index)?;
            if seen
                .insert(spec.descriptor.name.clone(), channels.len())
                .is_some()
            {
                return Err(source.invalid(
                    &span,
                    "channel",
                    "name",
                    format!("channel {} is defined twice", spec.descriptor.name),
                ));
            }
            channels.push(spec);
        }
    }

    let bus_spans: Vec<Range<usize>> = raw.bus.iter().map(|b| b.span()).collect();
    let buses = crate::devices::build_buses(
        raw.bus.into_iter().map(Spanned::into_inner).collect(),
        &channels,
        |index, key, message| source.invalid(&bus_spans[index], "bus", key, message),
    )?;

    Ok(Profile {
        origin: source.origin.to_owned(),
        station,
        modules,
        outputs,
        channels,
        buses,
    })
}

/// One instance of a templated channel: `{n}` replaced by `entry` in every text key.
fn substitute(template: &RawChannel, entry: &str) -> RawChannel {
    let s = |text: &str| text.replace("{n}", entry);
    let mut c = template.clone();
    c.each = None;
    c.name = s(&c.name);
    c.alias = c.alias.as_deref().map(s);
    c.net_name = c.net_name.as_deref().map(s);
    c.description = s(&c.description);
    c.group = s(&c.group);
    c.output = c.output.as_deref().map(s);
    c
}

fn build_channel(
    source: &Source<'_>,
    span: &Range<usize>,
    c: RawChannel,
    output_index: &HashMap<String, usize>,
) -> Result<ChannelSpec, InvalidProfile> {
    let name = c.name.clone();
    let bad = |key: &str, message: String| {
        source.invalid(span, "channel", key, format!("channel {name}: {message}"))
    };
    let need_f64 = |key: &str, value: Option<f64>| {
        value.ok_or_else(|| bad(key, format!("model {:?} needs `{key}`", c.model)))
    };

    if c.name.trim().is_empty() || c.name.chars().any(char::is_whitespace) {
        return Err(bad(
            "name",
            "a name must be non-empty without spaces".into(),
        ));
    }
    let mut type_flags = 0u32;
    for t in &c.types {
        let Some((_, bit)) = TYPE_FLAGS.iter().find(|(n, _)| n.eq_ignore_ascii_case(t)) else {
            let known: Vec<_> = TYPE_FLAGS.iter().map(|(n, _)| *n).collect();
            return Err(bad(
                "types",
                format!("unknown type {t:?}; known: {}", known.join(", ")),
            ));
        };
        type_flags |= bit;
    }
    let direction = match c.direction.to_ascii_lowercase().as_str() {
        "in" => Direction::In,
        "out" => Direction::Out,
        "inout" | "in, out" => Direction::InOut,
        other => {
            return Err(bad(
                "direction",
                format!("{other:?} is not \"in\", \"out\" or \"inout\""),
            ));
        }
    };
    let (readable, writable) = match c.access.as_str() {
        "r" => (true, false),
        "w" => (false, true),
        "rw" => (true, true),
        other => {
            return Err(bad(
                "access",
                format!("{other:?} is not \"r\", \"w\" or \"rw\""),
            ));
        }
    };
    let Some(value_type) = ValueType::from_name(&c.value_type) else {
        return Err(bad(
            "value_type",
            format!(
                "{:?} is not float, integer, bool, enum, string or bytes",
                c.value_type
            ),
        ));
    };
    if value_type == ValueType::Enum && c.options.is_empty() {
        return Err(bad("options", "an enum channel needs options".into()));
    }
    let mut options = c.options.clone();
    if c.model == "numeric_result" {
        options = c.targets.clone().unwrap_or_default();
        if options.is_empty() {
            return Err(bad(
                "targets",
                "a numeric_result channel needs targets".into(),
            ));
        }
    }
    if value_type != ValueType::Enum && !c.options.is_empty() {
        return Err(bad("options", "only an enum channel has options".into()));
    }
    let range = match (c.min, c.max) {
        (Some(min), Some(max)) if min > max => {
            return Err(bad("max", format!("max {max} is below min {min}")));
        }
        (Some(min), Some(max)) => Some((min, max)),
        (None, None) => None,
        (Some(_), None) => return Err(bad("max", "min is set without max".into())),
        (None, Some(_)) => return Err(bad("min", "max is set without min".into())),
    };
    let expect_type = |wanted: &[ValueType]| {
        if wanted.contains(&value_type) {
            Ok(())
        } else {
            let names: Vec<_> = wanted.iter().map(|t| t.name()).collect();
            Err(bad(
                "value_type",
                format!(
                    "model {:?} needs value_type {}, not {}",
                    c.model,
                    names.join(" or "),
                    value_type
                ),
            ))
        }
    };
    let toml_to_value = |key: &str, v: &toml::Value| -> Result<Value, InvalidProfile> {
        let parsed = match v {
            toml::Value::String(text) => Value::parse_as(value_type, text, &c.options)
                .map_err(|error| bad(key, error.to_string()))?,
            toml::Value::Float(x) if value_type == ValueType::Float => Value::Float(*x),
            toml::Value::Integer(i) if value_type == ValueType::Float => Value::Float(*i as f64),
            toml::Value::Integer(i) if value_type == ValueType::Integer => Value::Integer(*i),
            toml::Value::Boolean(b) if value_type == ValueType::Bool => Value::Bool(*b),
            other => {
                return Err(bad(key, format!("{other} is not a {value_type} value")));
            }
        };
        Ok(parsed)
    };

    let mut consuming = false;
    let model = match c.model.as_str() {
        "constant" => {
            let value = c
                .value
                .as_ref()
                .ok_or_else(|| bad("value", "model \"constant\" needs `value`".into()))?;
            ChannelModel::Constant(toml_to_value("value", value)?)
        }
        "uptime" => {
            expect_type(&[ValueType::String])?;
            ChannelModel::Uptime
        }
        "analog" => {
            expect_type(&[ValueType::Float])?;
            let period_s = c.period_s.unwrap_or(60.0);
            if !(period_s.is_finite() && period_s > 0.0) {
                return Err(bad("period_s", format!("must be positive, not {period_s}")));
            }
            ChannelModel::Analog(AnalogModel {
                nominal: need_f64("nominal", c.nominal)?,
                noise: c.noise.unwrap_or(0.0).abs(),
                drift: c.drift.unwrap_or(0.0),
                period_s,
                decimals: c.decimals.unwrap_or(3).min(9),
            })
        }
        "setting" => {
            let default = match &c.default {
                Some(v) => toml_to_value("default", v)?,
                None => zero_value(value_type, &c.options),
            };
            if let (Some((min, max)), Some(x)) = (range, numeric(&default))
                && !(min..=max).contains(&x)
            {
                return Err(bad("default", format!("{x} is outside {min} to {max}")));
            }
            ChannelModel::Setting { default, range }
        }
        "hv" => {
            let output_name = c
                .output
                .as_deref()
                .ok_or_else(|| bad("output", "model \"hv\" needs `output`".into()))?;
            let output = *output_index
                .get(output_name)
                .ok_or_else(|| bad("output", format!("no [[output]] is named {output_name:?}")))?;
            let role_name = c
                .role
                .as_deref()
                .ok_or_else(|| bad("role", "model \"hv\" needs `role`".into()))?;
            let role = HvRole::from_name(role_name).ok_or_else(|| {
                bad(
                    "role",
                    format!("{role_name:?} is not one of vset, vmon, iset, imon, on, ramp, stat"),
                )
            })?;
            expect_type(&[role.value_type()])?;
            if writable && !role.writable() {
                return Err(bad(
                    "access",
                    format!("role {role_name} is measured, so access must be \"r\""),
                ));
            }
            if role == HvRole::Stat {
                for option in STAT_OPTIONS {
                    if !c.options.iter().any(|o| o == option) {
                        return Err(bad(
                            "options",
                            format!("a stat channel needs the option {option}"),
                        ));
                    }
                }
            }
            ChannelModel::Hv {
                output,
                role,
                range,
            }
        }
        "supply_current" => {
            expect_type(&[ValueType::Float])?;
            ChannelModel::SupplyCurrent {
                idle: need_f64("idle", c.idle)?,
                per_kv: c.per_kv.unwrap_or(0.0),
                noise: c.noise.unwrap_or(0.0).abs(),
                decimals: c.decimals.unwrap_or(3).min(9),
            }
        }
        "i2c" => {
            expect_type(&[ValueType::Bytes])?;
            consuming = true;
            let registers = c.registers.clone().unwrap_or_default();
            if registers.len() > 256 {
                return Err(bad(
                    "registers",
                    format!(
                        "a device has at most 256 registers, not {}",
                        registers.len()
                    ),
                ));
            }
            ChannelModel::I2c { registers }
        }
        "uart" => {
            expect_type(&[ValueType::String])?;
            consuming = true;
            ChannelModel::Uart {
                replies: c.replies.clone().unwrap_or_default(),
                unknown: c.unknown.clone().unwrap_or_else(|| "ERR".to_owned()),
            }
        }
        "numeric_result" => {
            expect_type(&[ValueType::Integer])?;
            let sample_rate = need_f64("sample_rate", c.sample_rate)?;
            if !(sample_rate.is_finite() && sample_rate >= 1.0) {
                return Err(bad(
                    "sample_rate",
                    format!("{sample_rate} is not a rate of at least 1 sample a second"),
                ));
            }
            let default_samples = c.default_samples.unwrap_or(1000);
            if !(1..=station_protocol::sample::MAX_SAMPLES).contains(&default_samples) {
                return Err(bad(
                    "default_samples",
                    format!("{default_samples} is not 1 to 100000"),
                ));
            }
            ChannelModel::NumericResult {
                sample_rate,
                default_samples,
            }
        }
        other => {
            return Err(bad(
                "model",
                format!(
                    "unknown model {other:?}; known: constant, uptime, analog, setting, hv, \
                     supply_current, i2c, uart, numeric_result"
                ),
            ));
        }
    };

    Ok(ChannelSpec {
        descriptor: ChannelDescriptor {
            alias: c.alias.unwrap_or_else(|| c.name.clone()),
            net_name: c.net_name.unwrap_or_else(|| c.name.clone()),
            name: c.name,
            type_flags,
            direction,
            unit: c.unit,
            description: c.description,
            group: c.group,
            readable,
            writable,
            consuming,
            value_type,
            options,
        },
        latency: Duration::from_millis(c.latency_ms),
        model,
    })
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
