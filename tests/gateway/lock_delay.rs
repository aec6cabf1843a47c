//! The lock-delay: after a lease one of whose changes was
//! left in doubt, a new lease waits `lease.lock_delay_ms` — refused 409 with `Retry-After` and
//! why, or queued when it asked to wait — and so does a change without a lease (423); a lease
//! that ended with every change answered, released or run out, frees at once. On memory,
//! SQLite, PostgreSQL and Redis (the change in doubt on memory and SQLite).

use crate::common;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::backends::Backend;
use common::{config_for, default_simulator, start_gateway, within};
use serde_json::{Value as Json, json};
use station_gateway::GatewayHandle;
use station_gateway::lease::LeaseView;
use station_simulator::SimulatorHandle;
use tokio::sync::broadcast;

const LOCK_DELAY_MS: u64 = 2000;
const ON1: &str = "0.4.ESH10000662.ON1";
const VSET1: &str = "0.4.ESH10000662.VSET1";
/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(20);

/// One `#[tokio::test]` per backend for the scenario `$scenario(backend_url)`.
macro_rules! on_every_backend {
    ($scenario:ident: $($test:ident => $kind:literal),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() -> Result<()> {
                let backend = Backend::named($kind).await;
                $scenario(&backend.url).await
            }
        )+
    };
}

/// The default station and a gateway on it with `backend` and the lock-delay.
async fn gateway_on(backend: &str) -> (SimulatorHandle, GatewayHandle) {
    let sim = default_simulator().await;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.lease.backend = backend.to_owned();
        config.lease.name = common::backends::own_lease_name("lock-delay");
        config.lease.lock_delay_ms = Some(LOCK_DELAY_MS);
    }))
    .await;
    (sim, gateway)
}

/// `POST lease` (with `query`, e.g. `?waitMs=N`): the status, the `Retry-After` header and the
/// JSON answer.
async fn acquire(
    gateway: &GatewayHandle,
    query: &str,
    owner: &str,
    ttl_ms: u64,
) -> Result<(u16, Option<String>, Json)> {
    let response = reqwest::Client::new()
        .post(format!("{}/api/lease{query}", gateway.base_url()))
        .json(&json!({ "Owner": owner, "TtlMs": ttl_ms }))
        .send()
        .await?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap_or_default().to_owned());
    Ok((
        status,
        retry_after,
        response.json().await.unwrap_or(Json::Null),
    ))
}

async fn free_again(events: &mut broadcast::Receiver<LeaseView>) {
    within(BOUND, "the lease to be free", async {
        loop {
            match events.recv().await {
                Ok(view) if !view.held && view.safe_state.is_none() => return,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("lease events closed"),
            }
        }
    })
    .await;
}

/// A lease that lapses unreleased with every change of it answered (a write
/// the station confirmed): nothing of it can land late, so the next acquire is served at once
/// — no lock-delay, no `Retry-After` — and `GET api/lease` says nobody holds it and shows no
/// delay.
async fn an_acquire_right_after_an_unreleased_lapse_with_every_change_answered_is_served_at_once(
    backend: &str,
) -> Result<()> {
    let (sim, gateway) = gateway_on(backend).await;
    let mut events = gateway.gateway.lease_events.subscribe();
    let (status, _, body) = acquire(&gateway, "", "TAT station 3", 1000).await?;
    ensure!(status == 200, "{status} {body}");
    let id = body["leaseId"].as_str().context("no leaseId")?.to_owned();
    let written = reqwest::Client::new()
        .post(format!("{}/api/resources/value/set", gateway.base_url()))
        .header("X-Lease-Id", &id)
        .json(&json!({ "Name": VSET1, "Value": "12" }))
        .send()
        .await?;
    ensure!(written.status() == 200, "write: {}", written.status());
    ensure!(
        sim.write_log().iter().any(|record| record.channel == VSET1),
        "the station never saw the write"
    );
    free_again(&mut events).await;
    let view: Json = reqwest::get(format!("{}/api/lease", gateway.base_url()))
        .await?
        .json()
        .await?;
    ensure!(
        view["held"] == false && view.get("lockDelayMs").is_none(),
        "{view}"
    );
    let (status, retry_after, body) = acquire(&gateway, "", "TAT station 4", 30_000).await?;
    ensure!(
        status == 200 && retry_after.is_none(),
        "a lapse with every change answered delayed the next holder: {status} {retry_after:?} {body}"
    );
    ensure!(body["owner"] == "TAT station 4", "{body}");
    gateway.stop().await;
    Ok(())
}

