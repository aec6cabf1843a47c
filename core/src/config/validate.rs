//! What serde cannot check of a config: ranges, addresses, URLs, each error naming its key.
//! Each section checks itself (`StationConfig::validate`, `HttpConfig::validate`, ...), so a
//! section used on its own is checked the same way; [`Config::validate`] runs them all and
//! then the rules that span sections (a standby's lease backend and names, the link-owner
//! lease's timing against the station's longest change).

use super::{
    AccessConfig, AuditConfig, Config, ConfigError, ConfigFilesConfig, EventsConfig, HaConfig,
    HistoryConfig, HttpConfig, LeaseConfig, LegacyConfig, StationConfig, StatusPageConfig,
    parse_listen,
};

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

impl Config {
    /// Checks what serde cannot: ranges, addresses, URLs; each section, then what spans them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.station.validate()?;
        self.audit.validate()?;
        self.http.validate()?;
        self.legacy.validate()?;
        self.lease.validate()?;
        self.ha.validate()?;
        // What spans sections: a standby shares its owner's lease backend and names the
        // station's leases as the owner does.
        let backend = station_lease::BackendUrl::parse(&self.lease.backend)
            .map_err(|error| invalid("lease.backend", error.to_string()))?;
        if self.ha.mode == super::HaMode::Standby && !backend.is_shared() {
            return Err(invalid(
                "ha.mode",
                "a standby needs a lease.backend the owner shares (sqlite:PATH on one host, postgres://... or redis://...), not memory",
            ));
        }
        if self.ha.mode == super::HaMode::Standby
            && self.station_id().is_none()
            && self.lease.name.trim().is_empty()
        {
            return Err(invalid(
                "ha.mode",
                "a standby must name the station's leases as its owner does, whatever address each reaches it by: set station.id (the station's identity) or lease.name alike on both gateways",
            ));
        }
        // The link-owner lease's timing against the station's longest change.
        self.link_owner_timing()
            .check(self.max_processing())
            .map_err(|broken| invalid(broken.key, broken.message))?;
        self.access.validate()?;
        self.status_page.validate()?;
        self.config_files.validate()?;
        self.events.validate()?;
        self.history.validate()?;
        Ok(())
    }
}

impl StationConfig {
    /// `[station]`: its URL, identity, timeouts and queue.
    pub fn validate(&self) -> Result<(), ConfigError> {
        super::station_url::StationUrl::parse(&self.url)
            .map_err(|error| invalid("station.url", error.to_string()))?;
        if self.id.chars().count() > 200 || self.id.chars().any(char::is_control) {
            return Err(invalid(
                "station.id",
                "must be at most 200 characters, without control characters",
            ));
        }
        if !(1..=600_000).contains(&self.request_timeout_ms) {
            return Err(invalid("station.request_timeout_ms", "must be 1 to 600000"));
        }
        if let Some(ms) = self.max_processing_ms
            && !(self.request_timeout_ms..=3_600_000).contains(&ms)
        {
            return Err(invalid(
                "station.max_processing_ms",
                "must be at least station.request_timeout_ms and at most 3600000 (1 h)",
            ));
        }
        if !(1..=super::sections::MOST_MAX_OPERATION_MS).contains(&self.max_operation_ms) {
            return Err(invalid(
                "station.max_operation_ms",
                "must be 1 to 3600000 (1 h)",
            ));
        }
        if self.connect_timeout_ms == 0 {
            return Err(invalid("station.connect_timeout_ms", "must be above 0"));
        }
        if self.reconnect_min_ms == 0 || self.reconnect_min_ms > self.reconnect_max_ms {
            return Err(invalid(
                "station.reconnect_min_ms",
                "must be above 0 and at most station.reconnect_max_ms",
            ));
        }
        if self.coalesce_max_us > 1_000_000 {
            return Err(invalid(
                "station.coalesce_max_us",
                "must be at most 1000000 (1 s)",
            ));
        }
        if !(1..=1000).contains(&self.max_names_per_read) {
            return Err(invalid("station.max_names_per_read", "must be 1 to 1000"));
        }
        if self.queue_depth == 0 {
            return Err(invalid("station.queue_depth", "must be above 0"));
        }
        Ok(())
    }
}

impl AuditConfig {
    /// `[audit]`: the sizes and counts of its files.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(4096..=1 << 30).contains(&self.file_bytes) {
            return Err(invalid(
                "audit.file_bytes",
                "must be 4096 to 1073741824 (bytes)",
            ));
        }
        if !(1..=1000).contains(&self.files) {
            return Err(invalid("audit.files", "must be 1 to 1000"));
        }
        if !(4096..=1 << 30).contains(&self.change_file_bytes) {
            return Err(invalid(
                "audit.change_file_bytes",
                "must be 4096 to 1073741824 (bytes)",
            ));
        }
        if !(1..=1000).contains(&self.change_files) {
            return Err(invalid("audit.change_files", "must be 1 to 1000"));
        }
        Ok(())
    }
}

