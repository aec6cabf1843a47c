//! Unit tests of a pending safe state, on paused time: everyone sees it, nobody changes the
//! station meanwhile, and one owed from before a restart.

use super::*;

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
    assert!(
        guard
            .lease_check(Instant::now())
            .unwrap_err()
            .to_string()
            .contains("ran out or was released")
    );
    let fresh = lease.admit(Access::CachedRead, None).unwrap();
    assert!(
        fresh
            .guard
            .unwrap()
            .lease_check(Instant::now())
            .unwrap_err()
            .to_string()
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
    let live = guard.lease_check(Instant::now()).unwrap_err().to_string();
    assert!(
        live.contains("leased by B before") && !live.contains("just ended"),
        "{live}"
    );
    tokio::time::advance(TTL).await;
    let ended = guard.lease_check(Instant::now()).unwrap_err().to_string();
    assert!(
        ended.contains("leased by B (whose lease has just ended)"),
        "{ended}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_safe_state_owed_from_before_a_restart_is_between_leases_until_its_first_try_fails() {
    let store = Arc::new(MemoryLeaseStore::new());
    let record = crate::lease::ledger::StationDuties {
        safe_state_owed: Some("A".into()),
        ..crate::lease::ledger::StationDuties::none("control:test")
    };
    let owed = AcquireRequest::new(record.encode(), crate::lease::ledger::RECORD_TTL);
    store
        .try_acquire(&crate::lease::ledger::record_name("HVS-3 ESH1"), owed)
        .await
        .unwrap();
    let (events, _receiver) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(store, "control:test", events)
            .with_safe_state(
                unreached_link(),
                vec![SafeWrite {
                    channel: "ON1".into(),
                    value: "False".into(),
                }],
            )
            .with_station_ledger(),
    );
    lease.resume().await.unwrap();
    lease.adopt_station("HVS-3 ESH1").await.unwrap();
    // Owed, not yet tried: between leases (423), not yet "pending" (503).
    assert!(matches!(
        lease.admit(Access::Change, None),
        Err(LeaseError::Ending { ref owner, .. }) if owner == "A"
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
