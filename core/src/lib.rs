//! The station core of Station Gateway: everything between a front end and the station, and
//! nothing of HTTP (this crate does not depend on hyper; `cargo tree -p station-core` shows it).
//!
//! At the bottom, [`error_kind`]: what went wrong, as every layer gives its errors and every
//! front end tells them (an HTTP status, a legacy code, an audit outcome).
//!
//! From the bottom (no circle of more than two top-level modules: `scripts/module_cycles.py`):
//!
//! - [`config`]: every section of the gateway's configuration, and the pure rules its checks
//!   use (the station URL, the link-owner lease's timing).
//! - [`link`]: the task that owns the station connection, and its handle; [`cache`]: the values
//!   it read.
//! - [`access_rules`] and [`rules`]: who may change what, and the interlocks.
//! - [`lease`]: the control lease (admission, send guard, expiry, safe state) and the lease
//!   stores behind it and behind named leases.
//! - [`audit`]: the audit trail (rotating files of every request and every change, synced
//!   before a change is answered).
//! - [`station`]: the station service every front end goes through: the cache-or-hardware
//!   decision by a `ReadPolicy`, the consuming-channel rule, "station not reached", ages, and
//!   changes run by the change runner under the send guard of their lease admission.
//! - [`numeric`]: NumericResult acquisitions and their statistics; [`config_files`]: station
//!   configuration files, through the station service; [`history`]: the value history.
//! - [`runtime`]: one station assembled, started and stopped ([`runtime::StationRuntime`]), and
//!   what the stations of one gateway share ([`runtime::LabShared`]).
//! - Beside them: [`metrics`], [`timestamp`], [`numtext`] and [`gateway_runtime`] (where work
//!   that must finish is spawned from a request).
//!
//! The front ends (HTTP, events, the legacy listener) and the server that starts everything are
//! in the `station-gateway` crate, which re-exports these modules under its own root.

#![forbid(unsafe_code)]
#![warn(rust_2018_idioms, unused_qualifications)]

pub mod access_rules;
pub mod audit;
pub mod cache;
pub mod config;
pub mod config_files;
pub mod error_kind;
pub mod gateway_runtime;
pub mod history;
pub mod holes;
pub mod lease;
pub mod link;
pub mod metrics;
pub mod numeric;
pub mod numtext;
pub mod rules;
pub mod runtime;
pub mod station;
pub mod timestamp;

pub use config::Config;
