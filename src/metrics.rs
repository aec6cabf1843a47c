//! The gateway's metrics: counters, gauges and fixed-bucket histograms on atomics, and their
//! exposition in the Prometheus text format (`GET /metrics`).
//!
//! Written here rather than taken from a crate because every label set is known up front
//! (routes × statuses), so an observation is an array index and a relaxed `fetch_add`: no
//! hashing, no lock, no allocation on the request path.

mod comm;

pub use comm::{BusKind, CommMetrics};

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// A number that only goes up.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A number that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds of the latency buckets, in seconds; `+Inf` is implied.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The same bounds in nanoseconds, for comparing without floating point.
const BUCKET_NANOS: [u64; 14] = {
    let mut nanos = [0u64; 14];
    let mut i = 0;
    while i < 14 {
        nanos[i] = (LATENCY_BUCKETS[i] * 1e9) as u64;
        i += 1;
    }
    nanos
};

/// A latency histogram with the fixed [`LATENCY_BUCKETS`]. Buckets are stored per interval
/// and summed up at exposition, so one observation is two `fetch_add`s.
#[derive(Debug, Default)]
pub struct Histogram {
    /// One per bound, then `+Inf`.
    buckets: [AtomicU64; 15],
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let index = BUCKET_NANOS.partition_point(|&bound| bound < nanos);
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The mean of every observation so far, if any.
    pub fn mean(&self) -> Option<Duration> {
        let count = self.count();
        (count > 0).then(|| Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed) / count))
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Writes `NAME_bucket`, `NAME_sum` and `NAME_count` with `labels` (`a="b",` or empty).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0u64;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            match LATENCY_BUCKETS.get(i) {
                Some(bound) => {
                    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let labels = labels.trim_end_matches(',');
        let braces = |labels: &str| {
            if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {cumulative}", braces(labels));
    }
}

/// Statuses counted under their own label; anything else is counted as `other`.
pub const STATUSES: [u16; 17] = [
    200, 400, 401, 403, 404, 405, 409, 413, 423, 429, 500, 501, 502, 503, 504, 101, 304,
];

/// Requests to one endpoint: by status, and their latency.
#[derive(Debug, Default)]
struct EndpointMetrics {
    /// One per [`STATUSES`] entry, then `other`.
    by_status: [Counter; STATUSES.len() + 1],
    latency: Histogram,
}

/// HTTP requests by endpoint and status, with a latency histogram per endpoint.
#[derive(Debug)]
pub struct HttpMetrics {
    labels: Vec<&'static str>,
    endpoints: Vec<EndpointMetrics>,
}

impl HttpMetrics {
    /// One slot per label, in order; the slot index is what [`HttpMetrics::record`] takes.
    pub fn new(labels: Vec<&'static str>) -> HttpMetrics {
        let endpoints = labels.iter().map(|_| EndpointMetrics::default()).collect();
        HttpMetrics { labels, endpoints }
    }

    /// The slot of `label`, if there is one (slow: for set-up and tests, not per request).
    pub fn slot_of(&self, label: &str) -> Option<usize> {
        self.labels.iter().position(|l| *l == label)
    }

    /// Counts one answered request. An unknown slot counts as the first one (`unmatched`).
    pub fn record(&self, slot: usize, status: u16, elapsed: Duration) {
        let Some(endpoint) = self.endpoints.get(slot).or(self.endpoints.first()) else {
            return;
        };
        let index = STATUSES
            .iter()
            .position(|&s| s == status)
            .unwrap_or(STATUSES.len());
        endpoint.by_status[index].inc();
        endpoint.latency.observe(elapsed);
    }

    /// Requests counted for `label` with `status` (for tests).
    pub fn requests(&self, label: &str, status: u16) -> u64 {
        let Some(slot) = self.slot_of(label) else {
            return 0;
        };
        STATUSES
            .iter()
            .position(|&s| s == status)
            .map_or(0, |i| self.endpoints[slot].by_status[i].get())
    }

    fn render(&self, out: &mut String) {
        header(
            out,
            "http_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
        );
        for (label, endpoint) in self.labels.iter().zip(&self.endpoints) {
            for (i, counter) in endpoint.by_status.iter().enumerate() {
                let count = counter.get();
                if count == 0 {
                    continue;
                }
                let status = STATUSES
                    .get(i)
                    .map_or_else(|| "other".to_owned(), u16::to_string);
                let _ = writeln!(
                    out,
                    "{PREFIX}http_requests_total{{route=\"{label}\",status=\"{status}\"}} {count}"
                );
            }
        }
        header(
            out,
            "http_request_duration_seconds",
            "histogram",
            "Time from a request's arrival to its answer (headers; event streams stay open longer), by route.",
        );
        for (label, endpoint) in self.labels.iter().zip(&self.endpoints) {
            if endpoint.latency.count() == 0 {
                continue;
            }
            endpoint.latency.render(
                out,
                &format!("{PREFIX}http_request_duration_seconds"),
                &format!("route=\"{label}\","),
            );
        }
    }
}

/// Counters of the control lease's changes of hands, kept by the lease itself.
#[derive(Debug, Default)]
pub struct LeaseCounters {
    pub taken: Counter,
    pub released: Counter,
    pub expired: Counter,
    pub broken: Counter,
    /// Tries of the safe state after a lease ran out: confirmed by the station, or not.
    pub safe_state_applied: Counter,
    pub safe_state_failed: Counter,
}

/// HTTP requests and connections cut by a timeout, by the stage they were in.
#[derive(Debug, Default)]
pub struct HttpTimeouts {
    /// The request headers (or the TLS handshake, or the first byte) did not come in time.
    pub headers: Counter,
    /// The request body did not come in time (408 where the client can still take it).
    pub body: Counter,
    /// An answer's write made no progress in time: the client stopped reading.
    pub write: Counter,
}

/// HTTP connections turned away at accept or served only in part, by why.
#[derive(Debug, Default)]
pub struct HttpRefusals {
    /// Closed at once: the client's address already held its share of connections.
    pub per_ip: Counter,
    /// Answered 503 on a connection from the reserve: only health checks and lease renewal
    /// and release are served there.
    pub reserve_only: Counter,
}

/// Counters kept by the HTTP entry and the legacy listener; the link, the cache, the lease and
/// the event registry keep their own and are read at exposition.
#[derive(Debug)]
pub struct Metrics {
    pub http: HttpMetrics,
    /// Requests refused by the lease: 423 (someone else holds it) and 409 (`POST lease` while
    /// someone else holds it).
    pub lease_refused_locked: Counter,
    pub lease_refused_held: Counter,
    /// Requests refused by access control: 401 and 403.
    pub access_unauthenticated: Counter,
    pub access_forbidden: Counter,
    pub http_timeouts: HttpTimeouts,
    pub http_connections_refused: HttpRefusals,
    pub legacy_clients: Gauge,
    pub legacy_connections: Counter,
    pub legacy_refused: Counter,
    /// Bus transactions (`api/comm/*`).
    pub comm: CommMetrics,
}

impl Metrics {
    pub fn new(endpoint_labels: Vec<&'static str>) -> Metrics {
        Metrics {
            http: HttpMetrics::new(endpoint_labels),
            lease_refused_locked: Counter::default(),
            lease_refused_held: Counter::default(),
            access_unauthenticated: Counter::default(),
            access_forbidden: Counter::default(),
            http_timeouts: HttpTimeouts::default(),
            http_connections_refused: HttpRefusals::default(),
            legacy_clients: Gauge::default(),
            legacy_connections: Counter::default(),
            legacy_refused: Counter::default(),
            comm: CommMetrics::default(),
        }
    }
}

/// Every metric name starts with this.
pub const PREFIX: &str = "station_gateway_";

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {PREFIX}{name} {help}");
    let _ = writeln!(out, "# TYPE {PREFIX}{name} {kind}");
}

