//! Soak: mixed load — readers, a lease holder writing, a writer without the lease,
//! subscriptions on event streams, legacy clients — with faults injected in turn. Two runs of
//! the same soak: a short one in the regular suite (45 s, a fault every 6 s, each kind once),
//! and the long one, ignored by default: N minutes (`SOAK_MINUTES`, default 30) with a fault
//! every minute, `cargo test --release --test soak -- --ignored --nocapture`.
//!
//! The gateway runs as a child process (the station-gateway binary); the simulator and the
//! clients run in this one. Checks: the gateway's memory (RSS) between the end of warm-up and
//! the end (within 10 % on the long run; 15 % on the short one, whose warm-up is short); no
//! request unanswered past the request timeout plus slack; every write answered 200 is in the
//! simulator's write log and none that was refused is.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value as Json, json};
use station_protocol::Value;
use station_simulator::{Profile, Simulator, SimulatorHandle, StationClient};

const VSET2: &str = "0.4.ESH10000662.VSET2";
const TIMEOUT_MS: u64 = 1000;
/// A request answered later than this is "stuck".
const STUCK: Duration = Duration::from_millis(TIMEOUT_MS + 4000);

#[derive(Default)]
struct Tally {
    statuses: Mutex<HashMap<String, u64>>,
    slowest: Mutex<Duration>,
    stuck: AtomicU64,
    /// Value text → status, for the lease holder's writes (VSET1) and the rogue's (VSET2).
    writes: Mutex<HashMap<(String, String), u16>>,
    values_events: AtomicU64,
    legacy_ok: AtomicU64,
    legacy_err: AtomicU64,
}

impl Tally {
    fn record(&self, what: &str, status: u16, took: Duration) {
        *self
            .statuses
            .lock()
            .unwrap()
            .entry(format!("{what} {status}"))
            .or_default() += 1;
        let mut slowest = self.slowest.lock().unwrap();
        *slowest = (*slowest).max(took);
        if took > STUCK {
            self.stuck.fetch_add(1, Ordering::Relaxed);
            eprintln!("stuck: {what} took {took:?}");
        }
    }
}

fn rss_kib_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn value_text(n: u64) -> String {
    format!("{}.{:02}", (n / 100) % 3000, n % 100)
}

async fn timed(
    tally: &Tally,
    what: &str,
    request: reqwest::RequestBuilder,
) -> Option<(u16, reqwest::Response)> {
    let started = Instant::now();
    let result = tokio::time::timeout(STUCK * 2, request.send()).await;
    let took = started.elapsed();
    match result {
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            tally.record(what, status, took);
            Some((status, response))
        }
        Ok(Err(_)) => {
            tally.record(what, 0, took);
            None
        }
        Err(_) => {
            tally.record(what, 999, took);
            None
        }
    }
}

struct Soak {
    sim: SimulatorHandle,
    base: String,
    legacy: SocketAddr,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
}

