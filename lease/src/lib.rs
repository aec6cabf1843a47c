//! Named leases, counted semaphores and fences, on memory, SQLite, PostgreSQL or Redis: the
//! lease engine that the station gateway's control lease is built on, for lab scripts and
//! services to use directly.
//!
//! # Layout
//!
//! - [`store`]: the [`LeaseStore`] trait (acquire, refresh, release, list holders) and the
//!   types it speaks ([`LeaseToken`], [`LeaseGrant`], [`LeaseHolder`], [`Acquisition`]), with
//!   the in-memory backend [`MemoryLeaseStore`].
//! - [`sqlite`], [`postgres`], [`redis`]: the shared backends, which outlive the process.
//! - [`backends`]: a backend by URL (`memory`, `sqlite:PATH`, `postgres://...`, `redis://...`)
//!   with [`BackendUrl`], and [`LeaseBackends`], which opens each URL once.
//! - [`engine`]: what a lab script holds: [`Lease::exclusive`], [`Lease::semaphore`],
//!   `acquire(blocking, wait)`, `refresh`, `release`, and the scoped [`LeaseGuard`].
//! - `store::plan` (private to the crate): the one acquisition decision that memory, SQLite
//!   and PostgreSQL share.
//! - the `station-lease` binary (`src/bin/station-lease/`, the default feature `cli`, which the
//!   gateway leaves out): holds a lease around a command, through a gateway's HTTP or a backend.
//!
//! # Example
//!
//! A whole script is `examples/lab_script.rs`; the crate's `README.md` says what every backend
//! keeps (exclusion, fences, time to live, tokens).
//!
//! ```no_run
//! use std::time::Duration;
//! use station_lease::{BackendUrl, Lease};
//!
//! # async fn import() -> Result<(), Box<dyn std::error::Error>> {
//! let store = BackendUrl::parse("postgres://postgres@127.0.0.1/test")?.open().await?;
//! let lease = Lease::exclusive(store, "dataset-42", Duration::from_secs(30)).with_owner("importer");
//! // Wait up to 10 s for it; the guard releases it when the import is done.
//! let guard = lease.guard(true, Some(Duration::from_secs(10))).await?;
//! println!("importing under fence {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
#![warn(
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub,
    clippy::unwrap_used
)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod backends;
pub mod engine;
pub mod postgres;
pub mod redis;
pub mod sqlite;
pub mod store;

pub use backends::{BackendUrl, LeaseBackends};
pub use engine::{Lease, LeaseGuard, LeaseGuardError};
pub use postgres::PostgresLeaseStore;
pub use redis::RedisLeaseStore;
pub use sqlite::SqliteLeaseStore;
pub use store::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseHolder, LeaseKind, LeaseStore, LeaseStoreError,
    LeaseToken, MemoryLeaseStore,
};

/// The examples in `README.md`, compiled as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
