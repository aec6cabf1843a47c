//! The exposition: everything a scrape of `GET /metrics` shows, gathered from wherever it is
//! kept, in the Prometheus text format.

use std::fmt::Write as _;
use std::time::Duration;

use super::instruments::{Histogram, PREFIX, header, single};
use super::registry::{LeaseCounters, Metrics};

/// The station link's counters at scrape time, read from its `LinkStats` by the caller.
#[derive(Debug)]
pub struct LinkCounts<'a> {
    pub frames_sent: u64,
    pub read_frames: u64,
    pub names_read: u64,
    pub timeouts: u64,
    pub crc_errors: u64,
    pub reconnects: u64,
    pub refused_by_guard: u64,
    /// Time from sending a request frame to its answer.
    pub latency: &'a Histogram,
}

/// The value history's counters at scrape time (`[history]`; absent while it is off).
#[derive(Debug, Clone, Copy, Default)]
pub struct HistoryCounts {
    pub recorded: u64,
    pub archived: u64,
    pub spooled: u64,
    pub dropped: u64,
    pub over_limit: u64,
    pub channels: usize,
    pub memory_bytes: usize,
    /// Whether an archive is configured (the lag means nothing without one).
    pub archive: bool,
    /// How far the archive's confirmed writes are behind the newest sample handed to it.
    pub archive_lag: Duration,
}

/// Everything a scrape shows, gathered from wherever it is kept.
pub struct Snapshot<'a> {
    pub metrics: &'a Metrics,
    pub link: LinkCounts<'a>,
    pub link_connected: bool,
    pub link_generation: u64,
    pub link_queue_depth: usize,
    pub cache: (u64, u64),
    pub cache_entries: usize,
    pub lease_held: bool,
    pub safe_state_pending: bool,
    /// A standby: another gateway owns the station (`[ha] mode = "standby"`, not yet taken over).
    pub standby: bool,
    pub lease: &'a LeaseCounters,
    pub event_streams: usize,
    pub subscriptions: usize,
    pub history: Option<HistoryCounts>,
    pub uptime: Duration,
    /// The access rules' version in force (0: no rules file).
    pub access_rules_version: u64,
    /// Refusals by the access rules, per rule name.
    pub access_rule_refusals: Vec<(String, u64)>,
}

