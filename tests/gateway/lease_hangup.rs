//! A lease's end is nobody's request: a release, an admin break and a renewal confirmed too
//! late whose client goes away while the ended lease's change is still at the station end the
//! lease all the same (the next acquire succeeds, the admin break finds the new holder), and
//! `/readyz` tells the truth meanwhile. On memory, SQLite, PostgreSQL and Redis.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::backends::Backend;
use common::{config_for, start_gateway, within};
use serde_json::{Value as Json, json};
use station_gateway::GatewayHandle;
use station_gateway::lease::{Access, BackendUrl, ControlLease, LeaseError, LeaseView};
use station_gateway::link::LinkStats;
use station_protocol::Value;
use station_simulator::SimulatorHandle;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

const VSET1: &str = "0.4.ESH10000662.VSET1";
const ON1: &str = "0.4.ESH10000662.ON1";
const ADMIN_TOKEN: &str = "hang-up-admin-token";
/// How long the station takes over every request touching VSET1.
const STATION_TAKES: Duration = Duration::from_millis(1500);
/// Every wait in this file ends within this, or the test fails saying what it waited for.
const BOUND: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Backends.

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

// ---------------------------------------------------------------------------------------------
// Helpers.

/// The default station with VSET1 slow, and a gateway on it with `backend`.
async fn slow_station_and_gateway(backend: &str) -> (SimulatorHandle, GatewayHandle) {
    let sim = common::station_with_slow_channels(|name| name == VSET1, STATION_TAKES, |_| {}).await;
    let gateway = start_gateway(config_for(&sim, |config| {
        config.lease.backend = backend.to_owned();
        config.lease.name = common::backends::own_lease_name("lease-hangup");
        config.lease.admin_token = ADMIN_TOKEN.into();
        config.station.request_timeout_ms = 5_000;
        // The next acquire right after a break (the lock-delay has its own test,
        // tests/gateway/lock_delay.rs).
        config.lease.lock_delay_ms = Some(0);
    }))
    .await;
    (sim, gateway)
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    headers: &[(&str, &str)],
    body: Option<Json>,
) -> Result<(u16, Json)> {
    let mut request = http.request(method, url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.context("the gateway did not answer")?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Json::Null)))
}

/// Takes the control lease over HTTP for `owner`; its id.
async fn take_lease(
    http: &reqwest::Client,
    gateway: &GatewayHandle,
    owner: &str,
) -> Result<String> {
    let (status, body) = call(
        http,
        reqwest::Method::POST,
        format!("{}/api/lease", gateway.base_url()),
        &[],
        Some(json!({ "Owner": owner, "TtlMs": 30000 })),
    )
    .await?;
    ensure!(
        status == 200,
        "taking the lease for {owner}: {status} {body}"
    );
    Ok(body["leaseId"].as_str().context("no leaseId")?.to_owned())
}

