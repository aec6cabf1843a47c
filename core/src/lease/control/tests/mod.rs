//! Unit tests of the control lease: admission, the send guard, acquisition, renewal, the line,
//! expiry and the admin break, on paused time.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use super::super::store::{AcquireRequest, Acquisition, LeaseGrant, LeaseToken};
use super::*;
use crate::lease::MemoryLeaseStore;
use crate::link::GuardRefusal;

mod custody;
mod ledger;
mod line;
mod restart;
mod safe_state;

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

/// A memory store that takes up a refresh only after `refresh_delay`, and an acquisition only
/// after `acquire_delay` (a slow database, or a slow way to it; changed as a test goes).
struct SlowStore {
    inner: MemoryLeaseStore,
    refresh_delay: Duration,
    acquire_delay: Mutex<Duration>,
}

impl LeaseStore for SlowStore {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: super::super::store::LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> futures::future::BoxFuture<'a, Result<Acquisition, super::super::LeaseStoreError>> {
        let delay = *self.acquire_delay.lock().unwrap();
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            self.inner.try_acquire_kind(kind, name, request).await
        })
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
    control_lease_on(Arc::new(SlowStore {
        inner: MemoryLeaseStore::new(),
        refresh_delay: delay,
        acquire_delay: Duration::ZERO.into(),
    }))
}

fn control_lease_on(store: Arc<SlowStore>) -> Arc<ControlLease> {
    let (events, _) = broadcast::channel(64);
    Arc::new(ControlLease::new(store, "control:test", events))
}

/// `A` takes the lease (TTL 1 s); its answer, and the send guard of a change `A` makes.
async fn held_by_a_with_its_guard(lease: &Arc<ControlLease>) -> (LeaseAnswer, SendGuard) {
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let guard = lease
        .admit(Access::Change, Some(&held.lease_id))
        .unwrap()
        .guard
        .unwrap();
    (held, guard)
}

/// B asks for the lease 5 ms before A's deadline; the store takes it up 20 ms later, when A's
/// lease has lapsed there too, and takes a new one for B. A's lease must still end here first
/// (its changes still at the station settle, then its safe state): B is refused as while any
/// lease ends, and the lease the store took for B goes back to the store.
#[tokio::test(start_paused = true)]
async fn an_acquire_the_store_takes_up_after_the_holders_deadline_ends_that_lease_first() {
    let store = Arc::new(SlowStore {
        inner: MemoryLeaseStore::new(),
        refresh_delay: Duration::ZERO,
        acquire_delay: Duration::ZERO.into(),
    });
    let lease = control_lease_on(store.clone());
    let (held, holders_guard) = held_by_a_with_its_guard(&lease).await;
    tokio::time::advance(TTL - Duration::from_millis(5)).await;
    assert!(holders_guard.lease_check(Instant::now()).is_ok());
    *store.acquire_delay.lock().unwrap() = Duration::from_millis(20);
    let asked = tokio::spawn({
        let lease = lease.clone();
        async move { lease.acquire("B".into(), TTL, None, Duration::ZERO).await }
    });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(20)).await;
    let answer = asked.await.unwrap();
    assert!(
        matches!(answer, Err(LeaseError::Ending { ref owner, .. }) if owner == "A"),
        "B got the lease before A's had ended: {answer:?}"
    );
    assert!(holders_guard.lease_check(Instant::now()).is_err());
    assert!(!lease.view().held);
    // A's end is finished (no safe state here); the store kept nothing of B's refused lease,
    // so the next asker takes it, with a fence past both.
    let next = lease
        .acquire("C".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(next.owner, "C");
    assert!(
        next.fence > held.fence + 1,
        "{} after {}",
        next.fence,
        held.fence
    );
}

