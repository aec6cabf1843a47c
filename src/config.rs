//! The gateway's configuration: a serde struct where every key has a default, read from TOML,
//! overridden by command-line flags, and validated with errors that name the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use crate::audit::settings::AuditConfig;

/// The documented example config, also printed by `station-gateway --print-config`.
pub const EXAMPLE_CONFIG: &str = include_str!("../config/gateway.toml");

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
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StationConfig {
    /// `tcp://HOST:PORT` or `serial:///dev/ttyUSB0?baud=115200&parity=none&stop_bits=1`.
    pub url: String,
    /// How long one request may wait for the station's answer.
    pub request_timeout_ms: u64,
    /// How long one connection attempt may take.
    pub connect_timeout_ms: u64,
    /// First and longest pause between reconnection attempts.
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    /// Most channel names put in one READ frame.
    pub max_names_per_read: usize,
    /// Reads of a channel that arrive while a READ of it is on the wire wait for the next
    /// READ; that one goes out once no new reader came for this long (µs)...
    pub coalesce_quiet_us: u64,
    /// ...or this long after the first of them was held (µs). 0 sends at once.
    pub coalesce_max_us: u64,
    /// Requests waiting for the link before new ones are refused with 503.
    pub queue_depth: usize,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub listen: String,
    /// A path the API lives under, e.g. `/station3` for `http://host:5000/station3/api/...`.
    pub path_prefix: String,
    pub max_body_bytes: usize,
    /// How long a client may take to send its request headers (and, between requests, how
    /// long an idle keep-alive connection is kept).
    pub header_read_timeout_ms: u64,
    /// How long a client may take to send a whole request body, from its headers' arrival.
    pub body_timeout_ms: u64,
    /// How long a request body may pause between two of its pieces.
    pub body_idle_timeout_ms: u64,
    /// How long an answer's write may make no progress (a client that stopped reading)
    /// before the connection is closed. A stream that is being read is never cut.
    pub write_timeout_ms: u64,
    /// HTTP connections open at once; past that, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// Connections one client IP address may hold at once; 0: a quarter of
    /// `max_connections` (at least 1).
    pub max_connections_per_ip: usize,
    /// Connections beyond `max_connections` kept for health checks and lease renewal and
    /// release: at the limit, a new connection is served only for those.
    pub reserved_connections: usize,
    /// The station's host name in `api/modules/physical-system`; empty: the name each request
    /// was addressed to (its `Host`, without port or `.local`).
    pub host_name: String,
    pub tls: TlsConfig,
}

/// HTTPS: a PEM certificate chain and private key; off while both are empty. The files are
/// read at start-up, not when the config is parsed.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: String,
    pub key: String,
}

impl HttpConfig {
    /// Connections one IP address may hold: `max_connections_per_ip`, or a quarter of
    /// `max_connections` while that is 0.
    pub fn per_ip_limit(&self) -> usize {
        match self.max_connections_per_ip {
            0 => (self.max_connections / 4).max(1),
            limit => limit,
        }
    }
}

impl TlsConfig {
    pub fn enabled(&self) -> bool {
        !self.cert.is_empty() || !self.key.is_empty()
    }
}

/// What a credential may do; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads, the event stream, subscriptions, who holds the lease, metrics, the status page.
    Read,
    /// Also writes, transactions and taking, renewing and releasing the lease.
    Control,
    /// Also breaking anyone's lease (`DELETE api/lease`).
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Control => "control",
            Role::Admin => "admin",
        }
    }
}

/// Access control: off while both lists are empty.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AccessConfig {
    /// API keys, sent as `X-Api-Key: KEY`.
    pub keys: Vec<ApiKey>,
    /// Users for HTTP Basic authentication (`Authorization: Basic ...`).
    pub users: Vec<User>,
}

#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    pub key: String,
    pub role: Role,
    /// Who the key is, as the audit trail names its caller; empty: `key N` (its place in
    /// the list, from 1). Never the key itself.
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    pub password: String,
    pub role: Role,
}

// Secrets never reach a log, not even through `{:?}` of the whole config.
impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("key", &"<redacted>")
            .field("role", &self.role)
            .field("name", &self.name)
            .finish()
    }
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .field("role", &self.role)
            .finish()
    }
}

/// The status page at `/`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StatusPageConfig {
    /// Channels whose live values the page shows: a full name, or the end of one after a dot
    /// (`VMON1` is `0.4.ESH10000662.VMON1`); the first channel that matches is shown.
    pub channels: Vec<String>,
    /// How often the page's values are refreshed (ms).
    pub interval_ms: u64,
}

