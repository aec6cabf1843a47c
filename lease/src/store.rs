//! The lease store: named leases and semaphores with a token, a fence and a time to live, behind
//! one object-safe trait ([`LeaseStore`]); backends: memory ([`MemoryLeaseStore`], here),
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

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use crate::plan::{AcquirePlan, SlotRow, duration_to_millis, plan_acquire, wall_millis};

/// The secret that proves who holds a lease: 128 random bits as 32 hex digits (a store never
/// gives a lease any other), or a token as a caller presented it. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A new token of 128 random bits from the operating system's generator.
    pub fn random() -> LeaseToken {
        use rand::RngCore;
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        LeaseToken(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// A token as a caller presented it (e.g. from a header): it proves nothing until a store
    /// finds it holding a lease.
    pub fn from_text(text: impl Into<String>) -> LeaseToken {
        LeaseToken(text.into())
    }

    /// The token as text (to hand to its holder; never log it).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, compared in constant time for equal lengths.
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseToken(<secret>)")
    }
}

/// A lease as its holder sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The secret that refreshes and releases it.
    pub token: LeaseToken,
    /// Who holds it, as others see it.
    pub owner: String,
    /// Goes up each time the name (or a slot of it) is taken: hand it to whatever the lease
    /// protects, so that a stalled holder's late write can be told apart.
    pub fence: u64,
    /// The time to live it was last given.
    pub ttl: Duration,
    /// How long it has left, as of the answer.
    pub expires_in: Duration,
    /// When this holder took it (the backend's clock, for display).
    pub since: SystemTime,
    /// The semaphore slot it holds; 0 for an exclusive lease.
    pub slot: u32,
}

/// Who holds a lease, as anyone may see it (never the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// Who holds it.
    pub owner: String,
    /// The fence it was taken with.
    pub fence: u64,
    /// How long it has left, as of the answer.
    pub expires_in: Duration,
    /// When this holder took it (the backend's clock, for display).
    pub since: SystemTime,
    /// The semaphore slot it holds; 0 for an exclusive lease.
    pub slot: u32,
}

impl LeaseHolder {
    /// A holder the backend could not describe (never expected; keeps refusals total).
    pub fn unknown() -> LeaseHolder {
        LeaseHolder {
            owner: "an unknown holder".into(),
            fence: 0,
            expires_in: Duration::ZERO,
            since: SystemTime::UNIX_EPOCH,
            slot: 0,
        }
    }
}

impl From<LeaseGrant> for LeaseHolder {
    fn from(grant: LeaseGrant) -> LeaseHolder {
        LeaseHolder {
            owner: grant.owner,
            fence: grant.fence,
            expires_in: grant.expires_in,
            since: grant.since,
            slot: grant.slot,
        }
    }
}

/// What one acquisition attempt asks for.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Who asks, as others will see it.
    pub owner: String,
    /// How long the lease lasts unless refreshed.
    pub ttl: Duration,
    /// A token an earlier grant gave (a retry of the same job): it gets back, renewed with the
    /// same fence, the lease it still holds. A token that holds nothing is never given to a
    /// lease: the acquisition is then a fresh one, with [`fresh_token`](Self::fresh_token).
    pub retry_token: Option<LeaseToken>,
    /// The token a lease taken anew gets: 128 random bits, drawn when the request is made and
    /// kept by its clones, so that every attempt of one request (a blocking wait) is one caller.
    fresh_token: LeaseToken,
}

impl AcquireRequest {
    /// A request by `owner` for `ttl`, with a fresh random token.
    pub fn new(owner: impl Into<String>, ttl: Duration) -> AcquireRequest {
        AcquireRequest {
            owner: owner.into(),
            ttl,
            retry_token: None,
            fresh_token: LeaseToken::random(),
        }
    }

    /// The same request, also renewing the lease `token` holds (see [`retry_token`]).
    ///
    /// [`retry_token`]: AcquireRequest::retry_token
    pub fn with_retry_token(mut self, token: LeaseToken) -> AcquireRequest {
        self.retry_token = Some(token);
        self
    }