impl HttpConfig {
    /// `[http]`: its address, limits, time limits and TLS files.
    pub fn validate(&self) -> Result<(), ConfigError> {
        parse_listen(&self.listen).map_err(|m| invalid("http.listen", m))?;
        if !self.path_prefix.is_empty() && !self.path_prefix.starts_with('/') {
            return Err(invalid("http.path_prefix", "must be empty or start with /"));
        }
        if self.max_connections == 0 {
            return Err(invalid("http.max_connections", "must be above 0"));
        }
        if self.threads > super::MAX_HTTP_THREADS {
            return Err(invalid(
                "http.threads",
                format!("must be 0 (one per core) to {}", super::MAX_HTTP_THREADS),
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(invalid("http.max_body_bytes", "must be above 0"));
        }
        for (key, value) in [
            ("http.header_read_timeout_ms", self.header_read_timeout_ms),
            ("http.keep_alive_timeout_ms", self.keep_alive_timeout_ms),
            ("http.body_timeout_ms", self.body_timeout_ms),
            ("http.body_idle_timeout_ms", self.body_idle_timeout_ms),
            ("http.write_timeout_ms", self.write_timeout_ms),
        ] {
            if !(1..=3_600_000).contains(&value) {
                return Err(invalid(key, "must be 1 to 3600000 (ms)"));
            }
        }
        for host in &self.allowed_hosts {
            if host != "*" {
                super::web_origin::check_host_pattern(host)
                    .map_err(|why| invalid("http.allowed_hosts", format!("{host:?} {why}")))?;
            }
        }
        for origin in &self.allowed_origins {
            if origin == "*" || origin == "null" {
                return Err(invalid(
                    "http.allowed_origins",
                    format!(
                        "{origin:?} would let any web page change the station: list each origin as scheme://host[:port]"
                    ),
                ));
            }
            super::web_origin::WebOrigin::parse(origin)
                .map_err(|why| invalid("http.allowed_origins", format!("{origin:?} {why}")))?;
        }
        if self.tls.enabled() {
            if self.tls.cert.is_empty() {
                return Err(invalid(
                    "http.tls.cert",
                    "give the certificate (PEM) as well as http.tls.key, or neither",
                ));
            }
            if self.tls.key.is_empty() {
                return Err(invalid(
                    "http.tls.key",
                    "give the private key (PEM) as well as http.tls.cert, or neither",
                ));
            }
        }
        Ok(())
    }
}

impl LegacyConfig {
    /// `[legacy]`: its address, allowed peers and limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for address in &self.allow {
            address.parse::<std::net::IpAddr>().map_err(|_| {
                invalid("legacy.allow", format!("{address:?} is not an IP address"))
            })?;
        }
        if self.max_clients == 0 {
            return Err(invalid("legacy.max_clients", "must be above 0"));
        }
        if self.idle_timeout_ms == 0 {
            return Err(invalid("legacy.idle_timeout_ms", "must be above 0"));
        }
        if !(1..=64).contains(&self.window) {
            return Err(invalid("legacy.window", "must be 1 to 64"));
        }
        if self.output_frames == 0 {
            return Err(invalid("legacy.output_frames", "must be above 0"));
        }
        if !self.listen.is_empty() {
            parse_listen(&self.listen).map_err(|m| invalid("legacy.listen", m))?;
        }
        Ok(())
    }
}

impl LeaseConfig {
    /// `[lease]`: the safe state's tolerance, the lock-delay, the backend's URL, the
    /// link-owner lease's times.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.safe_state_tolerance.is_finite() && self.safe_state_tolerance >= 0.0) {
            return Err(invalid(
                "lease.safe_state_tolerance",
                "must be a number at least 0 (how far a number read back may be from the safe state's)",
            ));
        }
        if self.lock_delay_ms.is_some_and(|ms| ms > 3_600_000) {
            return Err(invalid(
                "lease.lock_delay_ms",
                "must be at most 3600000 (1 h); 0 turns the lock-delay off",
            ));
        }
        station_lease::BackendUrl::parse(&self.backend)
            .map_err(|error| invalid("lease.backend", error.to_string()))?;
        if !(1_000..=600_000).contains(&self.link_owner_ttl_ms) {
            return Err(invalid(
                "lease.link_owner_ttl_ms",
                "must be 1000 to 600000 (renewals every third of it, each given a third, and a fifth kept in hand)",
            ));
        }
        for (key, value) in [
            ("lease.link_owner_renew_ms", self.link_owner_renew_ms),
            (
                "lease.link_owner_store_timeout_ms",
                self.link_owner_store_timeout_ms,
            ),
            ("lease.link_owner_margin_ms", self.link_owner_margin_ms),
        ] {
            if value.is_some_and(|ms| !(100..=600_000).contains(&ms)) {
                return Err(invalid(key, "must be 100 to 600000 (ms), or left out"));
            }
        }
        if self.link_owner_lock_delay_ms.is_some_and(|ms| ms > 600_000) {
            return Err(invalid(
                "lease.link_owner_lock_delay_ms",
                "must be 0 to 600000 (ms), or left out",
            ));
        }
        Ok(())
    }
}

