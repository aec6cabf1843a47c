//! The lock-delay across a restart on one store (issue 49, 2), in memory on paused time: a new
//! control lease on the store a stopped one used honours the lock-delay it kept, and one whose
//! last lease ended with no end recorded waits the whole lock-delay.

use super::*;
use crate::lease::control::state::{LockDelayWhy, StoredLockDelay};

const LOCK_DELAY: Duration = Duration::from_secs(5);

/// A gateway's control lease on `store` with the lock-delay, resumed from it, its expiry task
/// running until `shutdown`.
async fn gateway_on(
    store: Arc<MemoryLeaseStore>,
    shutdown: &CancellationToken,
) -> Arc<ControlLease> {
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store, "control:test", events).with_end_timing(LeaseEndTiming {
            lock_delay: LOCK_DELAY,
            ..LeaseEndTiming::default()
        }),
    );
    lease.resume().await.unwrap();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    lease
}

async fn take(lease: &Arc<ControlLease>, owner: &str) -> Result<LeaseAnswer, LeaseError> {
    lease.acquire(owner.into(), TTL, None, Duration::ZERO).await
}

fn lock_delay(refused: Result<LeaseAnswer, LeaseError>) -> (String, &'static str, Duration) {
    match refused {
        Err(LeaseError::LockDelay { after, why, wait }) => (after, why, wait),
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
        Some(4000),
        "{:?}",
        second.view()
    );
    let (after, why, wait) = lock_delay(take(&second, "B").await);
    assert_eq!(
        (after.as_str(), why, wait),
        ("A", "ended with changes in doubt", Duration::from_secs(4))
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(take(&second, "B").await.unwrap().owner, "B");
    second_run.cancel();
}

/// Issue 51, item 1: a lease that ran out with every change answered records no lock-delay,
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

    // Recorded in the store: a second restart 1 s later waits what is left of it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let third_run = CancellationToken::new();
    let third = gateway_on(store, &third_run).await;
    let (after, _, wait) = lock_delay(take(&third, "B").await);
    assert_eq!((after.as_str(), wait), ("A", Duration::from_secs(4)));
    third_run.cancel();
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
