//! The gateway's configuration: a serde struct where every key has a default, read from TOML,
//! overridden by command-line flags, and validated with errors that name the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod audit_section;
pub mod lab;
pub mod link_owner_timing;
mod sections;
pub mod station_url;
mod validate;
pub mod web_origin;

pub use audit_section::AuditConfig;
pub use sections::{
    AccessConfig, ApiKey, ConfigFilesConfig, DEFAULT_MAX_OPERATION_MS, EventsConfig, HaConfig,
    HaMode, HistoryConfig, HttpConfig, LeaseConfig, LegacyConfig, MAX_HTTP_THREADS,
    MOST_MAX_OPERATION_MS, Role, SafeWrite, StationConfig, StatusPageConfig, TlsConfig, User,
    valid_table_name,
};

/// A station's identity as its lease names it and as identities are compared: lower case,
/// every run of white space one space, none at the ends ("HVS-3 ESH1", " hvs-3  esh1 " are one
/// station).
pub fn identity_key(identity: &str) -> String {
    identity
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// `station.max_processing_ms` when not set: this many request timeouts.
pub const MAX_PROCESSING_PER_TIMEOUT: u32 = 4;

/// The documented example config, also printed by `station-gateway --print-config`.
pub const EXAMPLE_CONFIG: &str = include_str!("../../../config/gateway.toml");

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub station: StationConfig,
    pub http: HttpConfig,
    pub legacy: LegacyConfig,
    pub lease: LeaseConfig,
    pub events: EventsConfig,
    pub access: AccessConfig,
    pub status_page: StatusPageConfig,
    pub audit: AuditConfig,
    pub config_files: ConfigFilesConfig,
    pub ha: HaConfig,
    pub history: HistoryConfig,
}

/// A config that cannot be used, with the key (and file and line where known) at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not a `#[source]`: the message already says why, and a report that prints the
    /// chain (anyhow in `main`) would say it twice.
    #[error("cannot read config file {}: {}", path.display(), describe_io_error(error))]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("config key {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Config::from_toml(&text, &path.display().to_string())
    }

    /// Parses TOML; `origin` names the source in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config =
            toml::from_str(text).map_err(|error| parse_error(&error, text, origin))?;
        config.validate()?;
        Ok(config)
    }

    /// The control lease's name: `lease.name`, or after the station's identity
    /// `control:station:<station.id>`, or `control:<station.url>`.
    pub fn control_lease_name(&self) -> String {
        match (self.lease.name.trim(), self.station_id()) {
            ("", Some(id)) => format!("control:station:{id}"),
            ("", None) => format!("control:{}", self.station.url),
            (name, _) => name.to_owned(),
        }
    }

    /// What the link-owner lease is named after (`link-owner:<this>`): the control lease's
    /// name, with `station.id` in it after normalising case and spaces, so that two gateways
    /// told one id in another case or spacing share one link-owner lease (the second refuses
    /// to start, or stands by) even though each names its control lease as told.
    pub fn link_owner_key(&self) -> String {
        match (self.lease.name.trim(), self.station_id()) {
            ("", Some(id)) => format!("control:station:{}", identity_key(&id)),
            _ => self.control_lease_name(),
        }
    }

    /// `station.id`, when set: the station's identity as configured (it names the control
    /// lease; the station's own link-owner lease is named after HELLO's identity).
    pub fn station_id(&self) -> Option<String> {
        match self.station.id.trim() {
            "" => None,
            id => Some(id.to_owned()),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.station.request_timeout_ms)
    }

    /// `station.max_processing_ms`, or 4 × `station.request_timeout_ms` when not set.
    pub fn max_processing(&self) -> Duration {
        match self.station.max_processing_ms {
            Some(ms) => Duration::from_millis(ms),
            None => MAX_PROCESSING_PER_TIMEOUT * self.request_timeout(),
        }
    }

    /// `station.max_operation_ms`: the longest an operation the station times itself may take.
    pub fn max_operation(&self) -> Duration {
        Duration::from_millis(self.station.max_operation_ms)
    }

    /// `lease.lock_delay_ms`, or `station.max_processing_ms` when not set.
    pub fn lock_delay(&self) -> Duration {
        match self.lease.lock_delay_ms {
            Some(ms) => Duration::from_millis(ms),
            None => self.max_processing(),
        }
    }
}

/// A TOML error in `text` (from `origin`), placed by its line and, where the line is a key,
/// the dotted key.
fn parse_error(error: &toml::de::Error, text: &str, origin: &str) -> ConfigError {
    let at = error.span().map(|span| span.start.min(text.len()));
    let line = at.map(|at| {
        text.as_bytes()[..at]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    });
    let key = at.and_then(|at| key_at(text, at));
    let mut place = origin.to_owned();
    if let Some(line) = line {
        place.push_str(&format!(", line {line}"));
    }
    if let Some(key) = key {
        place.push_str(&format!(", key {key}"));
    }
    ConfigError::Parse {
        origin: place,
        message: plain_type_names(error.message()),
    }
}

/// The dotted key (`http.max_body_bytes`) of the `key = value` line holding byte `at`, with
/// the `[table]` it sits under; `None` when that line is not a key.
fn key_at(text: &str, at: usize) -> Option<String> {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || key.starts_with('[') || key.starts_with('#') {
        return None;
    }
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_owned(),
    })
}

/// Why a file could not be read, in words: "no such file" rather than the OS's "No such file
/// or directory (os error 2)".
fn describe_io_error(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        std::io::ErrorKind::IsADirectory => "it is a directory".to_owned(),
        _ => error.to_string(),
    }
}

/// serde's messages name Rust types ("invalid type: string \"lots\", expected usize"); a
/// config's reader wants the kind of value in words.
fn plain_type_names(message: &str) -> String {
    const WORDS: [(&str, &str); 10] = [
        ("expected usize", "expected a non-negative whole number"),
        ("expected u64", "expected a non-negative whole number"),
        (
            "expected u32",
            "expected a non-negative whole number up to 4294967295",
        ),
        (
            "expected u16",
            "expected a non-negative whole number up to 65535",
        ),
        (
            "expected u8",
            "expected a non-negative whole number up to 255",
        ),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("expected a sequence", "expected a list [...]"),
    ];
    let mut message = message.trim_end().to_owned();
    for (rust, words) in WORDS {
        // Whole words only: "expected u16" must not turn "expected u164" (none today) into nonsense.
        if let Some(at) = message.find(rust) {
            let end = at + rust.len();
            if !message[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                message.replace_range(at..end, words);
            }
        }
    }
    message
}

/// An address to listen on, `HOST:PORT`.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not an address such as 127.0.0.1:5000"))
}

#[cfg(test)]
mod tests;
