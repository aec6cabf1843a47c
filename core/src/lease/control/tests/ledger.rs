//! The control lease's side of the station's ledger, on a memory store and paused time: what a
//! restart reads before its link meets the station, what it takes over from another control
//! lease, an unreadable record, the doubts it inherits, and what each lease's start and end
//! write.

use super::*;
use crate::lease::control::state::{LockDelayWhy, StoredLockDelay};
use crate::lease::ledger::{RECORD_TTL, StationDuties, record_name};
use crate::lease::store::LeaseStore;

const STATION: &str = "HVS-3 ESH1";
const LOCK_DELAY: Duration = Duration::from_secs(5);

/// A control lease named `name` on `store` that keeps the station's ledger, resumed.
async fn resumed(name: &str, store: &Arc<MemoryLeaseStore>) -> Arc<ControlLease> {
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store.clone(), name, events)
            .with_end_timing(LeaseEndTiming {
                lock_delay: LOCK_DELAY,
                ..LeaseEndTiming::default()
            })
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease
}

/// The station `identity`'s record as the store keeps it now.
async fn record_of(store: &MemoryLeaseStore, identity: &str) -> Option<StationDuties> {
    let record = store.current(&record_name(identity)).await.unwrap()?;
    Some(StationDuties::decode(&record.owner).unwrap())
}

fn delay(after: &str, left: Duration) -> StoredLockDelay {
    StoredLockDelay {
        after: after.into(),
        fence: 3,
        why: LockDelayWhy::ChangesInDoubt,
        left,
    }
}

fn refused_lock_delay(answer: Result<LeaseAnswer, LeaseError>) -> (String, Duration) {
    match answer {
        Err(LeaseError::LockDelay { after, wait, .. }) => (after, wait),
        other => panic!("not refused the lock-delay: {other:?}"),
    }
}

async fn take(lease: &Arc<ControlLease>, owner: &str) -> Result<LeaseAnswer, LeaseError> {
    lease.acquire(owner.into(), TTL, None, Duration::ZERO).await
}

/// Two control leases on one store, each serving its own station, each record a lock-delay;
/// restarted, each knows its own station's duties before its link meets the station (the
/// station it served last is kept beside its lease), never the other's.
#[tokio::test(start_paused = true)]
async fn a_restart_knows_its_own_stations_ledger_before_its_link_meets_it() {
    let store = Arc::new(MemoryLeaseStore::new());
    for (name, station, owner) in [
        ("control:a", "STATION A", "A"),
        ("control:b", "STATION B", "B"),
    ] {
        let lease = resumed(name, &store).await;
        lease.adopt_station(station).await.unwrap();
        let left = if owner == "A" {
            LOCK_DELAY
        } else {
            LOCK_DELAY * 2
        };
        lease.store_end(Some(delay(owner, left))).await;
    }
    let a = resumed("control:a", &store).await;
    let b = resumed("control:b", &store).await;
    assert_eq!(a.station_served().as_deref(), Some("station a"));
    assert_eq!(
        refused_lock_delay(take(&a, "C").await),
        ("A's lease".to_owned(), LOCK_DELAY)
    );
    assert_eq!(
        refused_lock_delay(take(&b, "C").await),
        ("B's lease".to_owned(), LOCK_DELAY * 2)
    );
}

