//! Unit tests of the control lease: admission, the send guard, acquisition, renewal, the line,
//! expiry and the admin break, on paused time.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use super::super::store::{AcquireRequest, Acquisition, LeaseGrant, LeaseToken};
use super::*;
use crate::lease::MemoryLeaseStore;

const TTL: Duration = Duration::from_secs(1);

fn control_lease() -> (Arc<ControlLease>, broadcast::Receiver<LeaseView>) {
    let (events, receiver) = broadcast::channel(64);
    (
        Arc::new(ControlLease::new(
            Arc::new(MemoryLeaseStore::new()),
            "control:test",
            events,
        )),
        receiver,
    )
}

/// A memory store whose refresh answers only after `refresh_delay` (a slow database).
struct SlowRefreshStore {
    inner: MemoryLeaseStore,
    refresh_delay: Duration,
}

impl LeaseStore for SlowRefreshStore {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: super::super::store::LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> futures::future::BoxFuture<'a, Result<Acquisition, super::super::LeaseStoreError>> {
        self.inner.try_acquire_kind(kind, name, request)
    }

    fn refresh_kind<'a>(
        &'a self,
        kind: super::super::store::LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> futures::future::BoxFuture<'a, Result<Option<LeaseGrant>, super::super::LeaseStoreError>>
    {
        Box::pin(async move {
            tokio::time::sleep(self.refresh_delay).await;
            self.inner.refresh_kind(kind, name, token, ttl).await
        })
    }

    fn release_kind<'a>(
        &'a self,
        kind: super::super::store::LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> futures::future::BoxFuture<'a, Result<bool, super::super::LeaseStoreError>> {
        self.inner.release_kind(kind, name, token)
    }

    fn holders<'a>(
        &'a self,
        kind: super::super::store::LeaseKind,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Vec<LeaseGrant>, super::super::LeaseStoreError>>
    {
        self.inner.holders(kind, name)
    }
}

fn control_lease_with_slow_refresh(delay: Duration) -> Arc<ControlLease> {
    let (events, _) = broadcast::channel(64);
    Arc::new(ControlLease::new(
        Arc::new(SlowRefreshStore {
            inner: MemoryLeaseStore::new(),
            refresh_delay: delay,
        }),
        "control:test",
        events,
    ))
}

