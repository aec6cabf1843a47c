//! The in-memory lease store: rows in a map, timed on tokio's monotonic clock, deciding as the
//! SQL backends do (`plan_acquire`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseKind, LeaseStore, LeaseStoreError, LeaseToken,
};
use crate::store::plan::{AcquirePlan, SlotRow, duration_to_millis, plan_acquire, wall_millis};

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
    /// Milliseconds this store's clock was stepped by ([`MemoryLeaseStore::step_clock`]).
    stepped: AtomicI64,
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        MemoryLeaseStore {
            names: Mutex::default(),
            epoch: Instant::now(),
            stepped: AtomicI64::new(0),
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
            + self.stepped.load(Ordering::Relaxed)
    }

    /// Steps this store's clock by `by_ms` milliseconds, forward or (negative) back, as an NTP
    /// step moves the clock a SQL backend reads (`julianday('now')` is the host's wall clock,
    /// `clock_timestamp()` the database server's): every expiry is compared with the stepped
    /// clock from now on. For a simulation of the lab; nothing else calls it.
    pub fn step_clock(&self, by_ms: i64) {
        self.stepped.fetch_add(by_ms, Ordering::Relaxed);
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

    #[tokio::test(start_paused = true)]
    async fn a_step_of_the_stores_clock_moves_every_expiry_with_it() {
        let store = MemoryLeaseStore::new();
        take(&store, "A", 5 * SECOND).await;
        store.step_clock(-10_000);
        tokio::time::advance(6 * SECOND).await;
        let held = store.current("control:x").await.unwrap().unwrap();
        assert_eq!(held.expires_in, 9 * SECOND);
        store.step_clock(10_000);
        assert!(store.current("control:x").await.unwrap().is_none());
        assert_eq!(take(&store, "B", SECOND).await.fence, 2);
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
