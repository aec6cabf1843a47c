//! The HTTP front end of Station Gateway: the endpoint table and its handlers, the event
//! stream, a station as HTTP serves it ([`gateway::Gateway`]: the core's `StationRuntime` plus
//! events and credentials), every error's status ([`error`]), the lab's routing and the
//! transport. Below it is `station-core`, re-exported here under its module names
//! (`crate::link`, `crate::station`, …); beside it `station-legacy`; above it the
//! `station-gateway` crate (the server that starts everything, `main`).
//!
//! From the socket up: [`server`] is the transport (accept, connection limits in
//! [`connections`], idle deadlines in [`idle`], threads in [`threads`], HTTPS in [`tls`],
//! graceful shutdown), generic over what answers ([`server::Answer`]). The lab's service
//! ([`lab::routing`]) answers: what a browser may ask ([`browser`]), which station a path is
//! for ([`stations`], pure), the reserve of connections; then a station's request enters at
//! [`routes`] and the endpoint table and handlers in `api`, request bodies in [`body`], who a
//! request is in [`credentials`], answers shaped in `reply`; health, metrics and the status
//! page in [`ops`]; what of a path may be logged in [`redact`].
//!
//! Each connection is one task, on the thread `threads` picks: hyper's HTTP/1 connection when a
//! plain connection's first bytes leave the HTTP/2 preface, hyper-util's HTTP/1-or-2 one
//! otherwise and on TLS, half-closed clients answered (`half_close`). The header and keep-alive
//! timeouts are the connection's own idle deadline (`idle`), not a hyper timer per request, and
//! the task polls it and the shutdown token only when they woke it (`gated`). The TLS handshake
//! and the HTTP/1-or-2 connection are boxed, so a plain HTTP/1 connection's task is sized to
//! what it holds (2.4 KB, not 9.2 KB). The service's `Arc` is cloned once per connection into
//! its `Served`, which each request clones; a `TaskTracker` drains the connections on shutdown,
//! each closing gracefully on the shutdown token or once idle too long.

#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unused_qualifications)]

pub mod allow;
mod api;
mod api_version;
pub mod audit_trail;
pub mod body;
pub mod browser;
pub mod credentials;
pub mod error;
pub mod events;
pub mod gateway;
pub mod lab;
pub mod lease_endpoints;
pub mod logs;
pub mod named_leases;
pub mod netinfo;
pub mod openapi;
pub mod ops;
pub mod redact;
mod reply;
pub mod requests;
pub mod routes;
pub mod server;
pub mod stations;

pub use station_core::{
    Config, access_rules, audit, cache, config, config_files, gateway_runtime, history, lease,
    link, metrics, numeric, numtext, rules, runtime, station, timestamp,
};

pub use api::LeaseNeed;
pub use reply::{Body, error_response, json_bytes_response, json_response};
pub use server::{
    Answer, ConnectionInfo, HttpListener, Peers, ServeLimits, Shutdown, connections, idle,
    peer_end, serve, threads, tls,
};