impl Soak {
    fn url(&self, path: &str) -> String {
        format!("{}/api/{path}", self.base)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_with_every_kind_of_fault() {
    soak(Duration::from_secs(45), Duration::from_secs(6), 0.15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run with --ignored (SOAK_MINUTES, default 30)"]
async fn soak_mixed_load_with_a_fault_every_minute() {
    let minutes: f64 = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(30.0);
    soak(
        Duration::from_secs_f64(minutes * 60.0),
        Duration::from_secs(60),
        0.10,
    )
    .await;
}

/// Runs the soak for `duration` with a fault every `fault_every`; the gateway's RSS may grow
/// by `rss_growth` (a fraction) after warm-up.
async fn soak(duration: Duration, fault_every: Duration, rss_growth: f64) {
    let minutes = duration.as_secs_f64() / 60.0;
    let warm_up = (duration / 5).min(Duration::from_secs(120));
    let sim = Simulator::start(Profile::default_station(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // The gateway runs as its own process, so its memory is measured apart from the
    // simulator's write log and this test's bookkeeping, which grow by design.
    let dir = std::env::temp_dir().join(format!("gateway-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[station]\nurl = \"tcp://{}\"\nrequest_timeout_ms = {TIMEOUT_MS}\nreconnect_max_ms = 500\n\
             [http]\nlisten = \"127.0.0.1:0\"\n[legacy]\nlisten = \"127.0.0.1:0\"\n",
            sim.local_addr()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_station-gateway"))
        .arg("--config")
        .arg(&config)
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let gateway_pid = child.id().unwrap();
    let (addrs_tx, mut addrs) = tokio::sync::mpsc::unbounded_channel();
    for out in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let addrs_tx = addrs_tx.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                for (kind, marker) in [
                    ("http", "HTTP listening on http://"),
                    ("legacy", "legacy byte-protocol listener on "),
                ] {
                    if let Some(at) = line.find(marker) {
                        let rest = &line[at + marker.len()..];
                        let end = rest.find(['"', ' ']).unwrap_or(rest.len());
                        let _ = addrs_tx.send((kind, rest[..end].to_owned()));
                    }
                }
            }
        });
    }
    let (mut http_addr, mut legacy_addr) = (None, None);
    while http_addr.is_none() || legacy_addr.is_none() {
        let (kind, addr) = tokio::time::timeout(Duration::from_secs(20), addrs.recv())
            .await
            .expect("the gateway did not say where it listens")
            .unwrap();
        match kind {
            "http" => http_addr = Some(addr),
            _ => legacy_addr = Some(addr.parse::<SocketAddr>().unwrap()),
        }
    }
    let soak = Arc::new(Soak {
        sim: sim.clone(),
        base: format!("http://{}", http_addr.unwrap()),
        legacy: legacy_addr.unwrap(),
        tally: Arc::default(),
        stop: Arc::default(),
    });
    // Connected: the first read answers.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while http
        .post(soak.url("resources/value/get"))
        .json(&json!({ "Name": MON_3V3 }))
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "the gateway never reached the station"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_kib = || rss_kib_of(gateway_pid);
    let mut tasks = Vec::new();

    // Readers: cached and forced reads of a few channels.
    for reader in 0..6u64 {
        let soak = soak.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let names = [MON_3V3, VMON1, VSET1, "TempRegulator.CPU_TEMP"];
            let mut n = reader;
            while !soak.stop.load(Ordering::Relaxed) {
                n += 1;
                let name = names[(n % 4) as usize];
                let (what, path, body) = if n % 3 == 0 {
                    ("value/get", "resources/value/get", json!({ "Name": name }))
                } else {
                    (
                        "values/get",
                        "resources/values/get",
                        json!({ "Names": names, "MaxAgeMs": 200 }),
                    )
                };
                if let Some((status, response)) =
                    timed(&soak.tally, what, http.post(soak.url(path)).json(&body)).await
                    && status == 200
                {
                    let _ = response.bytes().await;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }));
    }

    // The lease holder: takes the lease, renews it, writes VSET1 with unique values.
    {
        let soak = soak.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = 0u64;
            while !soak.stop.load(Ordering::Relaxed) {
                let Some((200, response)) = timed(
                    &soak.tally,
                    "lease",
                    http.post(soak.url("lease"))
                        .json(&json!({ "Owner": "soak holder", "TtlMs": 5000 })),
                )
                .await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let lease: Json = response.json().await.unwrap();
                let id = lease["leaseId"].as_str().unwrap().to_owned();
                let held_since = Instant::now();
                let mut renewed = Instant::now();
                // Hold for a while, then release and take it again.
                while held_since.elapsed() < Duration::from_secs(20)
                    && !soak.stop.load(Ordering::Relaxed)
                {
                    n += 1;
                    let text = value_text(n);
                    let request = http
                        .post(soak.url("resources/value/set"))
                        .header("X-Lease-Id", &id)
                        .json(&json!({ "Name": VSET1, "Value": text }));
                    let status = timed(&soak.tally, "holder write", request)
                        .await
                        .map_or(0, |(s, _)| s);
                    soak.tally
                        .writes
                        .lock()
                        .unwrap()
                        .insert((VSET1.into(), text), status);
                    if renewed.elapsed() > Duration::from_millis(1500) {
                        let renew = http
                            .put(soak.url(&format!("lease/{id}")))
                            .json(&json!({ "TtlMs": 5000 }));
                        timed(&soak.tally, "renew", renew).await;
                        renewed = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
                timed(
                    &soak.tally,
                    "release",
                    http.delete(soak.url(&format!("lease/{id}"))),
                )
                .await;
            }
        }));
    }

    // A writer without the lease: every write it gets in while the holder holds is refused.
    {
        let soak = soak.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut n = 0u64;
            while !soak.stop.load(Ordering::Relaxed) {
                n += 1;
                let text = value_text(n);
                let request = http
                    .post(soak.url("resources/value/set"))
                    .json(&json!({ "Name": VSET2, "Value": text }));
                let status = timed(&soak.tally, "rogue write", request)
                    .await
                    .map_or(0, |(s, _)| s);
                soak.tally
                    .writes
                    .lock()
                    .unwrap()
                    .insert((VSET2.into(), text), status);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }

    // Event streams with a subscription each, renewed; counting values events.
    for stream in 0..4 {
        let soak = soak.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            while !soak.stop.load(Ordering::Relaxed) {
                let Ok(mut response) = http.get(soak.url("events")).send().await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let mut buf = Vec::new();
                let mut subscription: Option<(String, Instant)> = None;
                while !soak.stop.load(Ordering::Relaxed) {
                    let chunk =
                        match tokio::time::timeout(Duration::from_secs(15), response.chunk()).await
                        {
                            Ok(Ok(Some(chunk))) => chunk,
                            _ => break,
                        };
                    buf.extend_from_slice(&chunk);
                    while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                        let block: Vec<u8> = buf.drain(..end + 2).collect();
                        let text = String::from_utf8_lossy(&block);
                        if text.contains("event: values") {
                            soak.tally.values_events.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(data) = text
                            .contains("event: hello")
                            .then(|| text.lines().find_map(|l| l.strip_prefix("data: ")))
                            .flatten()
                        {
                            let hello: Json = serde_json::from_str(data).unwrap();
                            let body = json!({
                                "StreamId": hello["streamId"],
                                "Channels": [MON_3V3, VMON1, "TempRegulator.CPU_TEMP"],
                                "IntervalMs": 200 + 100 * stream,
                            });
                            if let Some((200, answer)) = timed(
                                &soak.tally,
                                "subscribe",
                                http.post(soak.url("subscriptions")).json(&body),
                            )
                            .await
                            {
                                let answer: Json = answer.json().await.unwrap();
                                let id = answer["id"].as_str().unwrap().to_owned();
                                subscription = Some((id, Instant::now()));
                            }
                        }
                    }
                    if let Some((id, at)) = &mut subscription
                        && at.elapsed() > Duration::from_secs(20)
                    {
                        let body = json!({ "Channels": [MON_3V3, VMON1], "IntervalMs": 250 });
                        timed(
                            &soak.tally,
                            "renew subscription",
                            http.put(soak.url(&format!("subscriptions/{id}")))
                                .json(&body),
                        )
                        .await;
                        *at = Instant::now();
                    }
                }
            }
        }));
    }

