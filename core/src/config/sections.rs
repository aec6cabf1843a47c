//! The config's sections, one struct per TOML table with every key's default, and the roles
//! of access control.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StationConfig {
    /// `tcp://HOST:PORT` or `serial:///dev/ttyUSB0?baud=115200&parity=none&stop_bits=1`.
    pub url: String,
    /// The station's identity (the model and serial its HELLO gives): unless `lease.name` is
    /// set it names the control lease (`control:station:<id>`) whatever address reaches the
    /// station; set it alike on two gateways of one station. Empty: `control:<url>`. The
    /// station's own link-owner lease is named after HELLO's identity whatever this says (one
    /// writer per station whatever the configuration).
    pub id: String,
    /// How long one request may wait for the station's answer.
    pub request_timeout_ms: u64,
    /// The longest the station may take over a request: a change it did not answer within
    /// `request_timeout_ms` is in doubt (it may still be carried out) until answered late or
    /// this long after it was sent; the end of a lease waits for its changes in doubt that
    /// long at most, then resets the link. `None`: 4 × `request_timeout_ms`.
    pub max_processing_ms: Option<u64>,
    /// The longest an operation the station times itself may take: a NumericResult
    /// acquisition (its samples at the channel's rate, or on a serial line the wire) and a UART
    /// receive (`TimeoutMs`). Longer is refused with 400 naming this key. The link waits for
    /// such an operation its own time on top of `request_timeout_ms`; the end of a lease waits
    /// for one still running, as for any change of it.
    pub max_operation_ms: u64,
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

/// `station.max_operation_ms` by default: five minutes.
pub const DEFAULT_MAX_OPERATION_MS: u64 = 300_000;
/// The largest `station.max_operation_ms`: an hour.
pub const MOST_MAX_OPERATION_MS: u64 = 3_600_000;

/// The most threads `http.threads` may ask for.
pub const MAX_HTTP_THREADS: usize = 256;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub listen: String,
    /// A path the API lives under, e.g. `/station3` for `http://host:5000/station3/api/...`.
    pub path_prefix: String,
    pub max_body_bytes: usize,
    /// How long a client may take to send its request headers, from its first byte or from
    /// accept (so also how long a connection that never sent a request is kept).
    pub header_read_timeout_ms: u64,
    /// How long a connection that has served a request is kept with no request in progress:
    /// an HTTP/1 keep-alive connection between requests, an HTTP/2 one with no open stream.
    /// 120 s by default: longer than the 60 s after which `accordionq2` 5.28.1 reopens an idle
    /// connection itself (`accordionq2/_base.py`, `IDLE_REOPEN_SECONDS`).
    pub keep_alive_timeout_ms: u64,
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
    /// Threads serving HTTP connections, the gateway's own included (`http::threads`); 0: one
    /// per core; at most [`MAX_HTTP_THREADS`].
    pub threads: usize,
    /// Host names the gateway may be reached by (`Host`, HTTP/2's `:authority`) besides any IP
    /// address and its own names (`localhost`, the machine's host name, the listen address,
    /// `host_name`); `*.domain` for every name below a domain; `"*"` turns the check off.
    /// Anything else is 421: what a page on a name re-pointed at the gateway sends.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) of web pages on other sites that may use the API from
    /// a browser: CORS is answered for them alone, and only they (and the gateway's own pages)
    /// may send a change from a browser.
    pub allowed_origins: Vec<String>,
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
    /// Threads serving HTTP connections: `threads`, or one per core while that is 0.
    pub fn connection_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            threads => threads,
        }
    }

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
    /// A per-channel access rules file (README, "Access rules"); empty: none, every key's and
    /// user's role alone decides. Reloaded on SIGHUP and when the file changes.
    pub rules: String,
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
    /// The user group of the access rules (`[access] rules`) legacy clients are in: they
    /// carry no identity, so this group and their address's host groups decide for them.
    pub access_group: String,
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
    /// Channel writes applied when a lease runs out without being released (or is
    /// safe-stopped). Done only once confirmed and read back right twice: right after its
    /// writes and again `station.max_processing_ms` later.
    pub safe_state: Vec<SafeWrite>,
    /// How far a number read back may be from the safe state's value and still count as
    /// right (absolute; booleans, enums and strings must match exactly).
    pub safe_state_tolerance: f64,
    /// How long a new lease waits after one that ran out unreleased, was broken or
    /// safe-stopped, or ended with changes in doubt (a lock-delay); `None`:
    /// `station.max_processing_ms`. 0 turns it off.
    pub lock_delay_ms: Option<u64>,
    /// With a shared backend: how long this gateway's link-owner lease lives without renewal.
    /// It is renewed every third of it (each renewal given a third), and the link sends
    /// nothing later than four fifths of it after the last confirmed renewal was sent.
    pub link_owner_ttl_ms: u64,
    /// The link-owner lease's renewal interval; `None`: a third of its TTL.
    pub link_owner_renew_ms: Option<u64>,
    /// How long one renewal may take at the store before it counts as failed; `None`: a third
    /// of the TTL.
    pub link_owner_store_timeout_ms: Option<u64>,
    /// How long before the lease would lapse in the store the link stops sending; `None`: a
    /// fifth of the TTL.
    pub link_owner_margin_ms: Option<u64>,
    /// How long a gateway that takes over a lapsed link-owner lease waits before it sends
    /// anything; `None`: the least that keeps margin + lock-delay ≥ `station.max_processing_ms`,
    /// and at least margin + store timeout.
    pub link_owner_lock_delay_ms: Option<u64>,
    /// With a shared backend: a state file (locked while the gateway runs) keeping the
    /// link-owner lease's token, so that a gateway restarted after a crash takes its own lease
    /// back at once; empty: `$STATE_DIRECTORY/link-owner.state` under systemd, else none.
    pub link_owner_state: String,
}