    /// The token a lease taken anew by this request gets.
    pub fn fresh_token(&self) -> &LeaseToken {
        &self.fresh_token
    }

    /// Whether `holder` (a stored token) is this request's own: its fresh or its retry token.
    pub fn is_own(&self, holder: &str) -> bool {
        self.fresh_token.matches(holder)
            || self
                .retry_token
                .as_ref()
                .is_some_and(|token| token.matches(holder))
    }
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquisition {
    /// Taken anew, with a new fence.
    Taken(LeaseGrant),
    /// The caller's token already held it: renewed, same token and fence.
    Renewed(LeaseGrant),
    /// Someone else holds it (for a semaphore: every slot is taken; this is the holder whose
    /// slot frees soonest).
    HeldByOther(LeaseHolder),
}

/// An exclusive lease or a counted semaphore. A name is used as one or the other, never both:
/// the SQL backends keep both in one table (see `sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseKind {
    /// One holder at a time (slot 0).
    Exclusive,
    /// At most `slots` holders at a time (slots `0..slots`). `slots` matters only to acquiring.
    Semaphore {
        /// How many may hold it at once.
        slots: u32,
    },
}

impl LeaseKind {
    /// How many may hold it at once.
    pub fn slots(self) -> u32 {
        match self {
            LeaseKind::Exclusive => 1,
            LeaseKind::Semaphore { slots } => slots.max(1),
        }
    }

    /// Whether it is a semaphore.
    pub fn is_semaphore(self) -> bool {
        matches!(self, LeaseKind::Semaphore { .. })
    }
}

/// Why a store could not answer, or refused a request that contradicts what it holds. A lease
/// the backend could not confirm is never reported held.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseStoreError {
    /// Not reached, not answering in time, or locked: try again.
    #[error("the lease store is unavailable: {0}")]
    Unavailable(String),
    /// The backend answered with an error.
    #[error("the lease store failed: {0}")]
    Backend(String),
    /// A semaphore asked for with another number of slots than the one in force: its first
    /// holder fixes it for as long as anyone holds it, so that no caller can make room for
    /// itself by asking for more.
    #[error(
        "the semaphore has {in_force} slots, fixed by its holders for as long as anyone holds it; \
         slots={asked} was asked: ask with slots={in_force}, or wait until nobody holds it"
    )]
    CapacityConflict {
        /// The number of slots its holders took it with.
        in_force: u32,
        /// The number asked for.
        asked: u32,
    },
    /// The backend URL is wrong.
    #[error("lease backend {url:?} cannot be used: {message}")]
    BadBackend {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        message: String,
    },
}

/// A store of named leases and semaphores. Object safe: the gateway holds an
/// `Arc<dyn LeaseStore>`. Backends implement the four `*_kind` methods and [`holders`];
/// the exclusive-lease shorthands (`try_acquire`, `refresh`, `release`, `current`) come free.
///
/// [`holders`]: LeaseStore::holders
pub trait LeaseStore: Send + Sync {
    /// Tries once to take a slot of `name`. With the token of a live holder it renews that
    /// holder's lease (`Acquisition::Renewed`) instead of refusing.
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

/// One name's rows in memory, and its fence counter.
#[derive(Debug, Default)]
struct MemoryName {
    rows: Vec<SlotRow>,
    last_fence: i64,
}

/// Leases in this process's memory, timed on tokio's monotonic clock (so tests can pause it).
/// The default backend and what tests get; lost when the process ends. Makes the same
/// decisions as the SQL backends ([`plan_acquire`]), on rows kept in a map.
#[derive(Debug)]
pub struct MemoryLeaseStore {
    names: Mutex<HashMap<(bool, String), MemoryName>>,
    /// The zero of this store's millisecond clock.
    epoch: Instant,
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        MemoryLeaseStore {
            names: Mutex::default(),
            epoch: Instant::now(),
        }
    }
}

