//! A Jepsen-style run of failovers: two gateway processes on one station and one shared lease
//! backend, both started `--standby` (whichever finds no owner takes the station), a holder
//! writing every 100 ms through whichever serves, a lease-less writer trying all the while,
//! and a fault at random each round — kill -9, SIGSTOP (SIGCONT once the other took over) or
//! a clean stop — after which the gateway hit comes back as a standby. Then the station's write
//! log is checked against the ownership timeline: no write of a connection after a later
//! connection's first (the old owner wrote nothing once the new one had), no lease-less write
//! applied. The short run (20 failovers on PostgreSQL) is in the default suite; the long one
//! (200) is opt-in: `cargo test --test failover_run -- --ignored`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use common::backends::Backend;
use common::process::GatewayProcess;
use common::*;
use serde_json::{Value as Json, json};
use station_gateway::config::HaMode;
use station_gateway::lease::LeaseToken;

/// The link-owner lease's TTL and the lock-delay of the run; the station takes at most 1 s
/// over a request (so that margin + lock-delay ≥ max processing holds). A renewal may take a
/// third of the TTL: on this 2-core CI machine a PostgreSQL commit took up to 641 ms while the
/// rest of the suite was syncing files (a probe beside a full `bash .ci/run`). A TTL of 1.6 s
/// gave a renewal 533 ms, and an owner whose renewal and its retry both missed that stopped
/// itself in CI runs, failing the round's liveness bound; 3 s gives a renewal 1 s.
const TTL_MS: u64 = 3_000;
const LOCK_DELAY_MS: u64 = 900;
/// A failover after a lapse may take TTL + lock-delay + 2 s.
const BOUND: Duration = Duration::from_millis(TTL_MS + LOCK_DELAY_MS + 2_000);
/// The lease-less writer's channel (the holder writes VSET1): any write of it in the station's
/// log is a lease-less write applied while the lease was held.
const LEASELESS_CHANNEL: &str = "0.4.ESH10000662.VSET2";
/// Set points stay within the channels' range (0 to 3000 V).
const RANGE: u32 = 3_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Pause,
    Stop,
}

/// A small deterministic generator (xorshift), its seed printed so a run can be repeated.
struct Dice(u64);

impl Dice {
    fn fault(&mut self) -> Fault {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        match self.0 % 3 {
            0 => Fault::Kill,
            1 => Fault::Pause,
            _ => Fault::Stop,
        }
    }

    /// A pause of up to one renewal interval (TTL/3) before the fault: the owner's renewals at
    /// any phase.
    fn phase(&mut self) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(self.0 % (TTL_MS / 3))
    }
}

/// Which gateway answered the holder's writes, and when.
#[derive(Default)]
struct Served {
    /// (when, base URL) of every write answered 200.
    writes: Vec<(Instant, String)>,
}

