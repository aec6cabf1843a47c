//! How the link task connects and paces its work: [`LinkSettings`].

use std::time::Duration;

use crate::config::station_url::StationUrl;

/// How the link task connects and paces its work.
#[derive(Debug, Clone)]
pub struct LinkSettings {
    pub url: StationUrl,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    pub max_names_per_read: usize,
    /// How long a burst of reads of one channel is gathered: until no new reader came for
    /// `coalesce_quiet`, at most `coalesce_max` after the first was held.
    pub coalesce_quiet: Duration,
    pub coalesce_max: Duration,
    pub queue_depth: usize,
    /// Sent in HELLO, for the station's log.
    pub client_name: String,
}