on_every_backend!(an_acquire_right_after_an_unreleased_lapse_with_every_change_answered_is_served_at_once:
    an_acquire_right_after_an_unreleased_lapse_is_served_at_once_on_memory => "memory",
    an_acquire_right_after_an_unreleased_lapse_is_served_at_once_on_sqlite => "sqlite",
    an_acquire_right_after_an_unreleased_lapse_is_served_at_once_on_postgres => "postgres",
    an_acquire_right_after_an_unreleased_lapse_is_served_at_once_on_redis => "redis",
);

/// A clean release with nothing in doubt: the next acquire is served at once.
async fn an_acquire_right_after_a_clean_release_is_served_at_once(backend: &str) -> Result<()> {
    let (_sim, gateway) = gateway_on(backend).await;
    let (status, _, body) = acquire(&gateway, "", "TAT station 3", 30_000).await?;
    ensure!(status == 200, "{status} {body}");
    let id = body["leaseId"].as_str().context("no leaseId")?.to_owned();
    let released = reqwest::Client::new()
        .delete(format!("{}/api/lease/{id}", gateway.base_url()))
        .send()
        .await?;
    ensure!(released.status() == 200, "release: {}", released.status());
    let (status, retry_after, body) = acquire(&gateway, "", "TAT station 4", 30_000).await?;
    ensure!(
        status == 200 && retry_after.is_none(),
        "a clean release delayed the next holder: {status} {retry_after:?} {body}"
    );
    gateway.stop().await;
    Ok(())
}

on_every_backend!(an_acquire_right_after_a_clean_release_is_served_at_once:
    an_acquire_right_after_a_clean_release_is_served_at_once_on_memory => "memory",
    an_acquire_right_after_a_clean_release_is_served_at_once_on_sqlite => "sqlite",
    an_acquire_right_after_a_clean_release_is_served_at_once_on_postgres => "postgres",
    an_acquire_right_after_a_clean_release_is_served_at_once_on_redis => "redis",
);