impl Default for StatusPageConfig {
    fn default() -> Self {
        StatusPageConfig {
            channels: ["MON_3V3", "VMON1", "IMON1", "STAT1", "CPU_TEMP"]
                .map(String::from)
                .to_vec(),
            interval_ms: 1000,
        }
    }
}

/// Station configuration files (`api/application/config/...`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigFilesConfig {
    /// The directory the gateway keeps them in, its own; made when first needed.
    pub dir: PathBuf,
    /// The largest file accepted by upload (bytes).
    pub max_file_bytes: usize,
}

impl Default for ConfigFilesConfig {
    fn default() -> Self {
        ConfigFilesConfig {
            dir: PathBuf::from("state/config-files"),
            max_file_bytes: 256 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LegacyConfig {
    /// Where byte-protocol clients connect; off when empty.
    pub listen: String,
    /// While someone holds the lease, legacy reads are served from the cache up to this age.
    pub read_max_age_ms: u64,
    /// Legacy clients connected at once; more are refused with a BUSY error.
    pub max_clients: usize,
    /// A client that sends nothing for this long is disconnected.
    pub idle_timeout_ms: u64,
    /// Client IP addresses allowed to connect; everyone when empty.
    pub allow: Vec<String>,
    /// Requests one client may have in flight, announced in HELLO.
    pub window: u16,
    /// Reply frames queued for a client that is slow to read; past that it is dropped.
    pub output_frames: usize,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseConfig {
    /// Where leases live: `memory`, `sqlite:PATH`, `postgres://...` or `redis://...`.
    pub backend: String,
    /// The control lease's name in the backend; empty: `control:<station.url>` (with
    /// `--simulator`: `control:station:<serial>`, the embedded station's identity). Set it when
    /// the station URL is not stable and the lease must survive a restart.
    pub name: String,
    /// A bearer token that may break anyone's lease with `DELETE api/lease`; off when empty.
    pub admin_token: String,
    /// Channel writes applied when a lease runs out without being released.
    pub safe_state: Vec<SafeWrite>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SafeWrite {
    pub channel: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    pub max_streams: usize,
    pub max_subscriptions_per_stream: usize,
    pub max_channels_per_subscription: usize,
    /// Events held for a slow reader before newer ones are dropped.
    pub stream_queue: usize,
    /// A subscription not renewed (PUT) within this long ends; the contract says 60 s.
    pub subscription_ttl_ms: u64,
}

impl Default for StationConfig {
    fn default() -> Self {
        StationConfig {
            url: "tcp://127.0.0.1:4000".into(),
            request_timeout_ms: 2000,
            connect_timeout_ms: 2000,
            reconnect_min_ms: 100,
            reconnect_max_ms: 5000,
            max_names_per_read: 64,
            coalesce_quiet_us: 300,
            coalesce_max_us: 5000,
            queue_depth: 4096,
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:5000".into(),
            path_prefix: String::new(),
            max_body_bytes: 1024 * 1024,
            header_read_timeout_ms: 10_000,
            body_timeout_ms: 10_000,
            body_idle_timeout_ms: 5_000,
            write_timeout_ms: 10_000,
            max_connections: 4096,
            max_connections_per_ip: 0,
            reserved_connections: 16,
            host_name: String::new(),
            tls: TlsConfig::default(),
        }
    }
}

impl Default for LegacyConfig {
    fn default() -> Self {
        LegacyConfig {
            listen: String::new(),
            read_max_age_ms: 1000,
            max_clients: 256,
            idle_timeout_ms: 300_000,
            allow: Vec::new(),
            window: 8,
            output_frames: 256,
        }
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            backend: "memory".into(),
            name: String::new(),
            admin_token: String::new(),
            safe_state: Vec::new(),
        }
    }
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            max_streams: 2000,
            max_subscriptions_per_stream: 32,
            max_channels_per_subscription: 256,
            stream_queue: 64,
            subscription_ttl_ms: 60_000,
        }
    }
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
        let config: Config = toml::from_str(text).map_err(|error| {
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
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot: ranges, addresses, URLs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
            ConfigError::Invalid {
                key,
                message: message.into(),
            }
        }
        crate::link::StationUrl::parse(&self.station.url)
            .map_err(|error| invalid("station.url", error.to_string()))?;
        if !(4096..=1 << 30).contains(&self.audit.file_bytes) {
            return Err(invalid(
                "audit.file_bytes",
                "must be 4096 to 1073741824 (bytes)",
            ));
        }
        if !(1..=1000).contains(&self.audit.files) {
            return Err(invalid("audit.files", "must be 1 to 1000"));
        }
        if !(1..=600_000).contains(&self.station.request_timeout_ms) {
            return Err(invalid("station.request_timeout_ms", "must be 1 to 600000"));
        }
        if self.station.connect_timeout_ms == 0 {
            return Err(invalid("station.connect_timeout_ms", "must be above 0"));
        }
        if self.station.reconnect_min_ms == 0
            || self.station.reconnect_min_ms > self.station.reconnect_max_ms
        {
            return Err(invalid(
                "station.reconnect_min_ms",
                "must be above 0 and at most station.reconnect_max_ms",
            ));
        }
        if self.station.coalesce_max_us > 1_000_000 {
            return Err(invalid(
                "station.coalesce_max_us",
                "must be at most 1000000 (1 s)",
            ));
        }
        if !(1..=1000).contains(&self.station.max_names_per_read) {
            return Err(invalid("station.max_names_per_read", "must be 1 to 1000"));
        }
        if self.station.queue_depth == 0 {
            return Err(invalid("station.queue_depth", "must be above 0"));
        }
        parse_listen(&self.http.listen).map_err(|m| invalid("http.listen", m))?;
        if !self.http.path_prefix.is_empty() && !self.http.path_prefix.starts_with('/') {
            return Err(invalid("http.path_prefix", "must be empty or start with /"));
        }
        if self.http.max_connections == 0 {
            return Err(invalid("http.max_connections", "must be above 0"));
        }
        if self.http.max_body_bytes == 0 {
            return Err(invalid("http.max_body_bytes", "must be above 0"));
        }
        for (key, value) in [
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            ("http.body_timeout_ms", self.http.body_timeout_ms),
            ("http.body_idle_timeout_ms", self.http.body_idle_timeout_ms),
            ("http.write_timeout_ms", self.http.write_timeout_ms),
        ] {
            if !(1..=3_600_000).contains(&value) {
                return Err(invalid(key, "must be 1 to 3600000 (ms)"));
            }
        }
        for address in &self.legacy.allow {
            address.parse::<std::net::IpAddr>().map_err(|_| {
                invalid("legacy.allow", format!("{address:?} is not an IP address"))
            })?;
        }
        if self.legacy.max_clients == 0 {
            return Err(invalid("legacy.max_clients", "must be above 0"));
        }
        if self.legacy.idle_timeout_ms == 0 {
            return Err(invalid("legacy.idle_timeout_ms", "must be above 0"));
        }
        if !(1..=64).contains(&self.legacy.window) {
            return Err(invalid("legacy.window", "must be 1 to 64"));
        }
        if self.legacy.output_frames == 0 {
            return Err(invalid("legacy.output_frames", "must be above 0"));
        }
        if !self.legacy.listen.is_empty() {
            parse_listen(&self.legacy.listen).map_err(|m| invalid("legacy.listen", m))?;
        }
        station_lease::BackendUrl::parse(&self.lease.backend)
            .map_err(|error| invalid("lease.backend", error.to_string()))?;
        if self.http.tls.enabled() {
            if self.http.tls.cert.is_empty() {
                return Err(invalid(
                    "http.tls.cert",
                    "give the certificate (PEM) as well as http.tls.key, or neither",
                ));
            }
            if self.http.tls.key.is_empty() {
                return Err(invalid(
                    "http.tls.key",
                    "give the private key (PEM) as well as http.tls.cert, or neither",
                ));
            }
        }
        for key in &self.access.keys {
            if key.key.len() < 16 {
                return Err(invalid(
                    "access.keys",
                    "every key must be at least 16 characters (e.g. openssl rand -hex 24)",
                ));
            }
        }
        for (i, user) in self.access.users.iter().enumerate() {
            if user.name.is_empty() || user.name.contains(':') {
                return Err(invalid(
                    "access.users",
                    format!("user {}: the name must be non-empty and without ':'", i + 1),
                ));
            }
            if user.password.is_empty() {
                return Err(invalid(
                    "access.users",
                    format!("user {:?}: the password must not be empty", user.name),
                ));
            }
        }
        if !(100..=60_000).contains(&self.status_page.interval_ms) {
            return Err(invalid("status_page.interval_ms", "must be 100 to 60000"));
        }
        if self.config_files.dir.as_os_str().is_empty() {
            return Err(invalid("config_files.dir", "must name a directory"));
        }
        if !(1024..=1024 * 1024).contains(&self.config_files.max_file_bytes) {
            return Err(invalid(
                "config_files.max_file_bytes",
                "must be 1024 to 1048576 (the request body limit)",
            ));
        }
        if self.events.stream_queue == 0 {
            return Err(invalid("events.stream_queue", "must be above 0"));
        }
        if !(100..=3_600_000).contains(&self.events.subscription_ttl_ms) {
            return Err(invalid(
                "events.subscription_ttl_ms",
                "must be 100 to 3600000",
            ));
        }
        Ok(())
    }

    /// The control lease's name: `lease.name`, or `control:<station.url>`.
    pub fn control_lease_name(&self) -> String {
        match self.lease.name.trim() {
            "" => format!("control:{}", self.station.url),
            name => name.to_owned(),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.station.request_timeout_ms)
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
mod tests {
    use super::*;

    #[test]
    fn the_example_config_is_valid_and_says_the_defaults() {
        let example = Config::from_toml(EXAMPLE_CONFIG, "config/gateway.toml").unwrap();
        assert_eq!(example, Config::default());
    }

    #[test]
    fn the_sample_production_config_parses_with_tls_access_and_a_safe_state() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/production.toml");
        // The certificate files need not exist to parse: they are read at start-up.
        let config = Config::from_file(&path).unwrap();
        assert!(config.http.tls.enabled());
        assert!(config.access.keys.iter().any(|k| k.role == Role::Control));
        assert!(config.access.users.iter().any(|u| u.role == Role::Admin));
        assert!(!config.legacy.allow.is_empty());
        assert_eq!(
            config.audit.directory().unwrap(),
            Path::new("/var/lib/station-gateway/audit")
        );
        assert!(config.access.keys.iter().all(|k| !k.name.is_empty()));
        assert!(
            config
                .lease
                .safe_state
                .iter()
                .any(|w| w.channel.ends_with(".ON1") && w.value == "False")
        );
    }

    #[test]
    fn tls_needs_both_files_and_access_entries_are_checked() {
        let error = Config::from_toml("[http.tls]\ncert = \"a.pem\"\n", "x.toml").unwrap_err();
        assert!(error.to_string().contains("http.tls.key"), "{error}");
        let error = Config::from_toml(
            "[access]\nkeys = [{ key = \"short\", role = \"read\" }]\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(error.to_string().contains("access.keys"), "{error}");
        let error = Config::from_toml(
            "[access]\nkeys = [{ key = \"0123456789abcdef\", role = \"root\" }]\n",
            "x.toml",
        )
        .unwrap_err();
        assert!(error.to_string().contains("root"), "{error}");
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let error =
            Config::from_toml("[station]\nurl = \"tcp://a:1\"\nspeed = 3\n", "x.toml").unwrap_err();
        let text = error.to_string();
        assert!(text.contains("x.toml, line 3"), "{text}");
        assert!(text.contains("speed"), "{text}");
    }

    #[test]
    fn a_value_of_the_wrong_type_names_the_key_and_line() {
        let error = Config::from_toml("[http]\nmax_body_bytes = \"lots\"\n", "x.toml").unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("x.toml, line 2, key http.max_body_bytes"),
            "{text}"
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_says_the_expected_kind_in_words() {
        let error = Config::from_toml("[http]\nmax_body_bytes = \"lots\"\n", "x.toml").unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("expected a non-negative whole number"),
            "{text}"
        );
        assert!(!text.contains("usize"), "{text}");
        let error = Config::from_toml("[legacy]\nwindow = 70000\n", "x.toml").unwrap_err();
        let text = error.to_string();
        assert!(text.contains("up to 65535"), "{text}");
        assert!(!text.contains("u16"), "{text}");
    }

    #[test]
    fn a_missing_config_file_is_one_line_naming_the_file() {
        let path = std::env::temp_dir().join("station-gateway-no-such-config.toml");
        let error = Config::from_file(&path).unwrap_err();
        // As main prints it: the chain on one line, never a backtrace.
        let report = format!("{:#}", anyhow::Error::from(error));
        assert_eq!(
            report,
            format!("cannot read config file {}: no such file", path.display())
        );
    }

    #[test]
    fn a_bad_value_names_the_key() {
        let error = Config::from_toml("[station]\nrequest_timeout_ms = 0\n", "x.toml").unwrap_err();
        assert!(
            error.to_string().contains("station.request_timeout_ms"),
            "{error}"
        );
        let error = Config::from_toml("[station]\nurl = \"ftp://x\"\n", "x.toml").unwrap_err();
        assert!(error.to_string().contains("station.url"), "{error}");
    }
}
