//! The lease store: named, exclusive leases with a token, a fence and a time to live, behind one
//! object-safe trait ([`LeaseStore`]) so that other backends (issue 7: SQLite, Postgres, Redis)
//! slot in beside the in-memory one ([`MemoryLeaseStore`]) without changing its users.
//!
//! Semantics every backend keeps:
//! - acquiring gives a random token, or the caller's own token, so that a retry of the same job
//!   re-acquires (renews) its own lease instead of being refused;
//! - the fence goes up by one each time a name is taken, and is never reused;
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

/// The secret that proves who holds a lease: 128 random bits as 32 hex digits, or a token the
/// caller chose. Its `Debug` never shows it.
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

    /// A token the caller chose (an owner token that survives a retry).
    pub fn from_text(text: impl Into<String>) -> LeaseToken {
        LeaseToken(text.into())
    }

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
    pub token: LeaseToken,
    pub owner: String,
    pub fence: u64,
    /// The time to live it was last given.
    pub ttl: Duration,
    /// How long it has left, as of the answer.
    pub expires_in: Duration,
    /// When this holder took it (wall clock, for display).
    pub since: SystemTime,
}

/// Who holds a lease, as anyone may see it (never the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    pub owner: String,
    pub fence: u64,
    pub expires_in: Duration,
    pub since: SystemTime,
}

/// What one acquisition attempt asks for.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    pub owner: String,
    pub ttl: Duration,
    /// The caller's own token; `None` makes the store pick a random one.
    pub token: Option<LeaseToken>,
}

/// The outcome of one acquisition attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquisition {
    /// Taken anew, with a new fence.
    Taken(LeaseGrant),
    /// The caller's token already held it: renewed, same token and fence.
    Renewed(LeaseGrant),
    /// Someone else holds it.
    HeldByOther(LeaseHolder),
}

/// Why a store could not answer. A lease the backend could not confirm is never reported held.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseStoreError {
    #[error("the lease store is unavailable: {0}")]
    Unavailable(String),
    #[error("the lease store failed: {0}")]
    Backend(String),
}

/// A store of named, exclusive leases. Object safe: the gateway holds an `Arc<dyn LeaseStore>`.
pub trait LeaseStore: Send + Sync {
    /// Tries once to take `name`. With the token of the live lease it renews that lease
    /// (`Acquisition::Renewed`) instead of refusing.
    fn try_acquire<'a>(
        &'a self,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>>;

    /// Extends the lease from now by `ttl` (`None`: the TTL it was last given). `None` when it
    /// expired or moved on.
    fn refresh<'a>(
        &'a self,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>>;

    /// Ends the lease `token` holds. `false` when it had already expired or moved on; it never
    /// ends someone else's.
    fn release<'a>(
        &'a self,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>>;

    /// The live lease on `name`, token included (for the process that owns the name, e.g. to
    /// resume after a restart); never shown to clients.
    fn current<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>>;
}

/// One name's state in memory: the holder (possibly past its expiry) and the last fence given.
#[derive(Debug, Default)]
struct NameState {
    holder: Option<MemoryHolder>,
    last_fence: u64,
}

#[derive(Debug)]
struct MemoryHolder {
    token: LeaseToken,
    owner: String,
    fence: u64,
    ttl: Duration,
    since: SystemTime,
    expires_at: Instant,
}

impl MemoryHolder {
    fn grant(&self, now: Instant) -> LeaseGrant {
        LeaseGrant {
            token: self.token.clone(),
            owner: self.owner.clone(),
            fence: self.fence,
            ttl: self.ttl,
            expires_in: self.expires_at.saturating_duration_since(now),
            since: self.since,
        }
    }
}

impl NameState {
    /// The holder while its lease lasts.
    fn live_holder(&mut self, now: Instant) -> Option<&mut MemoryHolder> {
        self.holder
            .as_mut()
            .filter(|holder| holder.expires_at > now)
    }
}

