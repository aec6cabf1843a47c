//! Station Gateway: the one way to a high-voltage test station.
//!
//! It owns the one connection to the station and serves everyone else from it: REST clients,
//! event-stream readers and legacy byte-protocol tools. See `ARCHITECTURE.md` for the tasks,
//! the channels between them and who owns what.
//!
//! # Layout
//!
//! A request goes front end → endpoint table → station service → link:
//!
//! - `server`: [`start`] and [`run`] build the shared state, spawn every task and
//!   stop them; [`gateway`] is that shared state ([`gateway::Gateway`]);
//!   [`gateway_runtime`] is where work that must finish is spawned from a request.
//! - Front ends, which only translate their wire format: [`http`] (the accept loop,
//!   `http/routes.rs` as the request entry, the endpoint table and its handlers by area in
//!   `http/api/`, operations endpoints, the control lease's and named leases' endpoints),
//!   [`credentials`] (who a request is: API keys and Basic users), `legacy` (the byte-protocol listener) and `events` (the event stream, the
//!   subscription scheduler and the relay of link and lease events).
//! - `station`: the station service every front end goes through: the cache-or-hardware
//!   decision by a `ReadPolicy`, the consuming-channel rule, "station not reached", ages,
//!   and changes under the send guard of their lease admission.
//! - [`link`]: the task that owns the station connection, and its handle; `cache`: the
//!   values it read.
//! - [`numeric`]: NumericResult acquisitions (checks, one per channel at a time, kept
//!   results) and their statistics.
//! - [`lease`]: the control lease (admission, send guard, expiry, safe state) and the lease
//!   stores behind it and behind named leases.
//! - [`audit`]: the audit trail (rotating files of every request and every change, synced
//!   before a change is answered).
//! - [`config_files`]: station configuration files (save, load, the directory), through the
//!   station service.
//! - [`error`]: every layer's error given its HTTP status, legacy code and audit outcome;
//!   beside `http` (its `ApiError` carries the methods a path allows), above the rest.
//! - Below them all: [`config`] (every section, and the pure rules its checks use: the station
//!   URL, the link-owner lease's timing), `api` (the API version), [`metrics`], [`logs`] and
//!   `netinfo` (the host's interfaces, read from the OS).
//!
//! No circle of more than two top-level modules: `scripts/module_cycles.py --max 2` in CI.

#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unused_qualifications)]

pub mod access_rules;
mod api;
pub mod audit;
mod cache;
pub mod config;
pub mod config_files;
pub mod credentials;
pub mod error;
pub mod events;
pub mod gateway;
pub mod gateway_runtime;
pub mod history;
pub mod http;
pub mod lease;
mod legacy;
pub mod link;
pub mod logs;
pub mod metrics;
mod netinfo;
pub mod numeric;
mod numtext;
pub mod rules;
mod server;
pub mod station;
pub mod timestamp;

pub use config::Config;
pub use server::{BindError, GatewayHandle, Listener, Listeners, StartError, run, start};