/// Writes one metric without labels, with its HELP and TYPE lines.
pub fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{PREFIX}{name} {value}");
}

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
    pub lease: &'a LeaseCounters,
    pub event_streams: usize,
    pub subscriptions: usize,
    pub uptime: Duration,
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
            "lease_safe_state_pending",
            "gauge",
            "1 while a safe state is owed and not yet confirmed by the station (no change and no new lease meanwhile).",
            u8::from(self.safe_state_pending),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_puts_each_observation_in_the_first_bucket_that_holds_it() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(100));
        histogram.observe(Duration::from_micros(250));
        histogram.observe(Duration::from_millis(3));
        histogram.observe(Duration::from_secs(60));
        let mut out = String::new();
        histogram.render(&mut out, "h", "");
        assert!(out.contains("h_bucket{le=\"0.00025\"} 2\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"0.005\"} 3\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"5\"} 3\n"), "{out}");
        assert!(out.contains("h_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("h_count 4\n"), "{out}");
        assert!(out.contains("h_sum 60.00335\n"), "{out}");
    }

    #[test]
    fn requests_are_counted_by_endpoint_and_status() {
        let http = HttpMetrics::new(vec!["unmatched", "a", "b"]);
        http.record(1, 200, Duration::from_millis(1));
        http.record(1, 200, Duration::from_millis(1));
        http.record(2, 418, Duration::from_millis(1));
        http.record(99, 404, Duration::from_millis(1));
        assert_eq!(http.requests("a", 200), 2);
        assert_eq!(http.requests("unmatched", 404), 1);
        let mut out = String::new();
        http.render(&mut out);
        assert!(
            out.contains("station_gateway_http_requests_total{route=\"a\",status=\"200\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("station_gateway_http_requests_total{route=\"b\",status=\"other\"} 1"),
            "{out}"
        );
        assert!(
            out.contains(
                "station_gateway_http_request_duration_seconds_bucket{route=\"a\",le=\"0.001\"} 2"
            ),
            "{out}"
        );
    }
}
