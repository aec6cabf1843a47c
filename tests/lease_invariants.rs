//! Lease invariants under load: many HTTP clients contend for the control lease with short
//! TTLs while writing; some release, some let it run out, some keep writing with a lease that
//! has ended. Afterwards the simulator's write log must show: never two holders (the fences of
//! applied writes never go back), fences strictly increasing, no write from a non-holder, and
//! every write answered 200 applied.

mod common;

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

#[tokio::test]
async fn contending_clients_never_hold_at_once_and_only_holders_write() {
    let rig = Arc::new(rig(|_| {}).await);
    let attempts: Arc<Mutex<HashMap<u64, Attempt>>> = Arc::default();
    let fences: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let next_value = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let run_for = Duration::from_secs(6);
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
                while started.elapsed() < run_for {
                    let response = http
                        .post(rig.url("lease"))
                        .json(&json!({ "Owner": format!("client {client}"), "TtlMs": 1000 }))
                        .send()
                        .await
                        .unwrap();
                    if response.status() != 200 {
                        assert_eq!(response.status(), 409);
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
    assert!(granted >= 10, "too little contention: {granted} grants");

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
            // Without a lease: applied only if answered 200 (nobody held it then).
            assert_eq!(attempt.status, 200, "{attempt:?}");
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
    let refused = attempts.values().filter(|a| a.stale).count();
    assert!(
        refused > 10,
        "too few refused writes to mean anything: {refused}"
    );
    eprintln!(
        "lease invariants: {granted} grants, {} writes answered 200, {} applied, {refused} refused",
        ok.len(),
        log.len()
    );
}
