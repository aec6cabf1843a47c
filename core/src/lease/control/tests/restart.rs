//! The lock-delay across a restart on one store, in memory on paused time: a new control lease
//! on the store a stopped one used honours the lock-delay the station's ledger kept, one whose
//! last lease ended with no end recorded waits the whole lock-delay, and so does one that takes
//! the station over under another name.

use crate::lease::store::LeaseStore;

use super::*;
use crate::lease::control::state::{LockDelayWhy, StoredLockDelay};

const LOCK_DELAY: Duration = Duration::from_secs(5);

/// What the station these gateways serve says in its HELLO.
const STATION: &str = "HVS-3 ESH1";

/// A gateway's control lease on `store` with the lock-delay, resumed from it and the station's
/// ledger read (its link met the station), its expiry task running until `shutdown`.
async fn gateway_on(
    store: Arc<MemoryLeaseStore>,
    shutdown: &CancellationToken,
) -> Arc<ControlLease> {
    gateway_named("control:test", store, shutdown).await
}

async fn gateway_named(
    name: &str,
    store: Arc<MemoryLeaseStore>,
    shutdown: &CancellationToken,
) -> Arc<ControlLease> {
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store, name, events)
            .with_end_timing(LeaseEndTiming {
                lock_delay: LOCK_DELAY,
                ..LeaseEndTiming::default()
            })
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease.adopt_station(STATION).await.unwrap();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    lease
}

async fn take(lease: &Arc<ControlLease>, owner: &str) -> Result<LeaseAnswer, LeaseError> {
    lease.acquire(owner.into(), TTL, None, Duration::ZERO).await
}