/// Sends `[VSET1 = 100, ON1 = True]` under `guard` and returns once the station has it (the
/// frame is sent); the write's answer comes [`STATION_TAKES`] later.
async fn change_at_the_station(
    gateway: &GatewayHandle,
    guard: Option<station_gateway::link::SendGuard>,
) -> tokio::task::JoinHandle<()> {
    let stats = gateway.link().stats().clone();
    let frames_before = LinkStats::get(&stats.frames_sent);
    let link = gateway.link().clone();
    let write = tokio::spawn(async move {
        let results = link
            .write(
                vec![
                    (VSET1.into(), Value::Float(100.0)),
                    (ON1.into(), Value::Bool(true)),
                ],
                guard,
            )
            .await
            .expect("the ended lease's change was sent and answered");
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    });
    within(BOUND, "the change to be sent", async {
        while LinkStats::get(&stats.frames_sent) == frames_before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    write
}

/// Sends `request` (a whole HTTP/1.1 request) on a connection of its own, without reading the
/// answer: dropping the stream hangs up.
async fn send_raw(gateway: &GatewayHandle, request: String) -> TcpStream {
    let mut stream = TcpStream::connect(gateway.http_addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    stream
}

/// Waits until the control lease is between leases (ending): admission refuses a change
/// with "between leases".
async fn until_ending(lease: &ControlLease) {
    common::until(BOUND, "the lease to be ending", || {
        matches!(
            lease.admit(Access::Change, None),
            Err(LeaseError::Ending { .. })
        )
    })
    .await;
}

/// Waits for the first lease event that `wanted` accepts.
async fn lease_event(
    events: &mut broadcast::Receiver<LeaseView>,
    what: &str,
    wanted: impl Fn(&LeaseView) -> bool,
) -> LeaseView {
    within(BOUND, what, async {
        loop {
            match events.recv().await {
                Ok(view) if wanted(&view) => return view,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("lease events closed"),
            }
        }
    })
    .await
}

fn free(view: &LeaseView) -> bool {
    !view.held && view.safe_state.is_none()
}

/// `/readyz`: status and body.
async fn readyz(http: &reqwest::Client, gateway: &GatewayHandle) -> Result<(u16, Json)> {
    call(
        http,
        reqwest::Method::GET,
        format!("{}/readyz", gateway.base_url()),
        &[],
        None,
    )
    .await
}

/// After the hang-up: the lease ends, `/readyz` is 200 once it has, the next acquire
/// succeeds, and the admin break finds that new holder.
async fn the_lease_ends_all_the_same(
    http: &reqwest::Client,
    gateway: &GatewayHandle,
    events: &mut broadcast::Receiver<LeaseView>,
) -> Result<()> {
    lease_event(events, "the lease to end after the client hung up", free).await;
    let (status, body) = readyz(http, gateway).await?;
    ensure!(status == 200, "not ready once the lease ended: {body}");
    take_lease(http, gateway, "TAT station 4").await?;
    let (status, body) = call(
        http,
        reqwest::Method::DELETE,
        format!("{}/api/lease", gateway.base_url()),
        &[("Authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        None,
    )
    .await?;
    ensure!(
        status == 200 && body["broken"]["owner"] == "TAT station 4",
        "the admin break did not find the new holder: {status} {body}"
    );
    Ok(())
}

/// While ending, `/readyz` says so (503, naming the ending lease).
async fn readyz_says_ending(http: &reqwest::Client, gateway: &GatewayHandle) -> Result<()> {
    let (status, body) = readyz(http, gateway).await?;
    let why = body["error"].as_str().unwrap_or_default();
    ensure!(
        status == 503 && why.contains("the control lease is ending"),
        "/readyz while the lease is ending: {status} {body}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The scenarios.

/// The holder releases while its change is at the station and hangs up during the settle.
async fn a_release_whose_client_hangs_up_still_ends_the_lease(backend: &str) -> Result<()> {
    let (_sim, gateway) = slow_station_and_gateway(backend).await;
    let http = reqwest::Client::new();
    let lease = gateway.gateway.lease.clone();
    let mut events = gateway.gateway.lease_events.subscribe();
    let id = take_lease(&http, &gateway, "TAT station 3").await?;
    let guard = lease.admit(Access::Change, Some(&id)).unwrap().guard;
    let change = change_at_the_station(&gateway, guard).await;

    let stream = send_raw(
        &gateway,
        format!("DELETE /api/lease/{id} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"),
    )
    .await;
    until_ending(&lease).await;
    readyz_says_ending(&http, &gateway).await?;
    drop(stream);

    the_lease_ends_all_the_same(&http, &gateway, &mut events).await?;
    within(BOUND, "the change's answer", change).await?;
    gateway.stop().await;
    Ok(())
}

on_every_backend!(a_release_whose_client_hangs_up_still_ends_the_lease:
    a_release_whose_client_hangs_up_still_ends_the_lease_in_memory => "memory",
    a_release_whose_client_hangs_up_still_ends_the_lease_on_sqlite => "sqlite",
    a_release_whose_client_hangs_up_still_ends_the_lease_on_postgres => "postgres",
    a_release_whose_client_hangs_up_still_ends_the_lease_on_redis => "redis",
);

/// An admin breaks the lease while the holder's change is at the station and hangs up during
/// the settle.
async fn an_admin_break_whose_client_hangs_up_still_ends_the_lease(backend: &str) -> Result<()> {
    let (_sim, gateway) = slow_station_and_gateway(backend).await;
    let http = reqwest::Client::new();
    let lease = gateway.gateway.lease.clone();
    let mut events = gateway.gateway.lease_events.subscribe();
    let id = take_lease(&http, &gateway, "TAT station 3").await?;
    let guard = lease.admit(Access::Change, Some(&id)).unwrap().guard;
    let change = change_at_the_station(&gateway, guard).await;

    let stream = send_raw(
        &gateway,
        format!(
            "DELETE /api/lease HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: 0\r\n\r\n"
        ),
    )
    .await;
    until_ending(&lease).await;
    readyz_says_ending(&http, &gateway).await?;
    drop(stream);

    the_lease_ends_all_the_same(&http, &gateway, &mut events).await?;
    within(BOUND, "the change's answer", change).await?;
    gateway.stop().await;
    Ok(())
}

on_every_backend!(an_admin_break_whose_client_hangs_up_still_ends_the_lease:
    an_admin_break_whose_client_hangs_up_still_ends_the_lease_in_memory => "memory",
    an_admin_break_whose_client_hangs_up_still_ends_the_lease_on_sqlite => "sqlite",
    an_admin_break_whose_client_hangs_up_still_ends_the_lease_on_postgres => "postgres",
    an_admin_break_whose_client_hangs_up_still_ends_the_lease_on_redis => "redis",
);

/// A renewal the store confirms only after the deadline (the lease ran out) while the holder's
/// change is at the station; the renewing request goes away while the lease is being ended.
/// The end completes all the same: the change leaves the station, then the lease is free for
/// the next one. (No safe state here: a safe state owed is retried by the expiry task, which
/// would hide the hole.)
async fn a_late_renewal_whose_caller_goes_away_still_ends_the_lease(backend: &str) -> Result<()> {
    const TTL: Duration = Duration::from_millis(1000);
    let (_sim, gateway) = slow_station_and_gateway("memory").await;
    let inner = BackendUrl::parse(backend)?.open().await?;
    let name = common::backends::own_lease_name("hangup");
    let (events, mut receiver) = broadcast::channel(64);
    let lease = Arc::new(
        ControlLease::new(
            Arc::new(common::backends::SlowRefresh {
                inner: inner.clone(),
                delay: Duration::from_millis(600),
            }),
            name.clone(),
            events,
        )
        .with_safe_state(gateway.link().clone(), Vec::new()),
    );
    let shutdown = CancellationToken::new();
    let expiry = tokio::spawn(lease.clone().run_expiry(shutdown.clone()));
    let started = tokio::time::Instant::now();
    let held = lease
        .acquire("TAT station 3".into(), TTL, None, Duration::ZERO)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let guard = lease
        .admit(Access::Change, Some(&held.lease_id))
        .unwrap()
        .guard;
    let change = change_at_the_station(&gateway, guard).await;
    // Renew 200 ms before the deadline; the store answers 400 ms after it, while the change
    // is still at the station.
    tokio::time::sleep_until(started + TTL - Duration::from_millis(200)).await;
    let renewal = tokio::spawn({
        let (lease, id) = (lease.clone(), held.lease_id.clone());
        async move { lease.renew(&id, None).await }
    });
    // The late confirmation was undone in the store: the lease is being ended. Its caller goes.
    within(BOUND, "the late renewal to be undone in the store", async {
        while inner.current(&name).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    renewal.abort();

    lease_event(
        &mut receiver,
        "the lease to end after its renewal's caller went away",
        free,
    )
    .await;
    within(BOUND, "the change's answer", change).await?;
    let next = lease
        .acquire("TAT station 4".into(), TTL, None, Duration::ZERO)
        .await
        .map_err(|e| anyhow::anyhow!("the next acquire after the end: {e}"))?;
    ensure!(next.fence > held.fence, "the fence did not go up");
    shutdown.cancel();
    expiry.await?;
    gateway.stop().await;
    Ok(())
}

on_every_backend!(a_late_renewal_whose_caller_goes_away_still_ends_the_lease:
    a_late_renewal_whose_caller_goes_away_still_ends_the_lease_in_memory => "memory",
    a_late_renewal_whose_caller_goes_away_still_ends_the_lease_on_sqlite => "sqlite",
    a_late_renewal_whose_caller_goes_away_still_ends_the_lease_on_postgres => "postgres",
    a_late_renewal_whose_caller_goes_away_still_ends_the_lease_on_redis => "redis",
);
