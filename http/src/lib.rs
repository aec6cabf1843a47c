//! The HTTP front end of Station Gateway: the endpoint table and its handlers, the event
//! stream, the shared state the front ends serve from ([`gateway::Gateway`]), every error's
//! status ([`error`]), and the accept loop with graceful shutdown. Below it is `station-core`,
//! re-exported here under its module names (`crate::link`, `crate::station`, …); above it the
//! `station-gateway` crate (the server that starts everything, the legacy listener, `main`).
//!
//! Every request enters at [`routes`]; the endpoint table and its handlers are in `api`;
//! answers are shaped in `reply`; request bodies in [`body`]; who a request is in
//! [`credentials`]; what a browser may ask (known host names, no changes from other sites,
//! CORS) in [`browser`]; health, metrics and the status page in [`ops`]; HTTPS in [`tls`];
//! connection limits and the write timeout in [`connections`], whether a connection is idle in [`idle`]; what of a path
//! may be logged in [`redact`]; which thread serves a connection in [`threads`]; which station a
//! path is for, in a gateway of several, in [`stations`].
//!
//! Each connection is one task, on the thread `threads` picks: hyper's HTTP/1 connection when a
//! plain connection's first bytes leave the HTTP/2 preface, hyper-util's HTTP/1-or-2 one
//! otherwise and on TLS, half-closed clients answered (`half_close`). The header and keep-alive
//! timeouts are the connection's own idle deadline (`idle`), not a hyper timer per request, and
//! the task polls it and the shutdown token only when they woke it (`gated`). The TLS handshake
//! and the HTTP/1-or-2 connection are boxed, so a plain HTTP/1 connection's task is sized to
//! what it holds (2.4 KB, not 9.2 KB). The gateway's `Arc` is cloned once per connection into
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
pub mod connections;
pub mod credentials;
pub mod error;
pub mod events;
mod gated;
pub mod gateway;
pub mod idle;
pub mod lab;
pub mod lease_endpoints;
pub mod logs;
pub mod named_leases;
pub mod netinfo;
pub mod openapi;
pub mod ops;
pub mod peer_end;
pub mod redact;
mod reply;
pub mod requests;
pub mod routes;
mod serve;
pub mod stations;
pub mod threads;
pub mod tls;

pub use station_core::{
    Config, access_rules, audit, cache, config, config_files, gateway_runtime, history, lease,
    link, metrics, numeric, numtext, rules, station, timestamp,
};

pub use api::LeaseNeed;
pub use reply::{Body, error_response, json_bytes_response, json_response};
pub use serve::{HttpService, ServeLimits, Shutdown, serve};