fn lock_delay(refused: Result<LeaseAnswer, LeaseError>) -> (String, &'static str, Duration) {
    match refused {
        Err(LeaseError::LockDelay { after, why, wait }) => {
            let owner = after.strip_suffix("'s lease").unwrap_or(&after).to_owned();
            (owner, why, wait)
        }
        other => panic!("not refused the lock-delay: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_lock_delay_goes_on_in_a_control_lease_restarted_on_the_same_store() {
    let store = Arc::new(MemoryLeaseStore::new());
    let first_run = CancellationToken::new();
    let first = gateway_on(store.clone(), &first_run).await;
    // A's lease ended with a change in doubt: the first gateway records a lock-delay of 5 s.
    first
        .store_end(Some(StoredLockDelay {
            after: "A".into(),
            fence: 5,
            why: LockDelayWhy::ChangesInDoubt,
            left: LOCK_DELAY,
        }))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    first_run.cancel();
    drop(first);

    let second_run = CancellationToken::new();
    let second = gateway_on(store.clone(), &second_run).await;
    assert_eq!(
        second.view().lock_delay_ms,
        Some(5000),
        "{:?}",
        second.view()
    );
    let (after, why, wait) = lock_delay(take(&second, "B").await);
    assert_eq!(
        (after.as_str(), why, wait),
        ("A", "ended with changes in doubt", LOCK_DELAY)
    );
    tokio::time::sleep(LOCK_DELAY).await;
    assert_eq!(take(&second, "B").await.unwrap().owner, "B");
    second_run.cancel();
}

/// A lease that ran out with every change answered records no lock-delay,
/// so a restart right after it serves the next holder at once.
#[tokio::test(start_paused = true)]
async fn after_a_lease_that_ran_out_with_nothing_in_doubt_a_restart_has_no_lock_delay() {
    let store = Arc::new(MemoryLeaseStore::new());
    let first_run = CancellationToken::new();
    let first = gateway_on(store.clone(), &first_run).await;
    take(&first, "A").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(first.view().lock_delay_ms, None, "{:?}", first.view());
    first_run.cancel();
    drop(first);

    let second_run = CancellationToken::new();
    let second = gateway_on(store.clone(), &second_run).await;
    assert_eq!(second.view().lock_delay_ms, None, "{:?}", second.view());
    assert_eq!(take(&second, "B").await.unwrap().owner, "B");
    second_run.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_ended_with_no_end_recorded_makes_a_restart_wait_the_whole_lock_delay() {
    let store = Arc::new(MemoryLeaseStore::new());
    let first_run = CancellationToken::new();
    let first = gateway_on(store.clone(), &first_run).await;
    take(&first, "A").await.unwrap();
    // The gateway dies while A holds it: nobody ends it, the store lets it lapse.
    first_run.cancel();
    drop(first);
    tokio::time::sleep(Duration::from_secs(3)).await;

    let second_run = CancellationToken::new();
    let second = gateway_on(store.clone(), &second_run).await;
    let (after, why, wait) = lock_delay(take(&second, "B").await);
    assert_eq!((after.as_str(), wait), ("A", LOCK_DELAY));
    assert!(why.contains("restart"), "{why}");
    second_run.cancel();
    drop(second);

    // Recorded in the store: a second restart 1 s later waits it whole (no clock says reliably
    // how much of it passed meanwhile).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let third_run = CancellationToken::new();
    let third = gateway_on(store, &third_run).await;
    let (after, _, wait) = lock_delay(take(&third, "B").await);
    assert_eq!((after.as_str(), wait), ("A", LOCK_DELAY));
    third_run.cancel();
}

/// The gateway that served the station dies while A holds the lease; another, whose control
/// lease has another name (another `station.id`, a lab that names the station otherwise),
/// takes the station over: A's lease is ended in the store (it cannot be served under two
/// names), and the next holder waits the whole lock-delay, as after a restart.
#[tokio::test(start_paused = true)]
async fn a_gateway_that_takes_the_station_over_under_another_name_waits_the_lock_delay() {
    let store = Arc::new(MemoryLeaseStore::new());
    let first_run = CancellationToken::new();
    let first = gateway_on(store.clone(), &first_run).await;
    take(&first, "A").await.unwrap();
    first_run.cancel();
    drop(first);

    let second_run = CancellationToken::new();
    let second = gateway_named("control:station:st1", store.clone(), &second_run).await;
    assert!(
        store.current("control:test").await.unwrap().is_none(),
        "A's lease under the other name is ended"
    );
    let (after, why, wait) = lock_delay(take(&second, "B").await);
    assert_eq!((after.as_str(), wait), ("A", LOCK_DELAY));
    assert!(why.contains("takeover"), "{why}");
    assert_eq!(second.station_served().as_deref(), Some("hvs-3 esh1"));
    second_run.cancel();
}

/// Before its link met the station a gateway that keeps the station's ledger grants no lease:
/// it does not know yet what the station is owed.
#[tokio::test(start_paused = true)]
async fn no_lease_is_granted_before_the_link_met_the_station() {
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(Arc::new(MemoryLeaseStore::new()), "control:test", events)
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    assert!(matches!(
        take(&lease, "A").await,
        Err(LeaseError::StationNotMet { .. })
    ));
    lease.adopt_station(STATION).await.unwrap();
    assert_eq!(take(&lease, "A").await.unwrap().owner, "A");
}

#[tokio::test(start_paused = true)]
async fn after_a_clean_release_a_restart_has_no_lock_delay() {
    let store = Arc::new(MemoryLeaseStore::new());
    let first_run = CancellationToken::new();
    let first = gateway_on(store.clone(), &first_run).await;
    let held = take(&first, "A").await.unwrap();
    first.release(&held.lease_id).await.unwrap();
    first_run.cancel();
    drop(first);

    let second_run = CancellationToken::new();
    let second = gateway_on(store, &second_run).await;
    assert_eq!(second.view().lock_delay_ms, None);
    assert_eq!(take(&second, "B").await.unwrap().owner, "B");
    second_run.cancel();
}

/// The store carried A's acquisition out 600 ms after it was asked, so its copy of the lease
/// ends 600 ms after the deadline A was told (counted from before the call). The gateway is
/// killed while A holds it, and its next run resumes the lease from the store: the resumed
/// lease must end no later than A was told, so that a renewal after that deadline is refused,
/// as it is without the restart.
#[tokio::test(start_paused = true)]
async fn a_lease_resumed_after_a_kill_ends_no_later_than_its_holder_was_told() {
    let ttl = Duration::from_secs(5);
    let store = Arc::new(SlowStore {
        inner: MemoryLeaseStore::new(),
        refresh_delay: Duration::ZERO,
        acquire_delay: Duration::from_millis(600).into(),
    });
    let first = control_lease_on(store.clone());
    let asked = Instant::now();
    let held = first
        .acquire("A".into(), ttl, None, Duration::ZERO)
        .await
        .unwrap();
    let told = Instant::now() + Duration::from_millis(held.expires_in_ms);
    assert_eq!(told, asked + ttl);
    // Killed: nothing is released.
    drop(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = control_lease_on(store.clone());
    second.resume().await.unwrap();
    let resumed = Instant::now() + Duration::from_millis(second.view().expires_in_ms);
    assert!(
        resumed <= told,
        "resumed until {:?} after the deadline its holder was told",
        resumed - told
    );
    tokio::time::sleep_until(told + Duration::from_millis(1)).await;
    let renewal = second.renew(&held.lease_id, None).await;
    assert!(
        matches!(renewal, Err(LeaseError::NoSuchLease)),
        "renewed after the deadline its holder was told: {renewal:?}"
    );
}

/// A store call that takes a lease fails once it has gone on for the bound
/// (`STORE_CALL_BOUND`, 2 s): a lease is never granted on an answer later than that, which is
/// what lets a restart resume a lease at most that much shorter than the store says.
#[tokio::test(start_paused = true)]
async fn an_acquisition_the_store_does_not_answer_within_the_bound_is_refused() {
    let store = Arc::new(SlowStore {
        inner: MemoryLeaseStore::new(),
        refresh_delay: Duration::ZERO,
        acquire_delay: Duration::from_secs(3).into(),
    });
    let lease = control_lease_on(store.clone());
    let asked = Instant::now();
    let refused = lease
        .acquire("A".into(), Duration::from_secs(5), None, Duration::ZERO)
        .await;
    assert!(matches!(refused, Err(LeaseError::Store(_))), "{refused:?}");
    assert_eq!(asked.elapsed(), Duration::from_secs(2));
    *store.acquire_delay.lock().unwrap() = Duration::ZERO;
    let held = lease
        .acquire("B".into(), Duration::from_secs(5), None, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(held.owner, "B");
}
