//! The counters kept by the HTTP entry and the legacy listener: requests by endpoint and
//! status with their latency, timeouts, refusals, and the lease's changes of hands.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::comm::CommMetrics;
use super::instruments::{Counter, Gauge, Histogram, PREFIX, header};

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

    pub(super) fn render(&self, out: &mut String) {
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
    /// Read backs of the safe state that found a late change over it (applied again).
    pub safe_state_overridden: Counter,
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

/// The counters of the HTTP connections, the whole gateway's: every station's [`Metrics`]
/// shares them, so each station's exposition shows them alike.
#[derive(Debug, Default, Clone)]
pub struct ConnectionCounters {
    pub timeouts: Arc<HttpTimeouts>,
    pub refused: Arc<HttpRefusals>,
    /// Idle HTTP connections closed to make room for a new one at the connection limit.
    pub evicted: Arc<Counter>,
    /// Requests to the lab's own paths refused by access control.
    pub lab_access_refused: Arc<AccessRefusals>,
}

/// Requests refused by access control: 401 (no or wrong credentials) and 403 (a role too low).
#[derive(Debug, Default)]
pub struct AccessRefusals {
    pub unauthenticated: Counter,
    pub forbidden: Counter,
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
    /// The gateway's connection counters ([`ConnectionCounters`]), shared by every station.
    pub http_timeouts: Arc<HttpTimeouts>,
    pub http_connections_refused: Arc<HttpRefusals>,
    /// Idle HTTP connections closed to make room for a new one at the connection limit.
    pub http_connections_evicted: Arc<Counter>,
    /// Requests to the lab's own paths (`/v1/stations`, its page, stream, metrics and safe
    /// stop) refused by access control: the whole gateway's, shared like the connections'.
    pub lab_access_refused: Arc<AccessRefusals>,
    pub legacy_clients: Gauge,
    pub legacy_connections: Counter,
    pub legacy_refused: Counter,
    /// Bus transactions (`api/comm/*`).
    pub comm: CommMetrics,
}

impl Metrics {
    /// A station's counters, with connection counters of its own (a gateway of one station).
    pub fn new(endpoint_labels: Vec<&'static str>) -> Metrics {
        Metrics::sharing(endpoint_labels, &ConnectionCounters::default())
    }

    /// A station's counters, sharing the gateway's `connections`.
    pub fn sharing(
        endpoint_labels: Vec<&'static str>,
        connections: &ConnectionCounters,
    ) -> Metrics {
        Metrics {
            http: HttpMetrics::new(endpoint_labels),
            lease_refused_locked: Counter::default(),
            lease_refused_held: Counter::default(),
            access_unauthenticated: Counter::default(),
            access_forbidden: Counter::default(),
            http_timeouts: connections.timeouts.clone(),
            http_connections_refused: connections.refused.clone(),
            http_connections_evicted: connections.evicted.clone(),
            lab_access_refused: connections.lab_access_refused.clone(),
            legacy_clients: Gauge::default(),
            legacy_connections: Counter::default(),
            legacy_refused: Counter::default(),
            comm: CommMetrics::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
