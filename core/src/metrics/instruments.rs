//! The instruments: counters, gauges and fixed-bucket latency histograms on atomics, and the
//! Prometheus text format's HELP and TYPE lines they are written with.

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
    pub(super) fn render(&self, out: &mut String, name: &str, labels: &str) {
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

/// Every metric name starts with this.
pub const PREFIX: &str = "station_gateway_";

pub(super) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {PREFIX}{name} {help}");
    let _ = writeln!(out, "# TYPE {PREFIX}{name} {kind}");
}

/// Writes one metric without labels, with its HELP and TYPE lines.
pub fn single(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{PREFIX}{name} {value}");
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
}