impl Snapshot<'_> {
    /// The Prometheus text exposition (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let m = self.metrics;
        let _ = writeln!(
            out,
            "# HELP {PREFIX}build_info The gateway's version.\n# TYPE {PREFIX}build_info gauge\n{PREFIX}build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        single(
            &mut out,
            "uptime_seconds",
            "gauge",
            "Seconds since the gateway started.",
            self.uptime.as_secs_f64(),
        );
        m.http.render(&mut out);
        m.comm.render(&mut out);
        header(
            &mut out,
            "access_refused_total",
            "counter",
            "Requests refused by access control: 401 (no or wrong credentials), 403 (role too low).",
        );
        let _ = writeln!(
            out,
            "{PREFIX}access_refused_total{{status=\"401\"}} {}\n{PREFIX}access_refused_total{{status=\"403\"}} {}",
            m.access_unauthenticated.get(),
            m.access_forbidden.get()
        );
        single(
            &mut out,
            "access_rules_version",
            "gauge",
            "The version of the access rules in force (0: no rules file); each reload adds one.",
            self.access_rules_version as f64,
        );
        header(
            &mut out,
            "access_rule_refusals_total",
            "counter",
            "Requests and changes refused by the access rules, by the rule that refused them.",
        );
        for (rule, count) in &self.access_rule_refusals {
            let rule = rule.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                out,
                "{PREFIX}access_rule_refusals_total{{rule=\"{rule}\"}} {count}"
            );
        }
        header(
            &mut out,
            "http_timeouts_total",
            "counter",
            "HTTP requests and connections cut by a timeout, by stage: headers, body, write.",
        );
        let t = &m.http_timeouts;
        for (stage, counter) in [
            ("headers", &t.headers),
            ("body", &t.body),
            ("write", &t.write),
        ] {
            let _ = writeln!(
                out,
                "{PREFIX}http_timeouts_total{{stage=\"{stage}\"}} {}",
                counter.get()
            );
        }
        header(
            &mut out,
            "http_connections_refused_total",
            "counter",
            "HTTP connections closed at accept (per_ip: the address held its share) and requests answered 503 on a reserved connection (reserve_only).",
        );
        let r = &m.http_connections_refused;
        for (reason, counter) in [("per_ip", &r.per_ip), ("reserve_only", &r.reserve_only)] {
            let _ = writeln!(
                out,
                "{PREFIX}http_connections_refused_total{{reason=\"{reason}\"}} {}",
                counter.get()
            );
        }
        single(
            &mut out,
            "http_connections_evicted_total",
            "counter",
            "Idle HTTP connections (no request in progress) closed to make room for a new one at the connection limit.",
            m.http_connections_evicted.get(),
        );
        header(
            &mut out,
            "lab_access_refused_total",
            "counter",
            "Requests to the lab's own paths (the station list, its page, stream, metrics and safe stop) refused by access control: 401, 403.",
        );
        let _ = writeln!(
            out,
            "{PREFIX}lab_access_refused_total{{status=\"401\"}} {}\n{PREFIX}lab_access_refused_total{{status=\"403\"}} {}",
            m.lab_access_refused.unauthenticated.get(),
            m.lab_access_refused.forbidden.get()
        );

        let link = &self.link;
        single(
            &mut out,
            "link_connected",
            "gauge",
            "1 while the station link is up.",
            u8::from(self.link_connected),
        );
        single(
            &mut out,
            "link_generation",
            "gauge",
            "Connections made to the station so far (goes up at every reconnect).",
            self.link_generation,
        );
        single(
            &mut out,
            "link_requests_total",
            "counter",
            "Request frames sent to the station.",
            link.frames_sent,
        );
        single(
            &mut out,
            "link_read_frames_total",
            "counter",
            "READ frames sent to the station (each may carry many names).",
            link.read_frames,
        );
        single(
            &mut out,
            "link_names_read_total",
            "counter",
            "Channel names read from the station.",
            link.names_read,
        );
        header(
            &mut out,
            "link_request_duration_seconds",
            "histogram",
            "Time from sending a request frame to the station's answer.",
        );
        link.latency.render(
            &mut out,
            &format!("{PREFIX}link_request_duration_seconds"),
            "",
        );
        single(
            &mut out,
            "link_timeouts_total",
            "counter",
            "Requests the station did not answer in time.",
            link.timeouts,
        );
        single(
            &mut out,
            "link_crc_errors_total",
            "counter",
            "Corrupt frames from the station (bad CRC or header), dropped by the codec.",
            link.crc_errors,
        );
        single(
            &mut out,
            "link_reconnects_total",
            "counter",
            "Reconnections to the station after the first connection.",
            link.reconnects,
        );
        single(
            &mut out,
            "link_refused_by_guard_total",
            "counter",
            "Changes refused at the link because the lease moved on before they were sent.",
            link.refused_by_guard,
        );
        single(
            &mut out,
            "link_queue_depth",
            "gauge",
            "Requests waiting for the link task to take them.",
            self.link_queue_depth,
        );

        single(
            &mut out,
            "cache_hits_total",
            "counter",
            "Reads with a maximum age served from the value cache.",
            self.cache.0,
        );
        single(
            &mut out,
            "cache_misses_total",
            "counter",
            "Reads with a maximum age that had to go to the station.",
            self.cache.1,
        );
        single(
            &mut out,
            "cache_entries",
            "gauge",
            "Channels in the value cache.",
            self.cache_entries,
        );

        single(
            &mut out,
            "lease_held",
            "gauge",
            "1 while someone holds the control lease.",
            u8::from(self.lease_held),
        );
        header(
            &mut out,
            "lease_transitions_total",
            "counter",
            "Changes of hands of the control lease, by kind.",
        );
        for (kind, counter) in [
            ("taken", &self.lease.taken),
            ("released", &self.lease.released),
            ("expired", &self.lease.expired),
            ("broken", &self.lease.broken),
        ] {
            let _ = writeln!(
                out,
                "{PREFIX}lease_transitions_total{{kind=\"{kind}\"}} {}",
                counter.get()
            );
        }
        header(
            &mut out,
            "lease_safe_state_tries_total",
            "counter",
            "Tries of the safe state after a lease ran out unreleased, by outcome (applied: the station confirmed every write).",
        );
        let _ = writeln!(
            out,
            "{PREFIX}lease_safe_state_tries_total{{outcome=\"applied\"}} {}\n{PREFIX}lease_safe_state_tries_total{{outcome=\"failed\"}} {}",
            self.lease.safe_state_applied.get(),
            self.lease.safe_state_failed.get()
        );
        single(
            &mut out,
            "lease_safe_state_overridden_total",
            "counter",
            "Read backs of the safe state that found a channel otherwise than the safe state wants (a late change overrode it; it is applied again).",
            self.lease.safe_state_overridden.get(),
        );
        single(
            &mut out,
            "lease_safe_state_pending",
            "gauge",
            "1 while a safe state is owed and not yet done: written, confirmed by the station and read back right twice (no change and no new lease meanwhile).",
            u8::from(self.safe_state_pending),
        );
        single(
            &mut out,
            "standby",
            "gauge",
            "1 while this gateway stands by (another gateway owns the station; it takes over once that one's link-owner lease lapses).",
            u8::from(self.standby),
        );
        header(
            &mut out,
            "lease_refused_total",
            "counter",
            "Requests refused by the control lease: 423 (changes and forced reads of a non-holder), 409 (POST lease while held).",
        );
        let _ = writeln!(
            out,
            "{PREFIX}lease_refused_total{{status=\"423\"}} {}\n{PREFIX}lease_refused_total{{status=\"409\"}} {}",
            m.lease_refused_locked.get(),
            m.lease_refused_held.get()
        );

        single(
            &mut out,
            "event_streams",
            "gauge",
            "Open event streams (GET api/events).",
            self.event_streams,
        );
        single(
            &mut out,
            "subscriptions",
            "gauge",
            "Live value subscriptions.",
            self.subscriptions,
        );

        if let Some(history) = &self.history {
            history.render(&mut out);
        }

        single(
            &mut out,
            "legacy_clients",
            "gauge",
            "Legacy byte-protocol clients connected now.",
            m.legacy_clients.get(),
        );
        single(
            &mut out,
            "legacy_connections_total",
            "counter",
            "Legacy byte-protocol clients accepted.",
            m.legacy_connections.get(),
        );
        single(
            &mut out,
            "legacy_refused_total",
            "counter",
            "Legacy byte-protocol clients refused (not on legacy.allow, or too many).",
            m.legacy_refused.get(),
        );
        out
    }
}

