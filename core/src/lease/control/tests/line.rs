//! Unit tests of holders and the line, on paused time: expiry, re-acquisition, waiters first
//! come first served, the admin break, the fence.

use super::*;
use crate::lease::LeaseStoreError;
use crate::lease::store::LeaseKind;

#[tokio::test(start_paused = true)]
async fn the_expiry_task_ends_a_lease_that_was_not_renewed_and_publishes_it() {
    let (lease, mut events) = control_lease();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    assert!(events.recv().await.unwrap().held);
    tokio::time::sleep(Duration::from_millis(600)).await;
    lease.renew(&held.lease_id, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(lease.view().held, "renewed: still held past the first TTL");
    let ran_out = events.recv().await.unwrap();
    assert_eq!(ran_out, LeaseView::nobody());
    assert!(matches!(
        lease.renew(&held.lease_id, None).await,
        Err(LeaseError::NoSuchLease)
    ));
    assert!(matches!(
        lease.release(&held.lease_id).await,
        Err(LeaseError::NoSuchLease)
    ));
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reacquiring_with_the_live_id_renews_the_same_lease() {
    let (lease, _events) = control_lease();
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(700)).await;
    let again = lease
        .acquire("A".into(), TTL, Some(&held.lease_id), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        (&again.lease_id, again.fence, again.expires_in_ms),
        (&held.lease_id, held.fence, 1000)
    );
    // A stale id is just an acquisition like any other.
    lease.release(&held.lease_id).await.unwrap();
    let fresh = lease
        .acquire("A".into(), TTL, Some(&held.lease_id), Duration::ZERO)
        .await
        .unwrap();
    assert_ne!(fresh.lease_id, held.lease_id);
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_first_come_first_served() {
    let (lease, _events) = control_lease();
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let wait = Duration::from_secs(10);
    let second = tokio::spawn({
        let lease = lease.clone();
        async move { lease.acquire("B".into(), TTL, None, wait).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let third = tokio::spawn({
        let lease = lease.clone();
        async move { lease.acquire("C".into(), TTL, None, wait).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Someone not waiting does not jump the line.
    assert!(matches!(
        lease.acquire("D".into(), TTL, None, Duration::ZERO).await,
        Err(LeaseError::HeldByOther { .. })
    ));
    lease.release(&held.lease_id).await.unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.owner, "B");
    assert!(!third.is_finished());
    lease.release(&second.lease_id).await.unwrap();
    assert_eq!(third.await.unwrap().unwrap().owner, "C");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_after_its_wait_with_a_409() {
    let (lease, _events) = control_lease();
    lease
        .acquire("A".into(), Duration::from_secs(30), None, Duration::ZERO)
        .await
        .unwrap();
    let started = Instant::now();
    let error = lease
        .acquire("B".into(), TTL, None, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(error, LeaseError::HeldByOther { ref owner, .. } if owner == "A"),
        "{error}"
    );
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert!(lock(&lease.line).waiting.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_ran_out_goes_to_the_next_in_line() {
    let (lease, mut events) = control_lease();
    let shutdown = CancellationToken::new();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let next = lease
        .acquire("B".into(), TTL, None, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(next.owner, "B");
    let seen: Vec<Option<String>> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|view| view.owner)
        .collect();
    assert_eq!(seen, [Some("A".to_owned()), None, Some("B".to_owned())]);
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_admin_break_ends_whoever_holds_it() {
    let (lease, _events) = control_lease();
    let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
    assert!(matches!(
        lease.break_lease(peer).await,
        Err(LeaseError::NobodyHolds)
    ));
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        lease.break_lease(peer).await.unwrap().owner.as_deref(),
        Some("A")
    );
    assert!(!lease.view().held);
    assert!(matches!(
        lease.renew(&held.lease_id, None).await,
        Err(LeaseError::NoSuchLease)
    ));
}

#[tokio::test(start_paused = true)]
async fn the_fence_is_the_live_holders_only() {
    let (lease, _events) = control_lease();
    let first = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    lease.release(&first.lease_id).await.unwrap();
    let held = lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    assert!(held.fence >= 2, "{}", held.fence);
    assert_eq!(lease.fence_of(Some(&held.lease_id)), Some(held.fence));
    assert_eq!(lease.fence_of(Some(&first.lease_id)), None);
    assert_eq!(lease.fence_of(None), None);
    // Open endpoints tell the holder its fence too, and nobody else.
    let open = lease.admit(Access::Open, Some(&held.lease_id)).unwrap();
    assert_eq!(open.fence, Some(held.fence));
    assert!(open.guard.is_none() && open.cache_only.is_none());
    assert_eq!(lease.admit(Access::Open, None).unwrap().fence, None);
    // Past its deadline it is nobody's, though not yet settled.
    tokio::time::advance(TTL).await;
    assert_eq!(lease.fence_of(Some(&held.lease_id)), None);
    assert!(
        !lease.view().held,
        "a lease past its deadline is shown as held"
    );
    assert_eq!(lease.view(), LeaseView::nobody());
}

/// A memory store that carries out every call but loses the answers scripted (`true`: lost,
/// as a store whose reply never comes back): the acquisitions' and the releases', in the order
/// they come; the rest are answered.
struct LosingStore {
    inner: MemoryLeaseStore,
    lose_acquires: Mutex<VecDeque<bool>>,
    lose_releases: Mutex<VecDeque<bool>>,
}

fn lost<T>(
    script: &Mutex<VecDeque<bool>>,
    answer: Result<T, LeaseStoreError>,
) -> Result<T, LeaseStoreError> {
    match script.lock().unwrap().pop_front() {
        Some(true) => Err(LeaseStoreError::Unavailable("the answer was lost".into())),
        _ => answer,
    }
}

impl LeaseStore for LosingStore {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> futures::future::BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        Box::pin(async move {
            let answer = self.inner.try_acquire_kind(kind, name, request).await;
            lost(&self.lose_acquires, answer)
        })
    }

    fn refresh_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> futures::future::BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        self.inner.refresh_kind(kind, name, token, ttl)
    }

    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> futures::future::BoxFuture<'a, Result<bool, LeaseStoreError>> {
        Box::pin(async move {
            let answer = self.inner.release_kind(kind, name, token).await;
            lost(&self.lose_releases, answer)
        })
    }

    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Vec<LeaseGrant>, LeaseStoreError>> {
        self.inner.holders(kind, name)
    }
}

/// The store takes the lease for the first in line (its first try was answered held by A), and
/// its answer is lost; so is the answer to
/// the release of that lease (the store is out of reach for a moment). The store now holds a
/// lease nobody was given and nobody renews: it lapses at its TTL, and the waiter is served
/// then, within its wait; the next acquirer after it is served in turn.
#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_a_waiters_acquisition_leaves_no_holder_past_its_ttl() {
    let store = Arc::new(LosingStore {
        inner: MemoryLeaseStore::new(),
        lose_acquires: Mutex::new([false, false, true].into()),
        lose_releases: Mutex::new([false, true].into()),
    });
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(ControlLease::new(store, "control:test", events));
    let shutdown = CancellationToken::new();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let lease = lease.clone();
        async move {
            lease
                .acquire("B".into(), TTL, None, Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    lease.release(&held.lease_id).await.unwrap();
    let served = waiting.await.unwrap();
    let served = served.unwrap_or_else(|refusal| {
        panic!(
            "the waiter was refused after {:?}: {refusal}",
            started.elapsed()
        )
    });
    assert_eq!(served.owner, "B");
    assert!(
        started.elapsed() <= TTL + Duration::from_millis(500),
        "served only after {:?}",
        started.elapsed()
    );
    lease.release(&served.lease_id).await.unwrap();
    let next = lease
        .acquire("C".into(), TTL, None, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(next.owner, "C");
    shutdown.cancel();
}