/// Two gateways for one station (`[ha]`): which of them this one is.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HaConfig {
    /// `owner`: take the station at start (refused while another gateway owns it).
    /// `standby`: serve health, readiness and metrics, point API clients at the owner, and
    /// take the station over once the owner's link-owner lease lapses. Needs a shared
    /// `lease.backend`. `--standby` sets it.
    pub mode: HaMode,
    /// The HTTP address this gateway publishes with its link-owner lease, for a standby to
    /// point clients at (`http://gw1.lab:5000`); empty: the address it listens on.
    pub advertise_url: String,
}

/// Owner or standby (`ha.mode`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HaMode {
    #[default]
    Owner,
    Standby,
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
    /// Events other than values (which merge, the latest winning) held for a slow reader;
    /// one more closes its stream with a last event saying so.
    pub stream_queue: usize,
    /// A subscription not renewed (PUT) within this long ends; the contract says 60 s.
    pub subscription_ttl_ms: u64,
    /// How long a stream whose reader went away is kept, with its subscriptions, for the reader
    /// to resume it with `Last-Event-ID`; 0 ends it at once.
    pub resume_grace_ms: u64,
    /// Events sent that a stream keeps, to send again to a reader that resumes it.
    pub replay_events: usize,
    /// Channels' ranges `[low, high]` by name or glob pattern, for percent deadbands.
    pub ranges: std::collections::BTreeMap<String, [f64; 2]>,
}

impl Default for StationConfig {
    fn default() -> Self {
        StationConfig {
            url: "tcp://127.0.0.1:4000".into(),
            id: String::new(),
            request_timeout_ms: 2000,
            max_processing_ms: None,
            max_operation_ms: DEFAULT_MAX_OPERATION_MS,
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
            keep_alive_timeout_ms: 120_000,
            body_timeout_ms: 10_000,
            body_idle_timeout_ms: 5_000,
            write_timeout_ms: 10_000,
            max_connections: 4096,
            max_connections_per_ip: 0,
            reserved_connections: 16,
            host_name: String::new(),
            threads: 0,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
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
            access_group: String::new(),
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
            safe_state_tolerance: 0.001,
            lock_delay_ms: None,
            link_owner_ttl_ms: 10_000,
            link_owner_renew_ms: None,
            link_owner_store_timeout_ms: None,
            link_owner_margin_ms: None,
            link_owner_lock_delay_ms: None,
            link_owner_state: String::new(),
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
            resume_grace_ms: 30_000,
            replay_events: 8,
            ranges: Default::default(),
        }
    }
}

impl LeaseConfig {
    /// The link-owner state file: the configured one, or under systemd's state directory.
    pub fn link_owner_state_path(&self) -> Option<PathBuf> {
        if !self.link_owner_state.is_empty() {
            return Some(self.link_owner_state.clone().into());
        }
        let dirs = std::env::var_os("STATE_DIRECTORY").filter(|dirs| !dirs.is_empty())?;
        // systemd may list several, separated by colons: the first is ours.
        let first = dirs.to_string_lossy().split(':').next()?.to_owned();
        Some(std::path::Path::new(&first).join("link-owner.state"))
    }
}

/// Whether `name` may be `history.archive_table`: a plain lower-case SQL identifier (it is written
/// into statements, never bound).
pub fn valid_table_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The value history (`GET /v1/history`): recent samples in memory, older ones in an archive.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Whether values are recorded at all.
    pub enabled: bool,
    /// Channels the gateway reads by itself for their history (names or glob patterns, matched
    /// against station names); every channel read anyway is recorded too.
    pub channels: Vec<String>,
    /// How often those are read (ms, cache first), and the closest two samples of a channel
    /// with the same status are kept.
    pub interval_ms: u64,
    /// Samples kept in memory per channel (36 000: 1 h at 10 Hz, 13 bytes each).
    pub samples_per_channel: usize,
    /// The most channels kept in memory: with `samples_per_channel`, the memory's bound.
    pub max_channels: usize,
    /// The archive: `postgres://…`; empty for memory only.
    pub archive: String,
    /// The archive's table (a plain lower-case SQL name); its day partitions are named after it.
    pub archive_table: String,
    /// Days the archive keeps (whole days' partitions older than this are dropped).
    pub retention_days: u32,
    /// Where samples wait while the archive is unreachable (a file, made when needed).
    pub spool: PathBuf,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            enabled: true,
            channels: Vec::new(),
            interval_ms: 100,
            samples_per_channel: 36_000,
            max_channels: 100,
            archive: String::new(),
            archive_table: "history_samples".into(),
            retention_days: 30,
            spool: PathBuf::from("state/history-spool"),
        }
    }
}