/// A release whose change is still in doubt past `station.max_processing_ms`: the end waits,
/// resets the link, and the next holder waits the lock-delay (a station that ignored SPEC.md
/// §4 could still carry the change out). Without the change in doubt the same release has no
/// delay (`an_acquire_right_after_a_clean_release_is_served_at_once_…`).
async fn a_release_with_a_change_left_in_doubt_makes_the_next_holder_wait(
    backend: &str,
) -> Result<()> {
    let vset1 = "0.4.ESH10000662.VSET1";
    let sim = common::station_with_slow_channels(
        |name| name == vset1,
        Duration::from_millis(3500),
        |_| {},
    )
    .await;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.lease.backend = backend.to_owned();
        config.lease.lock_delay_ms = Some(LOCK_DELAY_MS);
        config.station.request_timeout_ms = 1000;
        config.station.max_processing_ms = Some(2000);
    }))
    .await;
    let lease = gateway.gateway.lease.clone();
    let held = lease
        .acquire(
            "TAT station 3".into(),
            Duration::from_secs(30),
            None,
            Duration::ZERO,
        )
        .await?;
    let guard = lease
        .admit(station_gateway::lease::Access::Change, Some(&held.lease_id))?
        .guard;
    let sent = Instant::now();
    let in_doubt = gateway
        .link()
        .write(
            vec![(vset1.into(), station_protocol::Value::Float(100.0))],
            guard,
        )
        .await;
    ensure!(
        in_doubt.is_err(),
        "the station takes 3.5 s, the timeout is 1 s"
    );
    // The release waits for the change in doubt, until max_processing_ms and the reset.
    lease.release(&held.lease_id).await?;
    let freed = Instant::now();
    // The acquire is 409 (not now: the clients' word for "someone else has
    // it"), with Retry-After and the reason.
    let (status, retry_after, body) = acquire(&gateway, "", "TAT station 4", 30_000).await?;
    ensure!(status == 409, "not refused the lock-delay: {status} {body}");
    let retry_after: u64 = retry_after
        .context("no Retry-After")?
        .parse()
        .context("Retry-After is not whole seconds")?;
    ensure!(
        (1..=LOCK_DELAY_MS / 1000).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    let message = body["error"].as_str().unwrap_or_default();
    for words in [
        "TAT station 3's lease ended with changes in doubt",
        "lock-delay",
        " ms)",
    ] {
        ensure!(message.contains(words), "{words:?} not in {message}");
    }
    // GET api/lease says nobody holds it, how long the delay lasts and why.
    let view: Json = reqwest::get(format!("{}/api/lease", gateway.base_url()))
        .await?
        .json()
        .await?;
    ensure!(view["held"] == false, "{view}");
    ensure!(view["lockDelayMs"].as_u64().is_some(), "{view}");
    let reason = view["lockDelayReason"].as_str().unwrap_or_default();
    ensure!(
        reason.contains("TAT station 3's lease ended with changes in doubt"),
        "{view}"
    );
    // A change without a lease is refused too, 423 with Retry-After, and never reaches the
    // station: a change of TAT station 3's may still land after it.
    let writes_before = sim.write_log().len();
    let lease_less = reqwest::Client::new()
        .post(format!("{}/api/resources/value/set", gateway.base_url()))
        .json(&json!({ "Name": ON1, "Value": "True" }))
        .send()
        .await?;
    let status = lease_less.status().as_u16();
    let retry_after = lease_less.headers().get("retry-after").cloned();
    let body: Json = lease_less.json().await.unwrap_or(Json::Null);
    ensure!(
        status == 423 && retry_after.is_some(),
        "a lease-less change in the lock-delay: {status} {retry_after:?} {body}"
    );
    ensure!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("lock-delay"),
        "{body}"
    );
    ensure!(
        sim.write_log().len() == writes_before,
        "the refused change reached the station"
    );
    // Served once the delay is over, when it asks to wait.
    let (status, _, body) = acquire(&gateway, "?waitMs=10000", "TAT station 4", 30_000).await?;
    let waited = freed.elapsed();
    ensure!(
        status == 200 && body["owner"] == "TAT station 4",
        "not served after the lock-delay: {status} {body}"
    );
    // The lock-delay runs from the moment the change left doubt unanswered: the longest
    // processing after it was sent.
    let since_sent = sent.elapsed();
    ensure!(
        since_sent >= Duration::from_millis(2000 + LOCK_DELAY_MS) && waited < BOUND,
        "served {since_sent:?} after the change was sent ({waited:?} after the release); its doubt lapsed 2000 ms after it was sent, and the lock-delay is {LOCK_DELAY_MS} ms from then"
    );
    gateway.stop().await;
    Ok(())
}

on_every_backend!(a_release_with_a_change_left_in_doubt_makes_the_next_holder_wait:
    a_release_with_a_change_left_in_doubt_makes_the_next_holder_wait_on_memory => "memory",
    a_release_with_a_change_left_in_doubt_makes_the_next_holder_wait_on_sqlite => "sqlite",
);

/// The order in which the station applied writes to ON1.
fn on1_writes(sim: &SimulatorHandle) -> Vec<station_protocol::Value> {
    sim.write_log()
        .into_iter()
        .filter(|w| w.channel == ON1)
        .map(|w| w.value)
        .collect()
}

