//! What serde cannot check of a config: ranges, addresses, URLs, each error naming its key.

use super::{Config, ConfigError, parse_listen};

impl Config {
    /// Checks what serde cannot: ranges, addresses, URLs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
            ConfigError::Invalid {
                key,
                message: message.into(),
            }
        }
        super::station_url::StationUrl::parse(&self.station.url)
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
        if !(4096..=1 << 30).contains(&self.audit.change_file_bytes) {
            return Err(invalid(
                "audit.change_file_bytes",
                "must be 4096 to 1073741824 (bytes)",
            ));
        }
        if !(1..=1000).contains(&self.audit.change_files) {
            return Err(invalid("audit.change_files", "must be 1 to 1000"));
        }
        if self.station.id.chars().count() > 200 || self.station.id.chars().any(char::is_control) {
            return Err(invalid(
                "station.id",
                "must be at most 200 characters, without control characters",
            ));
        }
        if !(1..=600_000).contains(&self.station.request_timeout_ms) {
            return Err(invalid("station.request_timeout_ms", "must be 1 to 600000"));
        }
        if let Some(ms) = self.station.max_processing_ms
            && !(self.station.request_timeout_ms..=3_600_000).contains(&ms)
        {
            return Err(invalid(
                "station.max_processing_ms",
                "must be at least station.request_timeout_ms and at most 3600000 (1 h)",
            ));
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
        if self.http.threads > super::MAX_HTTP_THREADS {
            return Err(invalid(
                "http.threads",
                format!("must be 0 (one per core) to {}", super::MAX_HTTP_THREADS),
            ));
        }
        if self.http.max_body_bytes == 0 {
            return Err(invalid("http.max_body_bytes", "must be above 0"));
        }
        for (key, value) in [
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            (
                "http.keep_alive_timeout_ms",
                self.http.keep_alive_timeout_ms,
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
        if !(self.lease.safe_state_tolerance.is_finite() && self.lease.safe_state_tolerance >= 0.0)
        {
            return Err(invalid(
                "lease.safe_state_tolerance",
                "must be a number at least 0 (how far a number read back may be from the safe state's)",
            ));
        }
        if self.lease.lock_delay_ms.is_some_and(|ms| ms > 3_600_000) {
            return Err(invalid(
                "lease.lock_delay_ms",
                "must be at most 3600000 (1 h); 0 turns the lock-delay off",
            ));
        }
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
        let advertised = &self.ha.advertise_url;
        let is_http = advertised.starts_with("http://") || advertised.starts_with("https://");
        if !advertised.is_empty() && !is_http {
            return Err(invalid(
                "ha.advertise_url",
                "must be empty or an http:// or https:// address such as http://gw1.lab:5000",
            ));
        }
        if !(1_000..=600_000).contains(&self.lease.link_owner_ttl_ms) {
            return Err(invalid(
                "lease.link_owner_ttl_ms",
                "must be 1000 to 600000 (renewals every third of it, each given a third, and a fifth kept in hand)",
            ));
        }
        for (key, value) in [
            ("lease.link_owner_renew_ms", self.lease.link_owner_renew_ms),
            (
                "lease.link_owner_store_timeout_ms",
                self.lease.link_owner_store_timeout_ms,
            ),
            (
                "lease.link_owner_margin_ms",
                self.lease.link_owner_margin_ms,
            ),
        ] {
            if value.is_some_and(|ms| !(100..=600_000).contains(&ms)) {
                return Err(invalid(key, "must be 100 to 600000 (ms), or left out"));
            }
        }
        if self
            .lease
            .link_owner_lock_delay_ms
            .is_some_and(|ms| ms > 600_000)
        {
            return Err(invalid(
                "lease.link_owner_lock_delay_ms",
                "must be 0 to 600000 (ms), or left out",
            ));
        }
        self.link_owner_timing()
            .check(self.max_processing())
            .map_err(|broken| invalid(broken.key, broken.message))?;
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
        for (pattern, [low, high]) in &self.events.ranges {
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
        let history = &self.history;
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
