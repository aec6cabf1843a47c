//! The gateway's metrics: counters, gauges and fixed-bucket histograms on atomics, and their
//! exposition in the Prometheus text format (`GET /metrics`).
//!
//! Written here rather than taken from a crate because every label set is known up front
//! (routes × statuses), so an observation is an array index and a relaxed `fetch_add`: no
//! hashing, no lock, no allocation on the request path.

mod comm;
mod exposition;
mod instruments;
mod registry;

pub use comm::{BusKind, CommMetrics};
pub use exposition::{HistoryCounts, LinkCounts, Snapshot};
pub use instruments::{Counter, Gauge, Histogram, LATENCY_BUCKETS, PREFIX, single};
pub use registry::{HttpMetrics, HttpRefusals, HttpTimeouts, LeaseCounters, Metrics, STATUSES};
