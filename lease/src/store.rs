//! The lease store: named leases and semaphores with a token, a fence and a time to live, behind
//! one object-safe trait ([`LeaseStore`]); backends: memory ([`MemoryLeaseStore`], in `memory`),
//! [`crate::sqlite`], [`crate::postgres`] and [`crate::redis`], opened by URL in
//! [`crate::backends`].
//!
//! Semantics every backend keeps:
//! - a lease taken anew gets a token of 128 random bits, drawn by this crate, never one the
//!   caller chose; a token the caller presents ([`AcquireRequest::retry_token`]) only gets back
//!   (renews, same fence) the lease it already holds, so that a retry of the same job is not
//!   refused by its own lease, and a guessed token gets nothing;
//! - the fence goes up each time a name (or a semaphore slot of it) is taken, and is never
//!   reused, also across restarts of a backend that keeps its data;
//! - a lease ends by itself once its TTL has passed, and never refreshes itself;
//! - only the token that holds a lease can refresh or release it, and only while it lasts:
//!   refresh and release answer `false`/`None` once it expired or moved on.

use std::time::Duration;

use futures::future::BoxFuture;

mod memory;
pub(crate) mod plan;
pub(crate) mod terms;

pub use memory::MemoryLeaseStore;
pub use terms::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseHolder, LeaseKind, LeaseStoreError, LeaseToken,
};

/// A store of named leases and semaphores. Object safe: the gateway holds an
/// `Arc<dyn LeaseStore>`. Backends implement the four `*_kind` methods and [`holders`];
/// the exclusive-lease shorthands (`try_acquire`, `refresh`, `release`, `current`) come free.
///
/// [`holders`]: LeaseStore::holders
pub trait LeaseStore: Send + Sync {
    /// Tries once to take a slot of `name`. With the token of a live holder it renews that
    /// holder's lease (`Acquisition::Renewed`) instead of refusing, and its owner text becomes
    /// the request's, in the same write: a holder rewrites what it keeps in its owner text
    /// atomically (same token, same fence).
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>>;

    /// Extends the lease `token` holds from now by `ttl` (`None`: the TTL it was last given).
    /// `None` when it expired or moved on.
    fn refresh_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>>;

    /// Ends the lease `token` holds. `false` when it had already expired or moved on; it never
    /// ends someone else's.
    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>>;

    /// Every live holder of `name`, tokens included (for the process that owns the name, e.g.
    /// to resume after a restart); never shown to clients. Ordered by slot.
    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LeaseGrant>, LeaseStoreError>>;

    /// [`try_acquire_kind`](LeaseStore::try_acquire_kind) for an exclusive lease.
    fn try_acquire<'a>(
        &'a self,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        self.try_acquire_kind(LeaseKind::Exclusive, name, request)
    }

    /// [`refresh_kind`](LeaseStore::refresh_kind) for an exclusive lease.
    fn refresh<'a>(
        &'a self,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        self.refresh_kind(LeaseKind::Exclusive, name, token, ttl)
    }

    /// [`release_kind`](LeaseStore::release_kind) for an exclusive lease.
    fn release<'a>(
        &'a self,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>> {
        self.release_kind(LeaseKind::Exclusive, name, token)
    }

    /// The live exclusive lease on `name`, token included.
    fn current<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move {
            Ok(self
                .holders(LeaseKind::Exclusive, name)
                .await?
                .into_iter()
                .next())
        })
    }
}
