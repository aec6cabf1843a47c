//! Station Gateway: the one way to a high-voltage test station.
//!
//! It owns the one connection to the station and serves everyone else from it: REST clients,
//! event-stream readers and legacy byte-protocol tools. See `ARCHITECTURE.md` for the tasks,
//! the channels between them and who owns what.
//!
//! # Layout
//!
//! A request goes front end → endpoint table → station service → link. The station service and
//! everything below it are the `station-core` crate (no HTTP), re-exported here under the same
//! names (`station_gateway::link`, `crate::station`, …); this crate holds the front ends and the
//! server:
//!
//! - `server`: [`start`] and [`run`] build the shared state, spawn every task and
//!   stop them; [`gateway`] is that shared state ([`gateway::Gateway`]).
//! - Front ends, which only translate their wire format: [`http`] (the accept loop,
//!   `http/routes.rs` as the request entry, the endpoint table and its handlers by area in
//!   `http/api/`, operations endpoints, the control lease's and named leases' endpoints),
//!   [`credentials`] (who a request is: API keys and Basic users), `legacy` (the byte-protocol
//!   listener) and [`events`] (the event stream, the subscription scheduler and the relay of
//!   link and lease events).
//! - [`error`]: every layer's error given its HTTP status, legacy code and audit outcome;
//!   beside `http` (its `ApiError` carries the methods a path allows).
//! - `api` (the API version), [`logs`] and `netinfo` (the host's interfaces, read from the OS).
//!
//! No circle of more than two top-level modules in either crate: `scripts/module_cycles.py
//! --max 2` in CI.

#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unused_qualifications)]

mod api;
pub mod credentials;
pub mod error;
pub mod events;
pub mod gateway;
pub mod http;
mod legacy;
pub mod logs;
mod netinfo;
mod server;

use station_core::numtext;
pub use station_core::{
    Config, access_rules, audit, config, config_files, gateway_runtime, history, lease, link,
    metrics, numeric, rules, station, timestamp,
};

pub use server::{BindError, GatewayHandle, Listener, Listeners, StartError, run, start};
