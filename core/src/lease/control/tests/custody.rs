//! Unit tests of the grant asked whether this process owns the station's link at the moment it
//! grants, on paused time: a link standing by on the station's identity (another gateway
//! serves the station) grants nobody a lease, whoever asks and however the lease came free.

use super::*;
use crate::lease::link_custody::LinkCustody;
use crate::lease::standby::HaRole;
use crate::link::OwnerGate;

const OTHER: &str = "gateway B holds link-owner:station:hvs-3 esh1";

/// A control lease asking `gate` (an owner's, open) whether this process owns the link, and
/// its expiry task.
fn served_through(gate: &Arc<OwnerGate>) -> (Arc<ControlLease>, CancellationToken) {
    served_through_on(gate, Arc::new(MemoryLeaseStore::new()))
}

/// [`served_through`] on `store`.
fn served_through_on(
    gate: &Arc<OwnerGate>,
    store: Arc<dyn LeaseStore>,
) -> (Arc<ControlLease>, CancellationToken) {
    let (events, _) = broadcast::channel(64);
    let lease = ControlLease::new(store, "control:test", events).with_link_custody(
        LinkCustody::new(Arc::new(HaRole::owner()), Some(gate.clone())),
    );
    let lease = Arc::new(lease);
    let shutdown = CancellationToken::new();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    (lease, shutdown)
}

fn spawn_acquire(
    lease: &Arc<ControlLease>,
    owner: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<LeaseAnswer, LeaseError>> {
    let (lease, owner) = (lease.clone(), owner.to_owned());
    tokio::spawn(async move { lease.acquire(owner, TTL, None, wait).await })
}

#[tokio::test(start_paused = true)]
async fn a_link_standing_by_grants_no_lease_until_it_serves_the_station_again() {
    let gate = Arc::new(OwnerGate::open_for_good(Instant::now()));
    let (lease, shutdown) = served_through(&gate);
    gate.decide_identity("hvs-3 esh1".into(), Err(OTHER.into()));
    let refused = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LeaseError::NotLinkOwner(_)) && refused.to_string().contains(OTHER),
        "{refused:?}"
    );
    assert_eq!(refused.kind(), crate::error_kind::ErrorKind::StandingBy);
    let waiting = spawn_acquire(&lease, "A", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "granted while the link stood by");
    assert_eq!(lease.waiting_in_line(), 1);
    assert!(!lease.view().held);
    // The other gateway let the station go: this one serves it, and the line is served.
    gate.decide_identity("hvs-3 esh1".into(), Ok(()));
    let granted = waiting
        .await
        .unwrap()
        .expect("granted once the link serves");
    assert_eq!(granted.owner, "A");
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_lease_released_while_the_link_stands_by_goes_to_the_next_in_line_only_once_it_serves() {
    let gate = Arc::new(OwnerGate::open_for_good(Instant::now()));
    let (lease, shutdown) = served_through(&gate);
    let held = lease
        .acquire("A".into(), Duration::from_secs(30), None, Duration::ZERO)
        .await
        .unwrap();
    let waiting = spawn_acquire(&lease, "B", Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Another gateway took the station meanwhile; A's release frees the lease here.
    gate.decide_identity("hvs-3 esh1".into(), Err(OTHER.into()));
    lease.release(&held.lease_id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !waiting.is_finished(),
        "B was handed the lease while the link stood by"
    );
    assert!(!lease.view().held);
    gate.decide_identity("hvs-3 esh1".into(), Ok(()));
    let granted = waiting
        .await
        .unwrap()
        .expect("B is granted once the link serves");
    assert_eq!(
        (granted.owner.as_str(), granted.fence),
        ("B", held.fence + 1)
    );
    shutdown.cancel();
}

/// The link begins to stand by while the store takes the lease for a client waiting in line
/// (asked once the door and the line had let it through): the grant itself asks again, and
/// the client waits on, first in line, until the link serves the station.
#[tokio::test(start_paused = true)]
async fn a_link_that_stands_by_while_the_store_takes_the_lease_grants_it_to_nobody() {
    let gate = Arc::new(OwnerGate::open_for_good(Instant::now()));
    let store = Arc::new(SlowStore {
        inner: MemoryLeaseStore::new(),
        refresh_delay: Duration::ZERO,
        acquire_delay: Duration::from_millis(500).into(),
    });
    let (lease, shutdown) = served_through_on(&gate, store);
    let waiting = spawn_acquire(&lease, "A", Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.decide_identity("hvs-3 esh1".into(), Err(OTHER.into()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !waiting.is_finished(),
        "granted though the link stood by when it was granted"
    );
    assert!(!lease.view().held);
    assert_eq!(lease.waiting_in_line(), 1);
    gate.decide_identity("hvs-3 esh1".into(), Ok(()));
    let granted = waiting
        .await
        .unwrap()
        .expect("granted once the link serves");
    assert_eq!(granted.owner, "A");
    shutdown.cancel();
}