/// Leases in this process's memory, timed on tokio's monotonic clock (so tests can pause it).
/// The default backend and what tests get; lost when the process ends.
#[derive(Debug, Default)]
pub struct MemoryLeaseStore {
    names: Mutex<HashMap<String, NameState>>,
}

impl MemoryLeaseStore {
    pub fn new() -> MemoryLeaseStore {
        MemoryLeaseStore::default()
    }

    fn names(&self) -> MutexGuard<'_, HashMap<String, NameState>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn try_acquire_now(&self, name: &str, request: AcquireRequest) -> Acquisition {
        let now = Instant::now();
        let mut names = self.names();
        let state = names.entry(name.to_owned()).or_default();
        if let Some(holder) = state.live_holder(now) {
            if request
                .token
                .as_ref()
                .is_some_and(|token| holder.token.matches(token.as_str()))
            {
                holder.ttl = request.ttl;
                holder.expires_at = now + request.ttl;
                return Acquisition::Renewed(holder.grant(now));
            }
            return Acquisition::HeldByOther(LeaseHolder {
                owner: holder.owner.clone(),
                fence: holder.fence,
                expires_in: holder.expires_at.saturating_duration_since(now),
                since: holder.since,
            });
        }
        state.last_fence += 1;
        let holder = MemoryHolder {
            token: request.token.unwrap_or_else(LeaseToken::random),
            owner: request.owner,
            fence: state.last_fence,
            ttl: request.ttl,
            since: SystemTime::now(),
            expires_at: now + request.ttl,
        };
        let grant = holder.grant(now);
        state.holder = Some(holder);
        Acquisition::Taken(grant)
    }

    fn refresh_now(
        &self,
        name: &str,
        token: &LeaseToken,
        ttl: Option<Duration>,
    ) -> Option<LeaseGrant> {
        let now = Instant::now();
        let mut names = self.names();
        let holder = names
            .get_mut(name)?
            .live_holder(now)
            .filter(|holder| holder.token.matches(token.as_str()))?;
        if let Some(ttl) = ttl {
            holder.ttl = ttl;
        }
        holder.expires_at = now + holder.ttl;
        Some(holder.grant(now))
    }

    fn release_now(&self, name: &str, token: &LeaseToken) -> bool {
        let now = Instant::now();
        let mut names = self.names();
        let Some(state) = names.get_mut(name) else {
            return false;
        };
        let holds = state
            .live_holder(now)
            .is_some_and(|holder| holder.token.matches(token.as_str()));
        if holds {
            state.holder = None;
        }
        holds
    }

    fn current_now(&self, name: &str) -> Option<LeaseGrant> {
        let now = Instant::now();
        let mut names = self.names();
        names
            .get_mut(name)?
            .live_holder(now)
            .map(|holder| holder.grant(now))
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn try_acquire<'a>(
        &'a self,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        Box::pin(async move { Ok(self.try_acquire_now(name, request)) })
    }

    fn refresh<'a>(
        &'a self,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move { Ok(self.refresh_now(name, token, ttl)) })
    }

    fn release<'a>(
        &'a self,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>> {
        Box::pin(async move { Ok(self.release_now(name, token)) })
    }

    fn current<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        Box::pin(async move { Ok(self.current_now(name)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn request(owner: &str, ttl: Duration) -> AcquireRequest {
        AcquireRequest {
            owner: owner.into(),
            ttl,
            token: None,
        }
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
        let mine = LeaseToken::from_text("job-42");
        let ask = |ttl| AcquireRequest {
            owner: "importer".into(),
            ttl,
            token: Some(mine.clone()),
        };
        let Acquisition::Taken(first) = store.try_acquire("data:42", ask(SECOND)).await.unwrap()
        else {
            panic!("not taken")
        };
        assert_eq!(first.token, mine);
        tokio::time::advance(Duration::from_millis(500)).await;
        let Acquisition::Renewed(again) =
            store.try_acquire("data:42", ask(2 * SECOND)).await.unwrap()
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