impl HaConfig {
    /// `[ha]`: the address it advertises.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let advertised = &self.advertise_url;
        let is_http = advertised.starts_with("http://") || advertised.starts_with("https://");
        if !advertised.is_empty() && !is_http {
            return Err(invalid(
                "ha.advertise_url",
                "must be empty or an http:// or https:// address such as http://gw1.lab:5000",
            ));
        }
        Ok(())
    }
}

impl AccessConfig {
    /// `[access]`: its keys and users.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for key in &self.keys {
            if key.key.len() < 16 {
                return Err(invalid(
                    "access.keys",
                    "every key must be at least 16 characters (e.g. openssl rand -hex 24)",
                ));
            }
        }
        for (i, user) in self.users.iter().enumerate() {
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
        Ok(())
    }
}

impl StatusPageConfig {
    /// `[status_page]`: its refresh interval.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(100..=60_000).contains(&self.interval_ms) {
            return Err(invalid("status_page.interval_ms", "must be 100 to 60000"));
        }
        Ok(())
    }
}

impl ConfigFilesConfig {
    /// `[config_files]`: its directory and file size limit.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.dir.as_os_str().is_empty() {
            return Err(invalid("config_files.dir", "must name a directory"));
        }
        if !(1024..=1024 * 1024).contains(&self.max_file_bytes) {
            return Err(invalid(
                "config_files.max_file_bytes",
                "must be 1024 to 1048576 (the request body limit)",
            ));
        }
        Ok(())
    }
}

impl EventsConfig {
    /// `[events]`: queues, subscription lifetime and deadband ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.stream_queue == 0 {
            return Err(invalid("events.stream_queue", "must be above 0"));
        }
        if !(100..=3_600_000).contains(&self.subscription_ttl_ms) {
            return Err(invalid(
                "events.subscription_ttl_ms",
                "must be 100 to 3600000",
            ));
        }
        if self.resume_grace_ms > 3_600_000 {
            return Err(invalid("events.resume_grace_ms", "must be 0 to 3600000"));
        }
        if self.replay_events > 10_000 {
            return Err(invalid("events.replay_events", "must be 0 to 10000"));
        }
        for (pattern, [low, high]) in &self.ranges {
            if let Err(error) = globset::Glob::new(pattern) {
                return Err(invalid(
                    "events.ranges",
                    format!("{pattern:?} is not a name or glob pattern: {error}"),
                ));
            }
            if !(low.is_finite() && high.is_finite() && low != high) {
                return Err(invalid(
                    "events.ranges",
                    format!(
                        "the range of {pattern:?} must be two different numbers [low, high]; got [{low}, {high}]"
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl HistoryConfig {
    /// `[history]`: channels, interval, sizes and the archive.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let history = self;
        for pattern in &history.channels {
            if let Err(error) = globset::Glob::new(pattern) {
                return Err(invalid(
                    "history.channels",
                    format!("{pattern:?} is not a name or glob pattern: {error}"),
                ));
            }
        }
        if !(10..=3_600_000).contains(&history.interval_ms) {
            return Err(invalid("history.interval_ms", "must be 10 to 3600000"));
        }
        if !(1..=10_000_000).contains(&history.samples_per_channel) {
            return Err(invalid(
                "history.samples_per_channel",
                "must be 1 to 10000000",
            ));
        }
        if !(1..=100_000).contains(&history.max_channels) {
            return Err(invalid("history.max_channels", "must be 1 to 100000"));
        }
        if !(history.archive.is_empty()
            || history.archive.starts_with("postgres://")
            || history.archive.starts_with("postgresql://"))
        {
            return Err(invalid(
                "history.archive",
                "must be empty (memory only) or a postgres:// URL",
            ));
        }
        if !super::valid_table_name(&history.archive_table) {
            return Err(invalid(
                "history.archive_table",
                "must be a plain lower-case SQL name (a-z, 0-9, _; at most 40 characters)",
            ));
        }
        if !(1..=36_500).contains(&history.retention_days) {
            return Err(invalid("history.retention_days", "must be 1 to 36500"));
        }
        if !history.archive.is_empty() && history.spool.as_os_str().is_empty() {
            return Err(invalid(
                "history.spool",
                "must name a file while history.archive is set",
            ));
        }
        Ok(())
    }
}