/// A restart keeps the lock-delay.
/// A station that ignores SPEC.md §4 and takes 6 s over a write; `A`'s
/// `VSET1`+`ON1=True` is answered 504 (in doubt), A's lease runs out, its end resets the link
/// at `max_processing_ms` and the lock-delay (8 s, counted from then) begins. The gateway is
/// restarted on the same store during the delay: the delay goes on there (`GET api/lease`
/// shows it, B is refused 409), and B, who waits in line, is served only once it is over —
/// after A's late `ON1=True` has landed, so B's `ON1=False` is the station's last write to ON1.
async fn a_gateway_restart_during_the_lock_delay_keeps_it(backend: &str) -> Result<()> {
    const SLOW_WRITE: Duration = Duration::from_secs(6);
    const LONG_DELAY_MS: u64 = 8000;
    let sim = common::station_with_slow_channels(|name| name == VSET1, SLOW_WRITE, |_| {}).await;
    sim.set_ignores_close(true);
    let config = config_for(&sim, |config| {
        config.lease.backend = backend.to_owned();
        config.lease.name = common::backends::own_lease_name("lock-delay-restart");
        config.lease.lock_delay_ms = Some(LONG_DELAY_MS);
        config.station.request_timeout_ms = 1000;
        config.station.max_processing_ms = Some(2000);
    });
    let first = start_gateway(config.clone()).await;
    let lease = first.gateway.lease.clone();
    let mut events = first.gateway.lease_events.subscribe();
    let held = lease
        .acquire(
            "TAT station 3".into(),
            Duration::from_millis(1500),
            None,
            Duration::ZERO,
        )
        .await?;
    let guard = lease
        .admit(station_gateway::lease::Access::Change, Some(&held.lease_id))?
        .guard;
    let sent = Instant::now();
    let slow_on = vec![
        (VSET1.into(), station_protocol::Value::Float(100.0)),
        (ON1.into(), station_protocol::Value::Bool(true)),
    ];
    let in_doubt = first.link().write(slow_on, guard).await;
    ensure!(
        in_doubt.is_err(),
        "the station takes 6 s, the timeout is 1 s"
    );
    free_again(&mut events).await;
    let view = lease.view();
    ensure!(
        view.lock_delay_ms.is_some_and(|left| left > 4000),
        "the first gateway shows no lock-delay: {view:?}"
    );
    ensure!(on1_writes(&sim).is_empty(), "A's change landed too early");
    first.stop().await;

    let second = start_gateway(config).await;
    // What went wrong is gathered, so that the write log is checked (and shown) in any case.
    let mut wrong = Vec::new();
    let shown = reqwest::get(format!("{}/api/lease", second.base_url()))
        .await?
        .json::<Json>()
        .await?;
    if !(shown["held"] == false
        && shown["lockDelayMs"]
            .as_u64()
            .is_some_and(|left| left > 2000))
    {
        wrong.push(format!(
            "after the restart GET api/lease shows no lock-delay: {shown}"
        ));
    }
    let (status, retry_after, body) = acquire(&second, "", "TAT station 4", 30_000).await?;
    let message = body["error"].as_str().unwrap_or_default();
    if !(status == 409
        && retry_after.is_some()
        && message.contains("TAT station 3's lease ended with changes in doubt"))
    {
        wrong.push(format!(
            "after the restart B was not refused the lock-delay: {status} {body}"
        ));
    }
    // B waits in line for it (or, granted at once, holds it already).
    let body = match status {
        200 => body,
        _ => {
            let (status, _, body) =
                acquire(&second, "?waitMs=15000", "TAT station 4", 30_000).await?;
            ensure!(
                status == 200,
                "B not served after the lock-delay: {status} {body}"
            );
            body
        }
    };
    let served = sent.elapsed();
    let b_id = body["leaseId"].as_str().context("no leaseId")?.to_owned();
    let guard = second
        .gateway
        .lease
        .admit(station_gateway::lease::Access::Change, Some(&b_id))?
        .guard;
    second
        .link()
        .write(
            vec![(ON1.into(), station_protocol::Value::Bool(false))],
            guard,
        )
        .await?
        .remove(0)?;
    // A's late change lands at 6 s whatever happens; B's comes after it only if B waited.
    common::until(BOUND, "A's late ON1=True to land", || {
        on1_writes(&sim).contains(&station_protocol::Value::Bool(true))
    })
    .await;
    let written = on1_writes(&sim);
    if written
        != [
            station_protocol::Value::Bool(true),
            station_protocol::Value::Bool(false),
        ]
    {
        wrong.push(format!(
            "A's late ON1=True landed inside B's lease (B served {} ms after A's write was sent): the station's writes to ON1 were {written:?}",
            served.as_millis()
        ));
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("; "));
    eprintln!(
        "measured ({backend}): B served {} ms after A's change in doubt was sent (the station carries it out at {} ms)",
        served.as_millis(),
        SLOW_WRITE.as_millis()
    );
    second.stop().await;
    Ok(())
}

on_every_backend!(a_gateway_restart_during_the_lock_delay_keeps_it:
    a_gateway_restart_during_the_lock_delay_keeps_it_on_sqlite => "sqlite",
    a_gateway_restart_during_the_lock_delay_keeps_it_on_postgres => "postgres",
    a_gateway_restart_during_the_lock_delay_keeps_it_on_redis => "redis",
);