#[tokio::test(start_paused = true)]
async fn while_a_renewal_waits_on_the_store_past_the_deadline_nobody_else_may_change_the_station() {
    let lease = control_lease_with_slow_refresh(Duration::from_millis(20));
    let (held, holders_guard) = held_by_a_with_its_guard(&lease).await;
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
        matches!(refusal, Some(LeaseError::Ending { ref owner, .. }) if owner == "A"),
        "a non-holder was admitted while A's lease was past its deadline: {refusal:?}"
    );
    assert!(matches!(
        lease.admit(Access::ForcedRead, None),
        Err(LeaseError::Ending { .. })
    ));
    assert!(
        holders_guard.lease_check(Instant::now()).is_err(),
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
    assert!(guard.lease_check(Instant::now()).is_ok());
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
    assert!(guard.lease_check(Instant::now()).is_ok());
    lease.release(&first.lease_id).await.unwrap();
    let second = lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    let refusal = guard.lease_check(Instant::now()).unwrap_err();
    assert_eq!(
        refusal,
        GuardRefusal::ChangedHands {
            what: Guarded::Change,
            admitted: first.fence,
            owner: "B".into(),
            current: second.fence,
        }
    );
    assert_eq!(refusal.admitted_fence(), Some(first.fence));
    let refusal = refusal.to_string();
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
    assert!(
        guard
            .lease_check(Instant::now())
            .unwrap_err()
            .to_string()
            .contains("ran out")
    );
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
    assert!(guard.lease_check(Instant::now()).is_ok());
    lease
        .acquire("B".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        guard
            .lease_check(Instant::now())
            .unwrap_err()
            .to_string()
            .contains("leased by B")
    );
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
    let refusal = change.lease_check(Instant::now()).unwrap_err().to_string();
    assert!(refusal.contains("this change"), "{refusal}");
    for guard in [&read, &cached] {
        let refusal = guard.lease_check(Instant::now()).unwrap_err().to_string();
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
    assert!(holders.lease_check(Instant::now()).is_ok());
    let holders_cached = lease
        .admit(Access::CachedRead, Some(&held.lease_id))
        .unwrap();
    assert!(holders_cached.cache_only.is_none());
    assert_eq!(
        holders_cached.guard.as_ref().and_then(|g| g.fence()),
        Some(held.fence)
    );
}

#[test]
fn a_guard_refusal_between_leases_says_what_admission_says_and_that_it_was_not_sent() {
    let between = GuardRefusal::BetweenLeases {
        what: Guarded::Change,
        owner: "A".into(),
    };
    let admission = LeaseError::Ending {
        owner: "A".into(),
        ended_ago: None,
        lock_delay_left: None,
    };
    assert_eq!(
        between.to_string(),
        format!("{admission}; this change was not sent")
    );
    let pending = GuardRefusal::SafeStatePending {
        what: Guarded::Read,
        owner: "A".into(),
        tries: 2,
        last_error: "no station".into(),
    };
    let admission = LeaseError::SafeStatePending {
        owner: "A".into(),
        tries: 2,
        last_error: "no station".into(),
    };
    assert_eq!(
        pending.to_string(),
        format!("{admission}; this read was not sent")
    );
    assert_eq!(pending.admitted_fence(), None);
}

/// A request served on a connection thread (`http::threads`) whose runtime stops while its
/// acquisition waits for its turn: the transition runs on the gateway's runtime, so it is
/// carried out whole (the lease granted, then given back as unclaimed, as for any requester
/// that went away). Spawned on the request's runtime, it would end with it, halfway or not at
/// all.
#[tokio::test]
async fn a_transition_outlives_the_connection_thread_its_request_came_on() {
    let (lease, mut events) = control_lease();
    let turn = lease.turn().await;
    // Asked once (its transition spawned, waiting for the turn), then the thread's runtime
    // ends.
    let thread = {
        let lease = lease.clone();
        crate::gateway_runtime::on_a_thread_of_its_own(move || async move {
            let ttl = Duration::from_secs(60);
            tokio::select! {
                biased;
                _ = lease.acquire("B".into(), ttl, None, Duration::ZERO) => {}
                () = std::future::ready(()) => {}
            }
        })
    };
    tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    drop(turn);
    let owners = tokio::time::timeout(Duration::from_secs(10), async {
        let mut owners = Vec::new();
        loop {
            let view = events.recv().await.unwrap();
            owners.push(view.owner.clone());
            if !view.held {
                return owners;
            }
        }
    })
    .await
    .expect("the acquisition was never carried out");
    assert_eq!(owners.first(), Some(&Some("B".to_owned())), "{owners:?}");
    assert!(!lease.view().held, "the unclaimed lease was given back");
}
