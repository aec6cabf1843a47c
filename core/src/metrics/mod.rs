//! The gateway's metrics: counters, gauges and fixed-bucket histograms on atomics, and their
//! exposition in the Prometheus text format (`GET /metrics`).
//!
//! Written here rather than taken from a crate because every label set is known up front
//! (routes × statuses), so an observation is an array index and a relaxed `fetch_add`: no
//! hashing, no lock, no allocation on the request path.
//!
//! Each is bumped where its concern lives: the HTTP request entry (`http::ops::finish`: route,
//! status, latency), the link task (`LinkStats`), the value cache (hits and misses), the control
//! lease (`LeaseCounters`), the legacy listener and the value history (`HistoryCounters`);
//! gauges (queue depth, streams, subscriptions, lease held) are computed at scrape time.
//!
//! A gateway serving several stations renders each station's exposition as one gateway's and
//! merges them into one, every sample labelled with its station ([`lab::merge_expositions`]).

mod comm;
mod exposition;
mod instruments;
pub mod lab;
mod registry;

pub use comm::{BusKind, CommMetrics};
pub use exposition::{HistoryCounts, LinkCounts, Snapshot};
pub use instruments::{Counter, Gauge, Histogram, LATENCY_BUCKETS, PREFIX, single};
pub use registry::{
    AccessRefusals, ConnectionCounters, HttpMetrics, HttpRefusals, HttpTimeouts, LeaseCounters,
    Metrics, STATUSES,
};