/// A restart after `kill -9` keeps the lock-delay.
/// the gateway as a process of its own on an SQLite store,
/// with its link-owner state file; ON1 takes 6 s at a station that ignores SPEC.md §4. A's
/// `ON1=True` is answered 504 (in doubt), A's lease runs out and the lock-delay (8 s from the
/// settle) begins; the gateway is killed (-9) during it and started again with the same file
/// and store. B is refused 409 and, waiting in line, is granted only after A's late `ON1=True`
/// has landed (the write log's instant): never inside B's lease.
#[tokio::test]
async fn a_gateway_killed_during_the_lock_delay_keeps_it_after_its_restart() -> Result<()> {
    let backend = Backend::named("sqlite").await;
    let sim =
        common::station_with_slow_channels(|name| name == ON1, Duration::from_secs(6), |_| {})
            .await;
    sim.set_ignores_close(true);
    let state = std::env::temp_dir().join(format!(
        "sg-lock-delay-kill-{}.state",
        &station_gateway::lease::LeaseToken::random().as_str()[..12]
    ));
    let config = config_for(&sim, |config| {
        config.lease.backend = backend.url.clone();
        config.lease.name = common::backends::own_lease_name("lock-delay-kill");
        config.lease.lock_delay_ms = Some(8000);
        config.lease.link_owner_state = state.display().to_string();
        config.station.request_timeout_ms = 1000;
        config.station.max_processing_ms = Some(2000);
    });
    let http = reqwest::Client::new();
    let first = common::process::GatewayProcess::start(&config)?;
    let ready = |process: &common::process::GatewayProcess| {
        let url = format!("{}/readyz", process.base_url);
        let http = http.clone();
        within(BOUND, "the gateway process to be ready", async move {
            while !http.get(&url).send().await.is_ok_and(|r| r.status() == 200) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    ready(&first).await;
    let lease_url =
        |process: &common::process::GatewayProcess| format!("{}/api/lease", process.base_url);
    let taken: Json = http
        .post(lease_url(&first))
        .json(&json!({ "Owner": "TAT station 3", "TtlMs": 1500 }))
        .send()
        .await?
        .json()
        .await?;
    let a_id = taken["leaseId"].as_str().context("no leaseId")?.to_owned();
    let sent = Instant::now();
    let written = http
        .post(format!("{}/api/resources/value/set", first.base_url))
        .header("X-Lease-Id", &a_id)
        .json(&json!({ "Name": ON1, "Value": "True" }))
        .send()
        .await?;
    let (status, body) = (written.status(), written.text().await?);
    ensure!(status == 504, "A's change is not in doubt: {status} {body}");
    within(BOUND, "the first gateway to show the lock-delay", async {
        loop {
            let view: Json = http
                .get(lease_url(&first))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if view["lockDelayMs"].as_u64().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    first.signal("-KILL")?;
    drop(first);

    let second = common::process::GatewayProcess::start(&config)?;
    let restarted = within(BOUND, "the restarted gateway to serve api/lease", async {
        loop {
            match http.get(lease_url(&second)).send().await {
                Ok(response) if response.status() == 200 => {
                    return response.json::<Json>().await.unwrap();
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    eprintln!(
        "restarted {} ms after A's change was sent: {restarted}",
        sent.elapsed().as_millis()
    );
    let mut wrong = Vec::new();
    let refused = http
        .post(lease_url(&second))
        .json(&json!({ "Owner": "TAT station 4", "TtlMs": 30000 }))
        .send()
        .await?;
    let status = refused.status().as_u16();
    if status != 409 {
        wrong.push(format!(
            "after the restart B was not refused the lock-delay: {status}"
        ));
    }
    if status != 200 {
        let served = http
            .post(format!("{}?waitMs=15000", lease_url(&second)))
            .json(&json!({ "Owner": "TAT station 4", "TtlMs": 30000 }))
            .send()
            .await?;
        ensure!(
            served.status() == 200,
            "B not served after the lock-delay: {}",
            served.status()
        );
    }
    let granted = tokio::time::Instant::now();
    common::until(BOUND, "A's late ON1=True to land", || {
        !on1_writes(&sim).is_empty()
    })
    .await;
    let landed = sim
        .write_log()
        .into_iter()
        .find(|w| w.channel == ON1)
        .context("A's change")?;
    if landed.at > granted {
        wrong.push(format!(
            "A's late ON1=True landed {} ms inside B's lease",
            (landed.at - granted).as_millis()
        ));
    }
    let _ = std::fs::remove_file(&state);
    ensure!(wrong.is_empty(), "{}", wrong.join("; "));
    Ok(())
}
