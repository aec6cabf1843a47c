//! Station Gateway: the one way to a high-voltage test station.
//!
//! It owns the one connection to the station and serves everyone else from it: REST clients,
//! event-stream readers and legacy byte-protocol tools. See `ARCHITECTURE.md` for the tasks,
//! the channels between them and who owns what.
//!
//! # Layout
//!
//! A request goes front end → endpoint table → station service → link. The crates, each only
//! below the next, the compiler keeping them so:
//!
//! - `station-core` (`core/`): the station service and everything below it (link, cache,
//!   control lease, change runner, access rules, audit, config sections), and
//!   `runtime::StationRuntime`, which assembles, starts and stops one station; no HTTP.
//! - the front ends, side by side on the core: `station-http` (`http/`: the endpoint table and
//!   handlers, the event stream, every error's status, the accept loop) and `station-legacy`
//!   (`legacy/`: the byte-protocol listener), which does not depend on HTTP.
//! - this crate: `server` ([`start`] and [`run`] start each station's runtime, put the front
//!   ends on it and stop them in order) and `main.rs`.
//!
//! The core's and HTTP's modules are re-exported here under their names
//! (`station_gateway::link`, `station_gateway::http::routes`, `crate::events`), so no path a
//! test or a tool uses moved. No circle of more than two top-level modules in any crate:
//! `scripts/module_cycles.py --max 2` in CI.

#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unused_qualifications)]

#[cfg(test)]
mod error_vocabulary;
mod server;

pub use station_http as http;
pub use station_http::{
    Config, access_rules, audit, config, config_files, credentials, error, events, gateway,
    gateway_runtime, history, lease, link, logs, metrics, numeric, rules, runtime, station,
    timestamp,
};

pub use server::{
    BindError, GatewayHandle, LabListeners, Listener, Listeners, StartError, run, run_lab, start,
    start_lab,
};