/// A write through the gateway at `base_url`: the holder's of VSET1 under `lease_id`, or a
/// lease-less one of [`LEASELESS_CHANNEL`].
async fn post_write(
    http: &reqwest::Client,
    base_url: &str,
    lease_id: Option<&str>,
    value: u32,
) -> u16 {
    let channel = if lease_id.is_some() {
        VSET1
    } else {
        LEASELESS_CHANNEL
    };
    let mut request = http
        .post(format!("{base_url}/api/resources/value/set"))
        .json(&json!({ "Name": channel, "Value": (value % RANGE).to_string() }))
        .timeout(Duration::from_millis(300));
    if let Some(id) = lease_id {
        request = request.header("X-Lease-Id", id);
    }
    match request.send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

async fn ready(http: &reqwest::Client, base_url: &str) -> bool {
    let asked = http
        .get(format!("{base_url}/readyz"))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    asked.is_ok_and(|response| response.status() == 200)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

async fn failover_run(backend: &str, rounds: usize) -> Result<()> {
    let sim = default_simulator().await;
    let id = format!("HV bench {}", &LeaseToken::random().as_str()[..8]);
    let config = config_for(&sim, |c| {
        c.station.id = id.clone();
        c.station.request_timeout_ms = 1_000;
        c.station.max_processing_ms = Some(1_000);
        c.lease.backend = backend.to_owned();
        c.lease.link_owner_ttl_ms = TTL_MS;
        c.lease.link_owner_lock_delay_ms = Some(LOCK_DELAY_MS);
        c.ha.mode = HaMode::Standby;
    });
    config.validate()?;
    let http = reqwest::Client::new();
    let mut gateways = [
        GatewayProcess::start(&config)?,
        GatewayProcess::start(&config)?,
    ];
    let owner_of =
        |gateways: &[GatewayProcess; 2], url: &str| gateways.iter().position(|g| g.base_url == url);
    // The first owner: whichever took the station.
    let since = Instant::now();
    let mut owner = loop {
        let mut found = None;
        for (at, gateway) in gateways.iter().enumerate() {
            if ready(&http, &gateway.base_url).await {
                found = Some(at);
            }
        }
        if let Some(at) = found {
            break at;
        }
        ensure!(since.elapsed() < BOUND * 2, "no gateway took the station");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let response = http
        .post(format!("{}/api/lease", gateways[owner].base_url))
        .json(&json!({ "Owner": "TAT station 3", "TtlMs": 600_000 }))
        .send()
        .await?;
    ensure!(response.status() == 200, "the holder takes the lease");
    let lease_id = response.json::<Json>().await?["leaseId"]
        .as_str()
        .context("a lease id")?
        .to_owned();

    // The holder and the lease-less writer, every 100 ms, through either gateway.
    let urls = Arc::new(Mutex::new(
        gateways
            .iter()
            .map(|g| g.base_url.clone())
            .collect::<Vec<_>>(),
    ));
    let served = Arc::new(Mutex::new(Served::default()));
    let leaseless_applied = Arc::new(Mutex::new(Vec::new()));
    let writers = tokio::spawn({
        let (http, urls, served, leaseless) = (
            http.clone(),
            urls.clone(),
            served.clone(),
            leaseless_applied.clone(),
        );
        let lease_id = lease_id.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut value = 0u32;
            loop {
                tick.tick().await;
                let now: Vec<String> = urls.lock().unwrap().clone();
                for url in now {
                    value += 1;
                    if post_write(&http, &url, Some(&lease_id), value).await == 200 {
                        served
                            .lock()
                            .unwrap()
                            .writes
                            .push((Instant::now(), url.clone()));
                    }
                    value += 1;
                    let status = post_write(&http, &url, None, value).await;
                    if status == 200 {
                        leaseless.lock().unwrap().push((url.clone(), value));
                    }
                }
            }
        }
    });

    let mut dice = Dice(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64
            | 1,
    );
    eprintln!(
        "failover run: {rounds} rounds on {backend}, seed {}",
        dice.0
    );
    let mut times: Vec<(Fault, Duration)> = Vec::new();
    for round in 0..rounds {
        let fault = dice.fault();
        tokio::time::sleep(dice.phase()).await;
        let other = 1 - owner;
        let other_url = gateways[other].base_url.clone();
        let struck = Instant::now();
        match fault {
            Fault::Kill => gateways[owner].signal("-KILL")?,
            Fault::Pause => gateways[owner].signal("-STOP")?,
            Fault::Stop => gateways[owner].signal("-TERM")?,
        }
        // The other serves the holder.
        let took = loop {
            let first = served
                .lock()
                .unwrap()
                .writes
                .iter()
                .find(|(at, url)| *at > struck && *url == other_url)
                .map(|(at, _)| *at);
            if let Some(at) = first {
                break at - struck;
            }
            if struck.elapsed() > BOUND + Duration::from_secs(3) {
                bail!(
                    "round {round} ({fault:?}): the standby did not serve within {BOUND:?}\n--- the struck owner's log:\n{}\n--- the standby's log:\n{}",
                    gateways[owner].log_tail(),
                    gateways[other].log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        ensure!(
            took <= BOUND,
            "round {round} ({fault:?}): failover took {took:?}, more than TTL + lock-delay + 2 s"
        );
        times.push((fault, took));
        // The one struck comes back as a standby.
        match fault {
            Fault::Kill => {}
            Fault::Pause => {
                gateways[owner].signal("-CONT")?;
                // It finds it lost the link and stops by itself.
                gateways[owner]
                    .ended_within(Duration::from_secs(10))
                    .await
                    .with_context(|| format!("round {round}: the paused owner, woken"))?;
            }
            Fault::Stop => {
                gateways[owner]
                    .ended_within(Duration::from_secs(10))
                    .await
                    .with_context(|| format!("round {round}: the stopped owner"))?;
            }
        }
        gateways[owner] = GatewayProcess::start(&config)?;
        urls.lock().unwrap()[owner] = gateways[owner].base_url.clone();
        owner = other;
        ensure!(owner_of(&gateways, &other_url) == Some(owner));
    }
    writers.abort();

    // The write log against the ownership timeline: each owner's connection is newer than the
    // last; none wrote once a newer one had.
    let log = sim.write_log();
    let mut newest = None;
    let mut owners = 0;
    for (at, write) in log.iter().enumerate() {
        match newest {
            Some(c) if write.connection < c => bail!(
                "write {at} ({:?} = {:?}) from connection {:?} after connection {c:?} had written: two writers",
                write.channel,
                write.value,
                write.connection
            ),
            Some(c) if write.connection == c => {}
            // (Each owner's first write is the holder's, or a lease-less one, caught below.)
            _ => {
                newest = Some(write.connection);
                owners += 1;
            }
        }
    }
    let leaseless = leaseless_applied.lock().unwrap().clone();
    ensure!(
        leaseless.is_empty(),
        "lease-less writes answered 200 while the lease was held: {leaseless:?}"
    );
    let in_log = log
        .iter()
        .filter(|w| w.channel == LEASELESS_CHANNEL)
        .count();
    ensure!(in_log == 0, "{in_log} lease-less writes applied");
    let mut all: Vec<Duration> = times.iter().map(|(_, t)| *t).collect();
    all.sort();
    let report = |fault: Fault| {
        let mut of: Vec<Duration> = times
            .iter()
            .filter(|(f, _)| *f == fault)
            .map(|(_, t)| *t)
            .collect();
        of.sort();
        match of.is_empty() {
            true => format!("{fault:?}: none"),
            false => format!(
                "{fault:?}: {} (median {:?}, max {:?})",
                of.len(),
                percentile(&of, 0.5),
                of[of.len() - 1]
            ),
        }
    };
    eprintln!(
        "failover run on {backend}: {rounds} failovers, {} writes by {owners} owner connections, 0 violations; failover median {:?}, p99 {:?}, max {:?}; {}; {}; {}",
        log.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all[all.len() - 1],
        report(Fault::Kill),
        report(Fault::Pause),
        report(Fault::Stop),
    );
    Ok(())
}

#[tokio::test]
async fn twenty_failovers_on_postgres_leave_one_writer_at_every_moment() -> Result<()> {
    let backend = Backend::named("postgres").await;
    failover_run(&backend.url, 20).await
}

/// The long run, opt-in like the soak test (cargo reports it ignored, `tests/run-all.sh` counts
/// it skipped): `cargo test --test failover_run -- --ignored`, 200 failovers on PostgreSQL;
/// `FAILOVER_RUN_ROUNDS=N` and `FAILOVER_RUN_BACKEND=redis|sqlite|postgres` change it.
#[tokio::test]
#[ignore = "opt-in, several minutes: cargo test --test failover_run -- --ignored (FAILOVER_RUN_ROUNDS, FAILOVER_RUN_BACKEND)"]
async fn two_hundred_failovers_leave_one_writer_at_every_moment() -> Result<()> {
    let rounds = match std::env::var("FAILOVER_RUN_ROUNDS") {
        Ok(rounds) => rounds.parse().context("FAILOVER_RUN_ROUNDS: a number")?,
        Err(_) => 200,
    };
    let kind = std::env::var("FAILOVER_RUN_BACKEND").unwrap_or_else(|_| "postgres".into());
    let backend = Backend::named(&kind).await;
    failover_run(&backend.url, rounds).await
}