#[tokio::test(start_paused = true)]
async fn while_a_renewal_waits_on_the_store_past_the_deadline_nobody_else_may_change_the_station() {
    let lease = control_lease_with_slow_refresh(Duration::from_millis(20));
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let holders_guard = lease
        .admit(Access::Change, Some(&held.lease_id))
        .unwrap()
        .guard
        .unwrap();
    tokio::time::advance(Duration::from_millis(990)).await;
    let renewal = tokio::spawn({
        let lease = lease.clone();
        let id = held.lease_id.clone();
        async move { lease.renew(&id, None).await }
    });
    tokio::task::yield_now().await;
    // The deadline passes while the store is still being asked.
    tokio::time::advance(Duration::from_millis(15)).await;
    let refusal = lease.admit(Access::Change, None).err();
    assert!(
        matches!(refusal, Some(LeaseError::Ending { ref owner }) if owner == "A"),
        "a non-holder was admitted while A's lease was past its deadline: {refusal:?}"
    );
    assert!(matches!(
        lease.admit(Access::ForcedRead, None),
        Err(LeaseError::Ending { .. })
    ));
    assert!(
        holders_guard().is_err(),
        "the holder's guard passed past the deadline"
    );
    // The renewal is confirmed after the deadline: it does not extend the lease.
    let renewed = renewal.await.unwrap();
    assert!(
        matches!(renewed, Err(LeaseError::NoSuchLease)),
        "a renewal confirmed after the deadline extended the lease: {renewed:?}"
    );
    assert!(!lease.view().held);
    assert!(lease.admit(Access::Change, None).is_ok());
    // And the store agrees: the next one takes it with a new fence.
    let next = lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    assert!(next.fence > held.fence);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_confirmed_before_the_deadline_extends_the_lease() {
    let lease = control_lease_with_slow_refresh(Duration::from_millis(20));
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(900)).await;
    let renewed = lease.renew(&held.lease_id, None).await.unwrap();
    assert_eq!(renewed.fence, held.fence);
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(lease.view().held);
    assert!(lease.admit(Access::Change, Some(&held.lease_id)).is_ok());
    assert!(matches!(
        lease.admit(Access::Change, None),
        Err(LeaseError::LockedBy { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_change_admitted_while_free_is_refused_at_the_link_while_a_lease_is_past_its_deadline() {
    let (lease, _events) = control_lease();
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    tokio::time::advance(TTL).await;
    // Nobody has settled the expiry yet: the lease is ending, not free.
    let error = lease.admit(Access::Change, None).err().unwrap();
    assert!(error.to_string().contains("between leases"), "{error}");
    lease.release(&held.lease_id).await.unwrap_err();
    let guard = lease.admit(Access::Change, None).unwrap().guard.unwrap();
    assert!(guard().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_change_admitted_under_fence_n_is_refused_at_the_link_once_the_lease_moved_on() {
    let (lease, _events) = control_lease();
    let first = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let admitted = lease.admit(Access::Change, Some(&first.lease_id)).unwrap();
    assert_eq!(admitted.fence, Some(first.fence));
    let guard = admitted.guard.unwrap();
    assert!(guard().is_ok());
    lease.release(&first.lease_id).await.unwrap();
    let second = lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let refusal = guard().unwrap_err();
    assert!(
        refusal.contains("lease ended") && refusal.contains("B's"),
        "{refusal}"
    );
    assert!(second.fence > first.fence);
}

#[tokio::test(start_paused = true)]
async fn a_holder_past_its_ttl_is_refused_even_before_the_expiry_task_runs() {
    let (lease, _events) = control_lease();
    let first = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let guard = lease
        .admit(Access::Change, Some(&first.lease_id))
        .unwrap()
        .guard
        .unwrap();
    tokio::time::advance(TTL).await;
    assert!(guard().unwrap_err().contains("ran out"));
    let error = lease
        .admit(Access::Change, Some(&first.lease_id))
        .err()
        .unwrap();
    assert!(error.to_string().starts_with("lease ended"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn a_change_admitted_while_nobody_held_it_is_refused_once_someone_takes_it() {
    let (lease, _events) = control_lease();
    let guard = lease.admit(Access::Change, None).unwrap().guard.unwrap();
    assert!(guard().is_ok());
    lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    assert!(guard().unwrap_err().contains("leased by B"));
}

#[tokio::test(start_paused = true)]
async fn non_holders_are_refused_changes_and_forced_reads_but_not_cached_reads() {
    let (lease, _events) = control_lease();
    let held = lease
        .acquire(
            "TAT station 3".into(),
            Duration::from_secs(12),
            None,
            Duration::ZERO,
        )
        .await
        .unwrap();
    for access in [Access::Change, Access::ForcedRead] {
        let error = lease.admit(access, None).err().unwrap();
        let message = error.to_string();
        assert!(
            message.contains("held by TAT station 3 for another 12 s"),
            "{message}"
        );
    }
    let cached = lease.admit(Access::CachedRead, None).unwrap();
    assert!(cached.refuse_uncached("I2C", true).is_some());
    assert!(cached.guard.is_none(), "a cache-only read needs no guard");
    let holders = lease
        .admit(Access::CachedRead, Some(&held.lease_id))
        .unwrap();
    assert!(holders.refuse_uncached("I2C", true).is_none());
    assert_eq!(holders.fence, Some(held.fence));
    assert!(lease.admit(Access::Open, Some("0123")).is_ok());
}

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

#[tokio::test(start_paused = true)]
async fn a_guard_says_whether_it_refused_a_change_or_a_read() {
    let (lease, _events) = control_lease();
    let change = lease.admit(Access::Change, None).unwrap().guard.unwrap();
    let read = lease
        .admit(Access::ForcedRead, None)
        .unwrap()
        .guard
        .unwrap();
    let cached = lease
        .admit(Access::CachedRead, None)
        .unwrap()
        .guard
        .unwrap();
    assert_eq!(
        (change.fence(), read.fence(), cached.fence()),
        (None, None, None)
    );
    let held = lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let refusal = change().unwrap_err();
    assert!(refusal.contains("this change"), "{refusal}");
    for guard in [&read, &cached] {
        let refusal = guard.check().unwrap_err();
        assert!(
            refusal.contains("this read") && refusal.contains("leased by B"),
            "{refusal}"
        );
    }
    // The holder's reads carry its fence and pass while it holds the lease.
    let holders = lease
        .admit(Access::ForcedRead, Some(&held.lease_id))
        .unwrap()
        .guard
        .unwrap();
    assert_eq!(holders.fence(), Some(held.fence));
    assert!(holders.check().is_ok());
    let holders_cached = lease
        .admit(Access::CachedRead, Some(&held.lease_id))
        .unwrap();
    assert!(holders_cached.cache_only.is_none());
    assert_eq!(
        holders_cached.guard.as_ref().and_then(|g| g.fence()),
        Some(held.fence)
    );
}

/// A link whose task never runs: the station is never reached, so a safe state never lands.
fn unreached_link() -> LinkHandle {
    let settings = crate::link::LinkSettings {
        url: crate::link::StationUrl::parse("tcp://127.0.0.1:1").unwrap(),
        request_timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        reconnect_min: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(100),
        max_names_per_read: 64,
        coalesce_quiet: Duration::ZERO,
        coalesce_max: Duration::ZERO,
        queue_depth: 8,
        client_name: "control lease test".into(),
    };
    crate::link::LinkTask::new(settings).1
}

#[tokio::test(start_paused = true)]
async fn while_a_safe_state_is_pending_everyone_sees_it_and_nobody_changes_the_station() {
    let (events, _receiver) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(Arc::new(MemoryLeaseStore::new()), "control:test", events)
            .with_safe_state(
                unreached_link(),
                vec![SafeWrite {
                    channel: "ON1".into(),
                    value: "False".into(),
                }],
            ),
    );
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let guard = lease
        .admit(Access::Change, Some(&held.lease_id))
        .unwrap()
        .guard
        .unwrap();
    tokio::time::advance(TTL).await;
    // Settles the expiry: the safe state is tried once and fails (no station).
    assert!(lease.release(&held.lease_id).await.is_err());
    let view = lease.view();
    let pending = view
        .safe_state
        .expect("the pending safe state is not shown");
    assert!(
        pending.pending && pending.after == "A" && pending.tries == 1,
        "{pending:?}"
    );
    assert!(!view.held);
    assert!(
        lease
            .safe_state_pending()
            .is_some_and(|why| why.contains("A's lease"))
    );
    for access in [Access::Change, Access::ForcedRead] {
        assert!(matches!(
            lease.admit(access, None),
            Err(LeaseError::SafeStatePending { .. })
        ));
    }
    assert!(guard().unwrap_err().contains("ran out or was released"));
    let fresh = lease.admit(Access::CachedRead, None).unwrap();
    assert!(
        fresh
            .guard
            .unwrap()
            .check()
            .unwrap_err()
            .contains("safe state")
    );
}

#[tokio::test(start_paused = true)]
async fn a_free_guard_names_a_live_holder_and_one_whose_lease_just_ended_apart() {
    let (lease, _events) = control_lease();
    let guard = lease.admit(Access::Change, None).unwrap().guard.unwrap();
    lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let live = guard().unwrap_err();
    assert!(
        live.contains("leased by B before") && !live.contains("just ended"),
        "{live}"
    );
    tokio::time::advance(TTL).await;
    let ended = guard().unwrap_err();
    assert!(
        ended.contains("leased by B (whose lease has just ended)"),
        "{ended}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_safe_state_owed_from_before_a_restart_is_between_leases_until_its_first_try_fails() {
    let store = Arc::new(MemoryLeaseStore::new());
    let owed = AcquireRequest::new("A".to_owned(), Duration::from_secs(3600));
    store
        .try_acquire("control:test:safe-state-owed", owed)
        .await
        .unwrap();
    let (events, _receiver) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store, "control:test", events).with_safe_state(
            unreached_link(),
            vec![SafeWrite {
                channel: "ON1".into(),
                value: "False".into(),
            }],
        ),
    );
    lease.resume().await.unwrap();
    // Owed, not yet tried: between leases (423), not yet "pending" (503).
    assert!(matches!(
        lease.admit(Access::Change, None),
        Err(LeaseError::Ending { ref owner }) if owner == "A"
    ));
    let view = lease.view().safe_state.unwrap();
    assert_eq!((view.pending, view.tries), (true, 0));
    // Its first try fails (no station): now it is pending, with the try counted.
    let shutdown = CancellationToken::new();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(matches!(
        lease.admit(Access::Change, None),
        Err(LeaseError::SafeStatePending { tries: 1, .. })
    ));
    shutdown.cancel();
}