/// A record another control lease wrote since (another gateway served the station) is not
/// taken over at start: only the gateway that owns the station may end that lease. Until the
/// link meets the station no lease is granted; then its duties are taken over, its live lease
/// ended, and the next holder waits the whole lock-delay.
#[tokio::test(start_paused = true)]
async fn a_record_of_another_control_lease_waits_for_the_link_to_meet_the_station() {
    let store = Arc::new(MemoryLeaseStore::new());
    let ours = resumed("control:ours", &store).await;
    ours.adopt_station(STATION).await.unwrap();
    drop(ours);
    let theirs = resumed("control:theirs", &store).await;
    theirs.adopt_station(STATION).await.unwrap();
    take(&theirs, "T").await.unwrap();
    drop(theirs);
    let ours = resumed("control:ours", &store).await;
    assert!(
        matches!(
            take(&ours, "B").await,
            Err(LeaseError::StationNotMet { .. })
        ),
        "the other lease's record is not taken over before the link meets the station"
    );
    assert!(store.current("control:theirs").await.unwrap().is_some());
    ours.adopt_station(STATION).await.unwrap();
    assert!(
        store.current("control:theirs").await.unwrap().is_none(),
        "T's lease, of the other control lease, is ended in the store"
    );
    let (after, wait) = refused_lock_delay(take(&ours, "B").await);
    assert_eq!((after.as_str(), wait), ("T's lease", LOCK_DELAY));
    assert_eq!(
        record_of(&store, STATION).await.map(|record| record.lease),
        Some("control:ours".to_owned()),
        "the record names the control lease that serves the station now"
    );
}

/// A gateway that served the station, then lost it to a gateway naming it otherwise, reads
/// the station's record again when it gets the station back: the other's lease, left live (its
/// gateway cut off from the store), is ended there, and its end is owed here (safe state,
/// lock-delay), not forgotten because this gateway had read the record once before.
#[tokio::test(start_paused = true)]
async fn a_gateway_that_gets_the_station_back_takes_over_what_another_left_meanwhile() {
    let store = Arc::new(MemoryLeaseStore::new());
    let ours = resumed("control:ours", &store).await;
    ours.adopt_station(STATION).await.unwrap();
    let theirs = resumed("control:theirs", &store).await;
    theirs.adopt_station(STATION).await.unwrap();
    take(&theirs, "T").await.unwrap();
    drop(theirs);
    ours.adopt_station(STATION).await.unwrap();
    assert!(
        store.current("control:theirs").await.unwrap().is_none(),
        "T's lease, of the other control lease, is ended in the store"
    );
    let (after, wait) = refused_lock_delay(take(&ours, "B").await);
    assert_eq!((after.as_str(), wait), ("T's lease", LOCK_DELAY));
}

/// A record this version cannot read owes all it might: the next holder waits the whole
/// lock-delay, after "an unknown holder".
#[tokio::test(start_paused = true)]
async fn an_unreadable_record_makes_the_next_holder_wait_the_whole_lock_delay() {
    let store = Arc::new(MemoryLeaseStore::new());
    store
        .try_acquire(
            &record_name(STATION),
            AcquireRequest::new("not a record".to_owned(), RECORD_TTL),
        )
        .await
        .unwrap();
    let lease = resumed("control:test", &store).await;
    lease.adopt_station(STATION).await.unwrap();
    let (after, wait) = refused_lock_delay(take(&lease, "B").await);
    assert_eq!(
        (after.as_str(), wait),
        ("an unknown holder's lease", LOCK_DELAY)
    );
}

/// A lease's start records its end as pending, and the safe state it would owe only when one
/// is configured; a clean release records neither any more.
#[tokio::test(start_paused = true)]
async fn a_lease_records_its_end_pending_while_held_and_its_release_clears_it() {
    let store = Arc::new(MemoryLeaseStore::new());
    let lease = resumed("control:test", &store).await;
    lease.adopt_station(STATION).await.unwrap();
    let held = take(&lease, "A").await.unwrap();
    let record = record_of(&store, STATION)
        .await
        .expect("a record while held");
    assert_eq!(record.end_pending.as_deref(), Some("A"));
    assert_eq!(record.safe_state_owed, None, "no safe state is configured");
    lease.release(&held.lease_id).await.unwrap();
    assert_eq!(
        record_of(&store, STATION).await,
        None,
        "nothing owed after a clean release: no record"
    );
}

