//! A profile's text made into a [`Profile`] (its constructors): the raw TOML shape as serde
//! reads it, then its validation, which expands channel templates and names the file, the
//! line and the key of every refusal.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use station_protocol::{ChannelDescriptor, Direction, ModuleInfo, Value, ValueType};
use toml::Spanned;

use super::{
    AnalogModel, ChannelModel, ChannelSpec, DEFAULT_PROFILE_TOML, HvRole, InvalidProfile,
    OutputSpec, Profile, ProfileError, STAT_OPTIONS, StationInfo, TYPE_FLAGS, numeric, zero_value,
};

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
}

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
