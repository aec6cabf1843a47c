//! Lease invariants under load: many HTTP clients contend for the control lease with short
//! TTLs while writing; some release, some let it run out, some keep writing with a lease that
//! has ended. Afterwards the simulator's write log must show: never two holders (the fences of
//! applied writes never go back), fences strictly increasing, no write from a non-holder, and
//! every write answered 200 applied. A lease whose change was in doubt makes the next acquire
//! wait its lock-delay (409), kept short here so that the clients contend.
//! The second test adds one write that takes longer than two request timeouts: in doubt at
//! its lease's end, which waits for it, so it still lands before that end and its safe state.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::json;
use station_protocol::Value;

/// What one client saw of one write.
#[derive(Debug, Clone)]
struct Attempt {
    client: usize,
    fence: u64,
    status: u16,
    /// Sent with a lease the client had already released or let run out.
    stale: bool,
}

/// The X-Lease-Id of a write sent without any lease: allowed only while nobody holds it.
const NO_LEASE: &str = "";
/// Short, so that a lapse does not stall the contention for long.
const LOCK_DELAY_MS: u64 = 100;
/// The second test's request timeout, and the one write that takes longer than two of them.
const REQUEST_TIMEOUT_MS: u64 = 500;
const SLOW_WRITE: Duration = Duration::from_millis(1100);
/// The longest the station may take (above the slow write, so the lease's end waits for it),
/// and so the time between the safe state's two read backs.
const MAX_PROCESSING_MS: u64 = 1300;
/// Renewals (in time or too late) the racing test needs to mean anything.
const ENOUGH_RENEWALS: usize = 4;
/// Grants the racing test needs to mean anything.
const RACING_GRANTS: usize = 5;