/// With a safe state configured, the record says it is owed while the lease is held, and a
/// release (which owes none) clears it.
#[tokio::test(start_paused = true)]
async fn a_safe_state_owed_is_recorded_while_held_and_cleared_when_the_lease_ends_owing_none() {
    let store = Arc::new(MemoryLeaseStore::new());
    let (events, _) = broadcast::channel(64);
    let link = started_link();
    let lease = Arc::new(
        ControlLease::new(store.clone(), "control:test", events)
            .with_end_timing(LeaseEndTiming {
                lock_delay: LOCK_DELAY,
                ..LeaseEndTiming::default()
            })
            .with_safe_state(
                link.clone(),
                vec![SafeWrite {
                    channel: "ON1".into(),
                    value: "False".into(),
                }],
            )
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease.adopt_station(STATION).await.unwrap();
    let held = take(&lease, "A").await.unwrap();
    let record = record_of(&store, STATION).await.unwrap();
    assert_eq!(record.safe_state_owed.as_deref(), Some("A"));
    lease.release(&held.lease_id).await.unwrap();
    assert_eq!(record_of(&store, STATION).await, None);
}

/// A recorded lock-delay is replaced only by one that lasts longer.
#[tokio::test(start_paused = true)]
async fn a_recorded_lock_delay_is_replaced_only_by_a_longer_one() {
    let store = Arc::new(MemoryLeaseStore::new());
    let lease = resumed("control:test", &store).await;
    lease.adopt_station(STATION).await.unwrap();
    let recorded = |store: Arc<MemoryLeaseStore>| async move {
        record_of(&store, STATION)
            .await
            .and_then(|record| record.lock_delay)
            .map(|delay| (delay.after, delay.left))
    };
    lease
        .store_end(Some(delay("A", Duration::from_secs(8))))
        .await;
    lease
        .store_end(Some(delay("B", Duration::from_secs(2))))
        .await;
    assert_eq!(
        recorded(store.clone()).await,
        Some(("A".to_owned(), Duration::from_secs(8)))
    );
    lease
        .store_end(Some(delay("C", Duration::from_secs(8))))
        .await;
    assert_eq!(
        recorded(store.clone()).await,
        Some(("A".to_owned(), Duration::from_secs(8))),
        "one as long changes nothing"
    );
    lease
        .store_end(Some(delay("D", Duration::from_secs(9))))
        .await;
    assert_eq!(
        recorded(store.clone()).await,
        Some(("D".to_owned(), Duration::from_secs(9)))
    );
}

/// A change another control lease left in doubt at the station (recorded with the time it may
/// still land) holds the next grant until that time has passed.
#[tokio::test(start_paused = true)]
async fn an_inherited_doubt_holds_the_next_grant_until_it_can_no_longer_land() {
    let store = Arc::new(MemoryLeaseStore::new());
    let record = StationDuties {
        doubts: vec![crate::lease::ledger::RecordedDoubt {
            fence: 9,
            left: Duration::from_secs(3),
        }],
        ..StationDuties::none("control:other")
    };
    store
        .try_acquire(
            &record_name(STATION),
            AcquireRequest::new(record.encode(), RECORD_TTL),
        )
        .await
        .unwrap();
    let (events, _) = broadcast::channel(64);
    let link = started_link();
    let lease = Arc::new(
        ControlLease::new(store.clone(), "control:test", events)
            .with_safe_state(link, Vec::new())
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease.adopt_station(STATION).await.unwrap();
    let asked = Instant::now();
    let granted = lease
        .acquire("B".into(), TTL, None, Duration::from_secs(30))
        .await;
    assert!(granted.is_ok(), "{granted:?}");
    assert!(
        asked.elapsed() >= Duration::from_secs(3),
        "granted {:?} after the ledger was read, while the inherited change could still land",
        asked.elapsed()
    );
}

/// A change in doubt lapses (nobody answered it within its bound) before any grant here takes
/// the lapse: the lock-delay that follows is the station's from that instant, so it is written
/// into the station's ledger at once. A control lease that serves the station next (after a
/// clean stop, a crash restart, a standby's takeover) refuses the next lease for what is left
/// of it.
#[tokio::test(start_paused = true)]
async fn a_lapsed_doubts_lock_delay_is_in_the_ledger_before_any_grant_takes_it() {
    let store = Arc::new(MemoryLeaseStore::new());
    let link = started_link();
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store.clone(), "control:test", events)
            .with_end_timing(LeaseEndTiming {
                lock_delay: LOCK_DELAY,
                ..LeaseEndTiming::default()
            })
            .with_safe_state(link.clone(), Vec::new())
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease.adopt_station(STATION).await.unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    let bound = Instant::now() + Duration::from_secs(1);
    link.inherit_doubts(vec![crate::link::Doubt {
        fence: crate::link::FREE_FENCE,
        until: bound,
    }])
    .await;
    let after = Duration::from_millis(200);
    tokio::time::sleep_until(bound + after).await;
    shutdown.cancel();
    let record = record_of(&store, STATION).await.unwrap_or_default();
    let recorded = record
        .lock_delay
        .clone()
        .map(|delay| (delay.why, delay.left));
    assert_eq!(
        recorded,
        Some(("leaseless-doubt".to_owned(), LOCK_DELAY)),
        "the lock-delay after the lapse is not in the station's ledger: {record:?}"
    );
    let next = resumed("control:test", &store).await;
    next.adopt_station(STATION).await.unwrap();
    let (_, wait) = refused_lock_delay(take(&next, "B").await);
    assert_eq!(wait, LOCK_DELAY);
}

/// A holder's change lapses while its lease is held, and the gateway stops cleanly before the
/// lease ends. The restart resumes the lease live (the machine takes no lock-delay from the
/// record then); the lock-delay after that lapse still holds the grant that follows the
/// lease's end, until the record says it is over.
#[tokio::test(start_paused = true)]
async fn a_lapse_under_a_lease_resumed_live_delays_the_grant_after_its_end() {
    let store = Arc::new(MemoryLeaseStore::new());
    let with_link = |link: LinkHandle| {
        let (events, _) = broadcast::channel(64);
        Arc::new(
            ControlLease::new(store.clone(), "control:test", events)
                .with_end_timing(LeaseEndTiming {
                    lock_delay: LOCK_DELAY,
                    ..LeaseEndTiming::default()
                })
                .with_safe_state(link, Vec::new())
                .with_station_ledger(),
        )
    };
    let link = started_link();
    let first = with_link(link.clone());
    first.resume().await.unwrap();
    first.adopt_station(STATION).await.unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(first.clone().run_expiry(shutdown.clone()));
    let a = first
        .acquire("A".into(), Duration::from_secs(60), None, Duration::ZERO)
        .await
        .unwrap();
    let bound = Instant::now() + Duration::from_secs(1);
    link.inherit_doubts(vec![crate::link::Doubt {
        fence: a.fence,
        until: bound,
    }])
    .await;
    let after = Duration::from_millis(200);
    tokio::time::sleep_until(bound + after).await;
    shutdown.cancel();
    let second = with_link(started_link());
    second.resume().await.unwrap();
    second.adopt_station(STATION).await.unwrap();
    assert!(second.view().held, "A's lease goes on after the restart");
    second.release(&a.lease_id).await.unwrap();
    let (after_whom, wait) = refused_lock_delay(take(&second, "B").await);
    assert_eq!((after_whom.as_str(), wait), ("A's lease", LOCK_DELAY));
}

/// A link task running against a station it never reaches (a settle waits on its doubts).
fn started_link() -> LinkHandle {
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
        client_name: "ledger test".into(),
    };
    let (task, link) = crate::link::LinkTask::new(settings);
    tokio::spawn(task.run(CancellationToken::new()));
    link
}