impl MemoryLeaseStore {
    /// An empty store.
    pub fn new() -> MemoryLeaseStore {
        MemoryLeaseStore::default()
    }

    fn names(&self) -> MutexGuard<'_, HashMap<(bool, String), MemoryName>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> i64 {
        duration_to_millis(Instant::now().saturating_duration_since(self.epoch))
    }

    fn try_acquire_now(
        &self,
        kind: LeaseKind,
        name: &str,
        request: AcquireRequest,
    ) -> Result<Acquisition, LeaseStoreError> {
        let now = self.now();
        let mut names = self.names();
        let state = names
            .entry((kind.is_semaphore(), name.to_owned()))
            .or_default();
        let plan = plan_acquire(
            kind,
            &state.rows,
            state.last_fence,
            now,
            wall_millis(SystemTime::now()),
            &request,
        );
        match &plan {
            AcquirePlan::Renew(row) | AcquirePlan::Take(row) => {
                state.last_fence = state.last_fence.max(row.fence);
                state.rows.retain(|old| old.slot != row.slot);
                state.rows.push(row.clone());
                state.rows.sort_by_key(|row| row.slot);
            }
            AcquirePlan::Refuse(_) | AcquirePlan::CapacityConflict { .. } => {}
        }
        plan.outcome(kind, now)
    }

    /// The live row `token` holds, for a change by `update`.
    fn with_live_row<T>(
        &self,
        kind: LeaseKind,
        name: &str,
        token: &LeaseToken,
        update: impl FnOnce(&mut SlotRow, i64) -> T,
    ) -> Option<T> {
        let now = self.now();
        let mut names = self.names();
        let state = names.get_mut(&(kind.is_semaphore(), name.to_owned()))?;
        let row = state
            .rows
            .iter_mut()
            .find(|row| row.is_live(now) && token.matches(&row.holder))?;
        Some(update(row, now))
    }

    fn holders_now(&self, kind: LeaseKind, name: &str) -> Vec<LeaseGrant> {
        let now = self.now();
        let names = self.names();
        names
            .get(&(kind.is_semaphore(), name.to_owned()))
            .map(|state| {
                state
                    .rows
                    .iter()
                    .filter(|row| row.is_live(now))
                    .map(|row| row.grant(now))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        Box::pin(async move { self.try_acquire_now(kind, name, request) })
    }

    fn refresh_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move {
            Ok(self.with_live_row(kind, name, token, |row, now| {
                if let Some(ttl) = ttl {
                    row.ttl_ms = duration_to_millis(ttl);
                }
                row.expires_at = now + row.ttl_ms;
                row.grant(now)
            }))
        })
    }

    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>> {
        Box::pin(async move {
            Ok(self
                .with_live_row(kind, name, token, |row, now| row.expires_at = now)
                .is_some())
        })
    }

    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move { Ok(self.holders_now(kind, name)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn request(owner: &str, ttl: Duration) -> AcquireRequest {
        AcquireRequest::new(owner, ttl)
    }

    async fn take(store: &dyn LeaseStore, owner: &str, ttl: Duration) -> LeaseGrant {
        match store
            .try_acquire("control:x", request(owner, ttl))
            .await
            .unwrap()
        {
            Acquisition::Taken(grant) => grant,
            other => panic!("expected Taken, got {other:?}"),
        }
    }

    #[test]
    fn tokens_are_128_random_bits_in_hex_and_never_printed() {
        let token = LeaseToken::random();
        assert_eq!(token.as_str().len(), 32);
        assert!(token.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(token, LeaseToken::random());
        assert!(token.matches(token.as_str()));
        assert!(!token.matches(&token.as_str()[..31]));
        assert!(!format!("{token:?}").contains(token.as_str()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_ends_by_itself_at_its_ttl_and_cannot_be_refreshed_after() {
        let store = MemoryLeaseStore::new();
        let grant = take(&store, "A", SECOND).await;
        assert_eq!(grant.expires_in, SECOND);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(store.current("control:x").await.unwrap().is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(store.current("control:x").await.unwrap().is_none());
        assert!(
            store
                .refresh("control:x", &grant.token, None)
                .await
                .unwrap()
                .is_none()
        );
        assert!(!store.release("control:x", &grant.token).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn refresh_extends_from_now_with_the_old_or_a_new_ttl() {
        let store = MemoryLeaseStore::new();
        let grant = take(&store, "A", SECOND).await;
        tokio::time::advance(Duration::from_millis(800)).await;
        let renewed = store
            .refresh("control:x", &grant.token, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((renewed.fence, renewed.expires_in), (grant.fence, SECOND));
        tokio::time::advance(Duration::from_millis(800)).await;
        let renewed = store
            .refresh("control:x", &grant.token, Some(5 * SECOND))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(renewed.expires_in, 5 * SECOND);
        tokio::time::advance(Duration::from_millis(4900)).await;
        assert!(store.current("control:x").await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_holder_refreshes_or_releases_and_never_someone_elses() {
        let store = MemoryLeaseStore::new();
        let first = take(&store, "A", SECOND).await;
        let stranger = LeaseToken::random();
        assert!(
            store
                .refresh("control:x", &stranger, None)
                .await
                .unwrap()
                .is_none()
        );
        assert!(!store.release("control:x", &stranger).await.unwrap());
        tokio::time::advance(SECOND).await;
        let second = take(&store, "B", SECOND).await;
        // A's lease moved on: A can neither refresh nor release B's.
        assert!(
            store
                .refresh("control:x", &first.token, None)
                .await
                .unwrap()
                .is_none()
        );
        assert!(!store.release("control:x", &first.token).await.unwrap());
        assert_eq!(
            store.current("control:x").await.unwrap().unwrap().owner,
            "B"
        );
        assert!(store.release("control:x", &second.token).await.unwrap());
        assert!(!store.release("control:x", &second.token).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn fences_go_up_on_every_acquisition_and_are_never_reused() {
        let store = MemoryLeaseStore::new();
        let mut last = 0;
        for round in 0..5 {
            let grant = take(&store, "A", SECOND).await;
            assert!(
                grant.fence > last,
                "round {round}: fence {} after {last}",
                grant.fence
            );
            last = grant.fence;
            if round % 2 == 0 {
                assert!(store.release("control:x", &grant.token).await.unwrap());
            } else {
                tokio::time::advance(SECOND).await;
            }
        }
        // Another name counts on its own.
        let other = store
            .try_acquire("control:y", request("A", SECOND))
            .await
            .unwrap();
        assert!(matches!(other, Acquisition::Taken(grant) if grant.fence == 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_callers_own_token_reacquires_its_lease_with_the_same_fence() {
        let store = MemoryLeaseStore::new();
        let chosen = LeaseToken::from_text("job-42");
        let ask = |ttl, token: &LeaseToken| {
            AcquireRequest::new("importer", ttl).with_retry_token(token.clone())
        };
        let Acquisition::Taken(first) = store
            .try_acquire("data:42", ask(SECOND, &chosen))
            .await
            .unwrap()
        else {
            panic!("not taken")
        };
        // A chosen token that holds nothing is not given to the lease.
        assert_ne!(first.token, chosen);
        let mine = first.token.clone();
        tokio::time::advance(Duration::from_millis(500)).await;
        let Acquisition::Renewed(again) = store
            .try_acquire("data:42", ask(2 * SECOND, &mine))
            .await
            .unwrap()
        else {
            panic!("not renewed")
        };
        assert_eq!((again.fence, again.expires_in), (first.fence, 2 * SECOND));
        let other = store
            .try_acquire("data:42", request("someone", SECOND))
            .await
            .unwrap();
        assert!(matches!(other, Acquisition::HeldByOther(holder) if holder.owner == "importer"));
    }
}