#[tokio::test]
async fn contending_clients_never_hold_at_once_and_only_holders_write() {
    let rig = Arc::new(rig(|config| config.lease.lock_delay_ms = Some(LOCK_DELAY_MS)).await);
    let attempts: Arc<Mutex<HashMap<u64, Attempt>>> = Arc::default();
    let fences: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let next_value = Arc::new(std::sync::atomic::AtomicU64::new(1));
    // Six seconds of contention, longer (up to 30 s) until at least 10 leases were granted:
    // a loaded machine grants fewer in the same time, and the checks need contention to mean
    // anything.
    let run_for = Duration::from_secs(6);
    let run_at_most = Duration::from_secs(30);
    const ENOUGH_GRANTS: usize = 10;
    let started = Instant::now();
    let clients: Vec<_> = (0..10)
        .map(|client| {
            let (rig, attempts, fences, next_value) = (
                rig.clone(),
                attempts.clone(),
                fences.clone(),
                next_value.clone(),
            );
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(client as u64);
                let http = reqwest::Client::new();
                let write = |id: String, fence: u64, stale: bool| {
                    let value = next_value.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mut request = http.post(rig.url("resources/value/set"));
                    if id != NO_LEASE {
                        request = request.header("X-Lease-Id", id);
                    }
                    let request =
                        request.json(&json!({ "Name": VSET1, "Value": value.to_string() }));
                    let attempts = attempts.clone();
                    async move {
                        let status = request.send().await.unwrap().status().as_u16();
                        attempts.lock().unwrap().insert(
                            value,
                            Attempt {
                                client,
                                fence,
                                status,
                                stale,
                            },
                        );
                        status
                    }
                };
                let go_on = || {
                    let elapsed = started.elapsed();
                    elapsed < run_for
                        || (elapsed < run_at_most && fences.lock().unwrap().len() < ENOUGH_GRANTS)
                };
                while go_on() {
                    let response = http
                        .post(rig.url("lease"))
                        .json(&json!({ "Owner": format!("client {client}"), "TtlMs": 1000 }))
                        .send()
                        .await
                        .unwrap();
                    if response.status() != 200 {
                        // Held or its lock-delay (409), or a lease still ending (423).
                        let status = response.status().as_u16();
                        assert!(status == 409 || status == 423, "acquire: {status}");
                        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..40))).await;
                        continue;
                    }
                    let fence: u64 = response.headers()["x-lease-fence"]
                        .to_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    let body: serde_json::Value = response.json().await.unwrap();
                    let id = body["leaseId"].as_str().unwrap().to_owned();
                    fences.lock().unwrap().push((client, fence));
                    for _ in 0..rng.gen_range(1..6) {
                        write(id.clone(), fence, false).await;
                    }
                    if rng.gen_bool(0.25) {
                        // Crash: never release; the lease runs out after its TTL. Then come
                        // back and write with the dead lease.
                        tokio::time::sleep(Duration::from_millis(1100)).await;
                        let status = write(id.clone(), fence, true).await;
                        assert_ne!(status, 200, "a write with an expired lease went through");
                    } else {
                        let released = http
                            .delete(rig.url(&format!("lease/{id}")))
                            .send()
                            .await
                            .unwrap()
                            .status();
                        // 404 when it ran out first (a slow write on a busy machine).
                        assert!(released == 200 || released == 404, "{released}");
                        let status = write(id, fence, true).await;
                        assert_ne!(status, 200, "a write after release went through");
                    }
                    // Someone without any lease tries too (fine while nobody holds it).
                    write(NO_LEASE.to_owned(), 0, false).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }

    let attempts = attempts.lock().unwrap().clone();
    let fences = fences.lock().unwrap().clone();
    // Fences: every grant has its own, and each client's grants go up.
    let mut all: Vec<u64> = fences.iter().map(|(_, f)| *f).collect();
    all.sort_unstable();
    let granted = all.len();
    all.dedup();
    assert_eq!(all.len(), granted, "a fence was handed out twice");
    for client in 0..10 {
        let mine: Vec<u64> = fences
            .iter()
            .filter(|(c, _)| *c == client)
            .map(|(_, f)| *f)
            .collect();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "client {client}: {mine:?}"
        );
    }
    assert!(
        granted >= ENOUGH_GRANTS,
        "too little contention: {granted} grants in {:?}",
        started.elapsed()
    );

    // The write log, in the order the station applied them.
    let log: Vec<u64> = rig
        .sim
        .write_log()
        .iter()
        .filter(|w| w.channel == VSET1)
        .map(|w| match w.value {
            Value::Float(x) => x as u64,
            ref other => panic!("{other:?}"),
        })
        .collect();
    let mut last_fence = 0;
    let mut last_client = usize::MAX;
    let mut free_write_since = false;
    for value in &log {
        let attempt = attempts
            .get(value)
            .unwrap_or_else(|| panic!("value {value} was never sent"));
        assert!(
            !attempt.stale,
            "a non-holder's write was applied: {attempt:?}"
        );
        assert!(
            [200, 502, 504].contains(&attempt.status),
            "applied although answered {}: {attempt:?}",
            attempt.status
        );
        if attempt.fence == 0 {
            // Without a lease: admitted while nobody held it (answered 200, or 502/504 when
            // in doubt on a loaded machine); the check below holds it to "never while held".
            free_write_since = true;
            continue;
        }
        // Never two holders: once a newer fence wrote, an older one never writes again.
        assert!(
            attempt.fence >= last_fence,
            "fence {} wrote after fence {last_fence}",
            attempt.fence
        );
        if attempt.fence == last_fence {
            assert_eq!(attempt.client, last_client, "two clients under one fence");
            // A lease-less write between two writes of one holder: applied while it held.
            assert!(
                !free_write_since,
                "a write without the lease got in while {attempt:?} held it"
            );
        }
        free_write_since = false;
        last_fence = attempt.fence;
        last_client = attempt.client;
    }
    let ok: Vec<_> = attempts.iter().filter(|(_, a)| a.status == 200).collect();
    for (value, attempt) in &ok {
        assert!(
            log.contains(value),
            "answered 200 but not applied: {attempt:?}"
        );
    }
    // Every grant ends with one write under the ended lease: as many as the grants (the run
    // goes on until there are enough of those).
    let refused = attempts.values().filter(|a| a.stale).count();
    assert!(
        refused >= ENOUGH_GRANTS,
        "too few refused writes to mean anything: {refused}"
    );
    eprintln!(
        "lease invariants: {granted} grants, {} writes answered 200, {} applied, {refused} refused",
        ok.len(),
        log.len()
    );
}

