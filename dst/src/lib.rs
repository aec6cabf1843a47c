//! A deterministic simulation of the whole lab: one or two gateways, each the station runtime
//! that ships (link, control lease, station ledger, link-owner lease or standby, change runner)
//! against a simulated station, a simulated lease store and simulated clients, on one
//! current-thread runtime with paused time; every choice (what the clients do, which fault
//! comes when) is drawn from one seed, and the lease's invariants are checked against the
//! station's own write log at every step. `README.md` beside this crate says how to run it.

pub mod assembly;
pub mod invariants;
pub mod naming;
pub mod pipe;
pub mod rng;
pub mod store;
pub mod trace;
pub mod world;

pub use world::{RunOptions, SeedOutcome, run};