/// After a crash this gateway took its link back from (its own link-owner lease, with its
/// state file), whatever the crashed run had at the station holds the next grant for the
/// longest processing.
#[tokio::test(start_paused = true)]
async fn after_a_crash_the_next_grant_waits_the_longest_processing() {
    let store = Arc::new(MemoryLeaseStore::new());
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store.clone(), "control:test", events)
            .with_safe_state(started_link(), Vec::new())
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease.adopt_station(STATION).await.unwrap();
    lease.after_a_crash(Duration::from_secs(2)).await;
    let asked = Instant::now();
    lease
        .acquire("B".into(), TTL, None, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "granted {:?} after a crash restart, while the crashed run's change could still land",
        asked.elapsed()
    );
}

/// At a clean stop what is still at the station goes into its ledger — only while this
/// process still owns the station's link — so that whoever serves it next waits for it.
#[tokio::test(start_paused = true)]
async fn a_clean_stop_records_what_is_still_at_the_station_only_while_it_owns_the_link() {
    let store = Arc::new(MemoryLeaseStore::new());
    let link = started_link();
    let (events, _) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store.clone(), "control:test", events)
            .with_safe_state(link.clone(), Vec::new())
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease.adopt_station(STATION).await.unwrap();
    link.inherit_doubts(vec![crate::link::Doubt {
        fence: 4,
        until: Instant::now() + Duration::from_secs(3),
    }])
    .await;
    let mut doubts = link.watch_doubts();
    doubts
        .wait_for(|doubts| !doubts.doubts.is_empty())
        .await
        .unwrap();
    let limit = Duration::from_secs(1);
    lease.flush_ledger(false, limit).await;
    assert_eq!(
        record_of(&store, STATION).await,
        None,
        "a process that no longer owns the link writes nothing"
    );
    lease.flush_ledger(true, limit).await;
    let record = record_of(&store, STATION)
        .await
        .expect("the change recorded");
    assert_eq!(record.doubts.len(), 1);
    assert_eq!(
        (record.doubts[0].fence, record.doubts[0].left),
        (4, Duration::from_secs(3))
    );
}