impl HistoryCounts {
    fn render(&self, out: &mut String) {
        for (name, kind, help, value) in [
            (
                "history_samples_recorded_total",
                "counter",
                "Samples the value history kept in memory.",
                self.recorded as f64,
            ),
            (
                "history_samples_archived_total",
                "counter",
                "Samples the archive confirmed written.",
                self.archived as f64,
            ),
            (
                "history_samples_spooled_total",
                "counter",
                "Samples written to the local spool while the archive was unreachable.",
                self.spooled as f64,
            ),
            (
                "history_samples_dropped_total",
                "counter",
                "Samples lost to the archive because its queue was full (should stay 0).",
                self.dropped as f64,
            ),
            (
                "history_samples_over_limit_total",
                "counter",
                "Samples of channels past history.max_channels, not kept.",
                self.over_limit as f64,
            ),
            (
                "history_channels",
                "gauge",
                "Channels with samples in memory.",
                self.channels as f64,
            ),
            (
                "history_memory_bytes",
                "gauge",
                "Bytes the value history's rings hold.",
                self.memory_bytes as f64,
            ),
        ] {
            single(out, name, kind, help, value);
        }
        if self.archive {
            single(
                out,
                "history_archive_lag_seconds",
                "gauge",
                "How far the archive's confirmed writes are behind the newest sample handed to it.",
                self.archive_lag.as_secs_f64(),
            );
        }
    }
}