/// One grant as the client that got it saw it.
#[derive(Debug, Clone)]
struct Grant {
    fence: u64,
    owner: String,
    /// When the client had the answer: the gateway granted it before.
    answered_at: tokio::time::Instant,
}

/// The default station with every write to VSET1 taking 40 ms more (a slow channel).
async fn station_with_slow_vset1() -> station_simulator::SimulatorHandle {
    common::station_with_slow_channels(|name| name == VSET1, Duration::from_millis(40), |_| {})
        .await
}

/// Renewals race expiry (1000 ms leases renewed 880–1040 ms after they were last extended, so
/// some land just before the deadline and some just after),
/// writes go to a slow channel, and the station's processing time changes under them; a lease
/// that lapses leaves a safe state. The write log must then be in fence order: every applied
/// change carries the newest fence granted when it was applied, and none of a lease appears
/// after that lease's end (its `lease` event, published once its changes have left the station)
/// or after a safe state that followed it; a lease-less one is applied while nobody held it.
/// One write, midway, takes longer than two request timeouts: answered 504, in doubt, and
/// still applied before its lease's end (or, when it was lease-less, before the next grant).
#[tokio::test]
async fn renewals_racing_expiry_on_a_slow_changing_station_keep_the_write_log_in_fence_order() {
    let sim = station_with_slow_vset1().await;
    let config = config_for(&sim, |config| {
        config.lease.safe_state = vec![station_gateway::config::SafeWrite {
            channel: ON1.into(),
            value: "False".into(),
        }];
        config.station.request_timeout_ms = REQUEST_TIMEOUT_MS;
        config.station.max_processing_ms = Some(MAX_PROCESSING_MS);
        config.lease.lock_delay_ms = Some(LOCK_DELAY_MS);
    });
    let rig = Arc::new(rig_on(sim, config, false).await);
    // Every lease event, with when the test saw it (after the gateway published it).
    let events: Arc<Mutex<Vec<(tokio::time::Instant, station_gateway::lease::LeaseView)>>> =
        Arc::default();
    let lagged = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let collector = tokio::spawn({
        let mut receiver = rig.gateway.gateway.lease_events.subscribe();
        let (events, lagged) = (events.clone(), lagged.clone());
        async move {
            loop {
                match receiver.recv().await {
                    Ok(view) => events
                        .lock()
                        .unwrap()
                        .push((tokio::time::Instant::now(), view)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        lagged.store(true, std::sync::atomic::Ordering::SeqCst)
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    let run_for = Duration::from_secs(14);
    let started = Instant::now();
    // The same moment on the clock the write log and the grants are read on, for messages.
    let origin = tokio::time::Instant::now();
    // Processing-time faults: the station's time per request changes every 150 ms; 3 s in,
    // the next write takes longer than two request timeouts.
    let faults = tokio::spawn({
        let rig = rig.clone();
        async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(99);
            let mut slow_write_armed = false;
            while started.elapsed() < run_for {
                if !slow_write_armed && started.elapsed() >= Duration::from_secs(3) {
                    rig.sim.delay_next_write_to(VSET1, SLOW_WRITE);
                    slow_write_armed = true;
                }
                let processing = [0, 0, 5, 30, 90][rng.gen_range(0..5)];
                rig.sim
                    .set_processing_time(Duration::from_millis(processing));
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            rig.sim.set_processing_time(Duration::ZERO);
        }
    });
    let attempts: Arc<Mutex<HashMap<u64, Attempt>>> = Arc::default();
    let grants: Arc<Mutex<Vec<Grant>>> = Arc::default();
    let next_value = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let renewals = Arc::new(Mutex::new((0usize, 0usize)));
    let clients: Vec<_> = (0..8)
        .map(|client| {
            let (rig, attempts, grants, next_value, renewals) = (
                rig.clone(),
                attempts.clone(),
                grants.clone(),
                next_value.clone(),
                renewals.clone(),
            );
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + client as u64);
                let http = reqwest::Client::new();
                let write = |id: String, fence: u64, stale: bool| {
                    let value = next_value.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mut request = http.post(rig.url("resources/value/set"));
                    if id != NO_LEASE {
                        request = request.header("X-Lease-Id", id);
                    }
                    let request =
                        request.json(&json!({ "Name": VSET1, "Value": value.to_string() }));
                    let attempts = attempts.clone();
                    async move {
                        let status = request.send().await.unwrap().status().as_u16();
                        attempts.lock().unwrap().insert(
                            value,
                            Attempt {
                                client,
                                fence,
                                status,
                                stale,
                            },
                        );
                        status
                    }
                };
                let mut grant_number = 0;
                // On a loaded machine fewer leases fit in `run_for`: the clients go on (up to
                // twice as long) until the grants and renewals the checks below need have
                // happened.
                let go_on = || {
                    let (renewed, too_late) = *renewals.lock().unwrap();
                    let too_few = renewed + too_late < ENOUGH_RENEWALS
                        || grants.lock().unwrap().len() < RACING_GRANTS;
                    started.elapsed() < run_for || (too_few && started.elapsed() < run_for * 2)
                };
                while go_on() {
                    grant_number += 1;
                    let owner = format!("client {client} grant {grant_number}");
                    let asked_at = tokio::time::Instant::now();
                    let response = http
                        .post(rig.url("lease"))
                        .json(&json!({ "Owner": owner, "TtlMs": 1000 }))
                        .send()
                        .await
                        .unwrap();
                    if response.status() != 200 {
                        // Held or its lock-delay (409), a lease still ending (423), or a safe
                        // state still pending (503).
                        let status = response.status().as_u16();
                        assert!(
                            status == 409 || status == 423 || status == 503,
                            "acquire: {status}"
                        );
                        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..40))).await;
                        continue;
                    }
                    let answered_at = tokio::time::Instant::now();
                    let fence: u64 = response.headers()["x-lease-fence"]
                        .to_str()
                        .unwrap()
                        .parse()
                        .unwrap();
                    let body: serde_json::Value = response.json().await.unwrap();
                    let id = body["leaseId"].as_str().unwrap().to_owned();
                    grants.lock().unwrap().push(Grant {
                        fence,
                        owner,
                        answered_at,
                    });
                    // The gateway counts a lease's time from when it took up the request: after
                    // the client asked, before the client had the answer.
                    let mut extended_at = asked_at;
                    let mut extension_answered_at = answered_at;
                    let mut alive = true;
                    for _ in 0..rng.gen_range(1..4) {
                        write(id.clone(), fence, false).await;
                    }
                    for _ in 0..rng.gen_range(0..3) {
                        // Renew close to the deadline: sometimes just before, sometimes after.
                        let renew_at =
                            extended_at + Duration::from_millis(rng.gen_range(880..1040));
                        tokio::time::sleep_until(renew_at).await;
                        let asked_at = tokio::time::Instant::now();
                        let renewed = http
                            .put(rig.url(&format!("lease/{id}")))
                            .send()
                            .await
                            .unwrap()
                            .status()
                            .as_u16();
                        match renewed {
                            200 => {
                                renewals.lock().unwrap().0 += 1;
                                extended_at = asked_at;
                                extension_answered_at = tokio::time::Instant::now();
                            }
                            404 => {
                                renewals.lock().unwrap().1 += 1;
                                alive = false;
                            }
                            other => panic!("renewal answered {other}"),
                        }
                        if !alive {
                            break;
                        }
                        for _ in 0..rng.gen_range(1..3) {
                            write(id.clone(), fence, false).await;
                        }
                    }
                    let how_ended = if alive && rng.gen_bool(0.7) {
                        let released = http
                            .delete(rig.url(&format!("lease/{id}")))
                            .send()
                            .await
                            .unwrap()
                            .status();
                        assert!(released == 200 || released == 404, "{released}");
                        format!("released, answered {released}")
                    } else if alive {
                        // Let it run out unreleased: its safe state is applied. By the answer to
                        // its last extension plus the TTL it has ended in the gateway's count
                        // too, however long the request took to reach it on a loaded machine.
                        tokio::time::sleep_until(
                            extension_answered_at + Duration::from_millis(1050),
                        )
                        .await;
                        format!(
                            "ran out: last extension answered {:?} ago",
                            extension_answered_at.elapsed()
                        )
                    } else {
                        "renewal refused".to_owned()
                    };
                    let status = write(id, fence, true).await;
                    assert_ne!(
                        status, 200,
                        "a write with an ended lease went through ({how_ended}): client {client} grant {grant_number}"
                    );
                    write(NO_LEASE.to_owned(), 0, false).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    faults.await.unwrap();
    // Let the last lease end (released or run out, safe state included) before reading events.
    until(
        Duration::from_secs(10),
        "the lease to be free at the end",
        || {
            !rig.gateway.gateway.lease.view().held
                && rig.gateway.gateway.lease.safe_state_pending().is_none()
        },
    )
    .await;
    let end_seen = tokio::time::Instant::now();
    until(Duration::from_secs(5), "the last lease event", || {
        events
            .lock()
            .unwrap()
            .last()
            .is_some_and(|(_, view)| !view.held && view.safe_state.is_none())
    })
    .await;
    collector.abort();
    assert!(
        !lagged.load(std::sync::atomic::Ordering::SeqCst),
        "the test missed lease events"
    );

    let attempts = attempts.lock().unwrap().clone();
    let grants = grants.lock().unwrap().clone();
    let events = events.lock().unwrap().clone();
    let (renewed, ended_in_renewal) = *renewals.lock().unwrap();
    // When each lease ended, from the events: the first event after its own that is not it.
    let fence_of: HashMap<&str, u64> = grants
        .iter()
        .map(|grant| (grant.owner.as_str(), grant.fence))
        .collect();
    let mut ended_at: HashMap<u64, tokio::time::Instant> = HashMap::new();
    let mut current: Option<u64> = None;
    for (at, view) in &events {
        let now_held = view
            .owner
            .as_deref()
            .filter(|_| view.held)
            .and_then(|owner| fence_of.get(owner).copied());
        if let Some(previous) = current
            && now_held != Some(previous)
        {
            ended_at.entry(previous).or_insert(*at);
        }
        current = now_held;
    }
    let log: Vec<(u64, tokio::time::Instant)> = rig
        .sim
        .write_log()
        .iter()
        .filter(|w| w.channel == VSET1)
        .map(|w| match w.value {
            Value::Float(x) => (x as u64, w.at),
            ref other => panic!("{other:?}"),
        })
        .collect();
    // Every safe state applied (only the safe state writes ON1 here).
    let safe_states_at: Vec<tokio::time::Instant> = rig
        .sim
        .write_log()
        .iter()
        .filter(|w| w.channel == ON1 && w.value == Value::Bool(false))
        .map(|w| w.at)
        .collect();
    let mut last_fence = 0;
    // When the write of `last_fence` was applied, for the message when the order breaks.
    let mut last_applied_at = origin;
    let mut checked = 0;
    let mut in_doubt_applied = 0;
    for (value, applied_at) in &log {
        let attempt = attempts
            .get(value)
            .unwrap_or_else(|| panic!("value {value} was never sent"));
        assert!(
            !attempt.stale,
            "a write of an ended lease was applied: {attempt:?}"
        );
        assert!(
            [200, 502, 504].contains(&attempt.status),
            "applied although answered {}: {attempt:?}",
            attempt.status
        );
        if attempt.fence == 0 {
            // Lease-less, admitted while nobody held it (it may be the slow write, answered
            // 504 and applied later): applied before the next lease was granted, never while
            // one was held.
            let under = grants.iter().find(|grant| {
                let ended = ended_at.get(&grant.fence).copied().unwrap_or(end_seen);
                grant.answered_at < *applied_at && *applied_at < ended
            });
            assert!(
                under.is_none(),
                "a lease-less write was applied while {under:?} held the lease: {attempt:?}"
            );
            continue;
        }
        if attempt.fence < last_fence {
            // Everything a reader needs to tell a late change (in doubt, 504) from an early
            // grant: when each lease was granted and ended, and when both writes landed.
            let grant_of = |fence: u64| {
                grants
                    .iter()
                    .find(|grant| grant.fence == fence)
                    .map(|grant| grant.answered_at - origin)
            };
            let end_of = |fence: u64| ended_at.get(&fence).map(|at| *at - origin);
            panic!(
                "fence {} wrote after fence {last_fence}: {attempt:?} applied at {:?}, fence \
                 {last_fence}'s write at {:?} (from the test's start); fence {} granted at \
                 {:?}, ended at {:?}; fence {last_fence} granted at {:?}; {} safe states at {:?}",
                attempt.fence,
                *applied_at - origin,
                last_applied_at - origin,
                attempt.fence,
                grant_of(attempt.fence),
                end_of(attempt.fence),
                grant_of(last_fence),
                safe_states_at.len(),
                safe_states_at
                    .iter()
                    .map(|at| *at - origin)
                    .collect::<Vec<_>>(),
            );
        }
        last_fence = attempt.fence;
        last_applied_at = *applied_at;
        // The newest fence any client had been granted when the station applied it.
        let newest = grants
            .iter()
            .filter(|grant| grant.answered_at < *applied_at)
            .map(|grant| grant.fence)
            .max();
        assert_eq!(
            newest,
            Some(attempt.fence),
            "a change of fence {} was applied after fence {newest:?} had been granted: {attempt:?}",
            attempt.fence
        );
        let ended = ended_at.get(&attempt.fence).copied().unwrap_or(end_seen);
        assert!(
            *applied_at < ended,
            "a change of fence {} was applied {:?} after its lease's end: {attempt:?}",
            attempt.fence,
            *applied_at - ended
        );
        // A safe state is applied only between leases: none between this lease's grant and
        // its change (the change came before its own lease's safe state).
        let granted_at = grants
            .iter()
            .find(|grant| grant.fence == attempt.fence)
            .map(|grant| grant.answered_at)
            .expect("a grant of every fence that wrote");
        assert!(
            !safe_states_at
                .iter()
                .any(|safe| granted_at < *safe && safe < applied_at),
            "a change of fence {} was applied after a safe state that followed its lease: {attempt:?}",
            attempt.fence
        );
        if attempt.status == 504 {
            in_doubt_applied += 1;
        }
        checked += 1;
    }
    let ok: Vec<_> = attempts.iter().filter(|(_, a)| a.status == 200).collect();
    for (value, attempt) in &ok {
        assert!(
            log.iter().any(|(applied, _)| applied == *value),
            "answered 200 but not applied: {attempt:?}"
        );
    }
    assert!(
        grants.len() >= RACING_GRANTS,
        "too little contention: {} grants",
        grants.len()
    );
    assert!(
        checked >= 10,
        "too few fenced writes to mean anything: {checked}"
    );
    assert!(
        renewed + ended_in_renewal >= ENOUGH_RENEWALS,
        "too few renewals to mean anything: {renewed} extended, {ended_in_renewal} too late"
    );
    // The slow write: answered 504 (in doubt), and the station applied it anyway.
    let in_doubt = attempts.values().filter(|a| a.status == 504).count();
    assert!(
        in_doubt >= 1,
        "no write outlived two request timeouts: the slow-write fault did not bite"
    );
    eprintln!(
        "lease order: {} grants, {checked} fenced writes applied in order, {renewed} renewals in time, \
         {ended_in_renewal} too late, {} lease ends seen, {} safe states, {in_doubt} writes in doubt \
         ({in_doubt_applied} of them applied, each before its lease's end)",
        grants.len(),
        ended_at.len(),
        safe_states_at.len()
    );
}