/// Another control lease served the station: its holder T's lease is still live in the store,
/// a safe state is owed after it, and one of its changes may still land for 3 s. Taking the
/// station over ends T's lease there; its safe state is written only once that change can no
/// longer land (a safe state written before it would be overridden by it), as a lease's own
/// end waits for its changes.
#[tokio::test(start_paused = true)]
async fn a_foreign_lease_ended_at_adoption_gets_its_safe_state_after_the_inherited_doubts() {
    let store = Arc::new(MemoryLeaseStore::new());
    store
        .try_acquire(
            "control:other",
            AcquireRequest::new("T".to_owned(), TTL * 30),
        )
        .await
        .unwrap();
    let left = Duration::from_secs(3);
    let record = StationDuties {
        safe_state_owed: Some("T".into()),
        end_pending: Some("T".into()),
        doubts: vec![crate::lease::ledger::RecordedDoubt { fence: 9, left }],
        ..StationDuties::none("control:other")
    };
    store
        .try_acquire(
            &record_name(STATION),
            AcquireRequest::new(record.encode(), RECORD_TTL),
        )
        .await
        .unwrap();
    let (events, mut views) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store.clone(), "control:test", events)
            .with_safe_state(
                started_link(),
                vec![SafeWrite {
                    channel: "ON1".into(),
                    value: "False".into(),
                }],
            )
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    let adopted = Instant::now();
    lease.adopt_station(STATION).await.unwrap();
    assert!(
        store.current("control:other").await.unwrap().is_none(),
        "T's lease, of the other control lease, is ended in the store"
    );
    // The first try of the safe state fails (no station): its view counts it.
    loop {
        let view = views.recv().await.unwrap();
        if view.safe_state.is_some_and(|owed| owed.tries > 0) {
            break;
        }
    }
    assert!(
        adopted.elapsed() >= left,
        "the safe state after T's lease was tried {:?} after the takeover, while T's change could still land",
        adopted.elapsed()
    );
    shutdown.cancel();
}