    // Legacy clients: connect, hello, read, reconnect on any failure.
    for client in 0..3 {
        let soak = soak.clone();
        tasks.push(tokio::spawn(async move {
            while !soak.stop.load(Ordering::Relaxed) {
                let Ok(mut station) = StationClient::connect(soak.legacy).await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                station.set_timeout(STUCK);
                if station.hello(&format!("soak {client}")).await.is_err() {
                    continue;
                }
                while !soak.stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let result = station.read(&[MON_3V3, VMON1]).await;
                    soak.tally.record(
                        "legacy read",
                        if result.is_ok() { 200 } else { 0 },
                        started.elapsed(),
                    );
                    match result {
                        Ok(_) => soak.tally.legacy_ok.fetch_add(1, Ordering::Relaxed),
                        Err(error) => {
                            let why: String = error.to_string().chars().take(60).collect();
                            soak.tally
                                .record(&format!("legacy error: {why}"), 0, Duration::ZERO);
                            soak.tally.legacy_err.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            break;
                        }
                    };
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }

    // A fault every `fault_every`, round the list; memory sampled along the way.
    let faults = [
        "drop connections",
        "stall 3 s",
        "corrupt a reply",
        "restart",
        "reply delay 1.5 s for 5 s",
        "power off 2 s",
        "remove a channel",
    ];
    let started = Instant::now();
    let mut rss_warm = 0;
    let mut rss_samples = Vec::new();
    let mut minute = 0;
    while started.elapsed() < duration {
        tokio::time::sleep((fault_every / 2).min(Duration::from_secs(5))).await;
        if rss_warm == 0 && started.elapsed() >= warm_up {
            rss_warm = rss_kib();
        }
        rss_samples.push((started.elapsed().as_secs(), rss_kib()));
        if started.elapsed() >= fault_every * (minute + 1) {
            let fault = faults[minute as usize % faults.len()];
            eprintln!(
                "{:>5} s  fault: {fault}  (rss {} KiB)",
                started.elapsed().as_secs(),
                rss_kib()
            );
            match fault {
                "drop connections" => sim.drop_connections(),
                "stall 3 s" => {
                    sim.set_stall(true);
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    sim.set_stall(false);
                }
                "corrupt a reply" => sim.corrupt_next_reply(),
                "restart" => sim.restart(),
                "reply delay 1.5 s for 5 s" => {
                    sim.set_reply_delay(Duration::from_millis(1500));
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    sim.set_reply_delay(Duration::ZERO);
                }
                "power off 2 s" => {
                    sim.power_off().await.unwrap();
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    sim.power_on().await.unwrap();
                }
                _ => {
                    sim.remove_channel("0.8.ESH10000590.ADC08");
                }
            }
            minute += 1;
        }
    }
    soak.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    }
    let rss_end = rss_kib();

    // The write log against what the clients were told.
    let log = soak.sim.write_log();
    let applied: std::collections::HashSet<(String, String)> = log
        .iter()
        .filter_map(|w| match w.value {
            Value::Float(x) => Some((w.channel.clone(), format!("{x:.2}"))),
            _ => None,
        })
        .collect();
    let writes = soak.tally.writes.lock().unwrap().clone();
    let key = |(channel, text): &(String, String)| {
        (
            channel.clone(),
            format!("{:.2}", text.parse::<f64>().unwrap()),
        )
    };
    let mut ok_missing = Vec::new();
    let mut refused_applied = Vec::new();
    let (mut ok, mut refused, mut unknown) = (0, 0, 0);
    for (write, status) in &writes {
        let in_log = applied.contains(&key(write));
        match status {
            200 => {
                ok += 1;
                if !in_log {
                    ok_missing.push(write.clone());
                }
            }
            502 | 504 | 0 | 999 => unknown += 1,
            _ => {
                refused += 1;
                if in_log {
                    refused_applied.push((write.clone(), *status));
                }
            }
        }
    }
    let statuses = soak.tally.statuses.lock().unwrap().clone();
    let mut statuses: Vec<_> = statuses.into_iter().collect();
    statuses.sort();
    eprintln!("--- soak: {minutes:.2} min, {} faults", minute);
    eprintln!("requests by kind and status: {statuses:?}");
    eprintln!(
        "slowest answer {:?}; stuck (> {STUCK:?}): {}",
        *soak.tally.slowest.lock().unwrap(),
        soak.tally.stuck.load(Ordering::Relaxed)
    );
    eprintln!(
        "writes: {ok} answered 200, {refused} refused, {unknown} unknown outcome; {} in the write log",
        log.len()
    );
    eprintln!(
        "values events {}, legacy reads ok {} / failed {}",
        soak.tally.values_events.load(Ordering::Relaxed),
        soak.tally.legacy_ok.load(Ordering::Relaxed),
        soak.tally.legacy_err.load(Ordering::Relaxed)
    );
    eprintln!(
        "RSS: {rss_warm} KiB after warm-up ({warm_up:?}), {rss_end} KiB at the end ({:+.1} %)",
        (rss_end as f64 / rss_warm as f64 - 1.0) * 100.0
    );
    eprintln!("RSS samples (s, KiB): {rss_samples:?}");
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ok_missing.is_empty(),
        "answered 200 but not applied: {ok_missing:?}"
    );
    assert!(
        refused_applied.is_empty(),
        "refused but applied: {refused_applied:?}"
    );
    assert_eq!(
        soak.tally.stuck.load(Ordering::Relaxed),
        0,
        "stuck requests"
    );
    assert!(ok > 0 && refused > 0, "the load did not exercise writes");
    assert!(soak.tally.values_events.load(Ordering::Relaxed) > 0);
    assert!(minute > 0, "no fault was injected");
    assert!(
        rss_end as f64 <= rss_warm as f64 * (1.0 + rss_growth),
        "memory grew from {rss_warm} to {rss_end} KiB"
    );
}
