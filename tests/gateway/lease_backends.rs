//! The gateway's side of the lease backends: the control lease surviving a gateway restart on
//! a shared backend, and the named leases and semaphores of lab scripts over HTTP (`/v1/`).
//! The engine's own behavioural suite, on all four backends, is `lease/tests/backends.rs`.

use crate::common;

use anyhow::{Context, Result, ensure};
use serde_json::{Value as Json, json};
use station_gateway::lease::{BackendUrl, LeaseKind, LeaseStoreError, LeaseToken};

fn postgres_url() -> String {
    std::env::var("LEASE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/station_gateway_test".into())
}

fn redis_url() -> String {
    std::env::var("LEASE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/15".into())
}

/// Fails the test when the shared backend at `url` cannot be reached, saying how to get one.
async fn ensure_reachable(service: &str, variable: &str, url: &str) {
    let reached = async {
        let store = BackendUrl::parse(url)?.open().await?;
        store.holders(LeaseKind::Exclusive, "test:probe").await?;
        Ok::<_, LeaseStoreError>(())
    }
    .await;
    if let Err(error) = reached {
        panic!(
            "{service} cannot be reached at {url}: {error}. The {service} lease tests need a \
             {service} server: set {variable} to the URL of a reachable one, or run \
             `bash tests/run-all.sh`, which starts a private {service} when none is reachable."
        );
    }
}

/// A fresh SQLite file in the temp directory.
fn sqlite_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "station-gateway-lease-{}.db",
        &LeaseToken::random().as_str()[..16]
    ))
}

// ---------------------------------------------------------------------------------------------
// The gateway's control lease and the named leases over HTTP.

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
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
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Json::Null)))
}

#[tokio::test]
async fn the_control_lease_survives_a_gateway_restart_on_sqlite() -> Result<()> {
    let path = sqlite_path();
    let survived =
        the_control_lease_survives_a_gateway_restart(&format!("sqlite:{}", path.display())).await;
    let _ = std::fs::remove_file(&path);
    survived
}

#[tokio::test]
async fn the_control_lease_survives_a_gateway_restart_on_postgres() -> Result<()> {
    let url = postgres_url();
    ensure_reachable("PostgreSQL", "LEASE_TEST_POSTGRES_URL", &url).await;
    the_control_lease_survives_a_gateway_restart(&url).await
}

#[tokio::test]
async fn the_control_lease_survives_a_gateway_restart_on_redis() -> Result<()> {
    let url = redis_url();
    ensure_reachable("Redis", "LEASE_TEST_REDIS_URL", &url).await;
    the_control_lease_survives_a_gateway_restart(&url).await
}

/// A lease taken through one gateway on `backend` is held, with the same id and fence, by the
/// next gateway on it. The lease has a name of its own, so runs never meet on a shared backend.
async fn the_control_lease_survives_a_gateway_restart(backend: &str) -> Result<()> {
    use reqwest::Method;
    let name = common::backends::own_lease_name("test");
    let sim =
        station_simulator::Simulator::start(common::default_profile(), "127.0.0.1:0".parse()?)
            .await?;
    let config = common::config_for(&sim, |config| {
        config.lease.backend = backend.to_owned();
        config.lease.name = name.clone();
    });
    let http = reqwest::Client::new();

    let first = common::start_gateway(config.clone()).await;
    let api = |gateway: &station_gateway::GatewayHandle, path: &str| {
        format!("{}/api/{path}", gateway.base_url())
    };
    let (status, taken) = call(
        &http,
        Method::POST,
        &api(&first, "lease"),
        &[],
        Some(json!({ "Owner": "TAT station 3", "TtlMs": 60000 })),
    )
    .await?;
    ensure!(status == 200, "{status} {taken}");
    let id = taken["leaseId"].as_str().context("no leaseId")?.to_owned();
    let fence = taken["fence"].as_u64().context("no fence")?;
    first.stop().await;

    let second = common::start_gateway(config).await;
    let (status, view) = call(&http, Method::GET, &api(&second, "lease"), &[], None).await?;
    ensure!(status == 200 && view["held"] == true, "{status} {view}");
    ensure!(view["owner"] == "TAT station 3", "{view}");
    let left = view["expiresInMs"].as_u64().unwrap_or(0);
    ensure!(
        left > 50_000 && left <= 60_000,
        "{left} ms left after the restart"
    );
    let (status, renewed) = call(
        &http,
        Method::PUT,
        &api(&second, &format!("lease/{id}")),
        &[],
        Some(json!({})),
    )
    .await?;
    ensure!(status == 200, "{status} {renewed}");
    ensure!(
        renewed["leaseId"] == id.as_str() && renewed["fence"] == fence,
        "{renewed}"
    );
    // Someone else is still refused: the lease held before the restart is held after it.
    let (status, _) = call(
        &http,
        Method::POST,
        &api(&second, "lease"),
        &[],
        Some(json!({ "Owner": "someone else" })),
    )
    .await?;
    ensure!(status == 409, "someone else got {status}");
    // Released through the second gateway, it is free on the backend too.
    let (status, released) = call(
        &http,
        Method::DELETE,
        &api(&second, &format!("lease/{id}")),
        &[],
        None,
    )
    .await?;
    ensure!(status == 200, "{status} {released}");
    second.stop().await;
    Ok(())
}

#[tokio::test]
async fn named_leases_and_semaphores_over_http() -> Result<()> {
    use reqwest::Method;
    let rig = common::rig(|_| {}).await;
    let http = reqwest::Client::new();
    let base = rig.gateway.base_url();
    let lease_url = format!("{base}/v1/leases/dataset-42");
    let (status, taken) = call(
        &http,
        Method::POST,
        &lease_url,
        &[],
        Some(json!({ "ttlMs": 5000, "owner": "importer A" })),
    )
    .await?;
    ensure!(status == 200, "{status} {taken}");
    let token = taken["token"].as_str().context("no token")?.to_owned();
    let fence = taken["fence"].as_u64().context("no fence")?;
    ensure!(taken["expiresInMs"].as_u64() > Some(4000), "{taken}");

    let (status, refused) = call(
        &http,
        Method::POST,
        &lease_url,
        &[],
        Some(json!({ "ttlMs": 5000, "owner": "importer B", "waitMs": 200 })),
    )
    .await?;
    ensure!(status == 409, "{status} {refused}");
    ensure!(
        refused["error"]
            .as_str()
            .unwrap_or("")
            .contains("importer A"),
        "{refused}"
    );

    let (status, view) = call(&http, Method::GET, &lease_url, &[], None).await?;
    ensure!(
        status == 200 && view["held"] == true && view["owner"] == "importer A",
        "{view}"
    );
    ensure!(
        view["fence"] == fence && !view.to_string().contains(&token),
        "{view}"
    );

    let with_token = [("X-Lease-Token", token.as_str())];
    let (status, renewed) = call(
        &http,
        Method::PUT,
        &lease_url,
        &with_token,
        Some(json!({ "ttlMs": 8000 })),
    )
    .await?;
    ensure!(
        status == 200 && renewed["expiresInMs"].as_u64() > Some(7000),
        "{status} {renewed}"
    );
    let (status, _) = call(
        &http,
        Method::PUT,
        &lease_url,
        &[("X-Lease-Token", "wrong")],
        None,
    )
    .await?;
    ensure!(status == 404, "a wrong token renewed: {status}");
    // A retry of the same job with its token gets its own lease back.
    let (status, again) = call(
        &http,
        Method::POST,
        &lease_url,
        &with_token,
        Some(json!({ "ttlMs": 5000, "owner": "importer A" })),
    )
    .await?;
    ensure!(status == 200 && again["fence"] == fence, "{status} {again}");
    let (status, _) = call(&http, Method::DELETE, &lease_url, &with_token, None).await?;
    ensure!(status == 200);
    let (status, _) = call(&http, Method::DELETE, &lease_url, &with_token, None).await?;
    ensure!(status == 404, "released twice: {status}");
    let (status, _) = call(&http, Method::PUT, &lease_url, &with_token, None).await?;
    ensure!(status == 404, "renewed after release: {status}");

    // Semaphores: two slots, the third is refused; GET lists holders with their slots.
    let sem_url = format!("{base}/v1/semaphores/ramp?slots=2");
    let mut slots = Vec::new();
    for who in ["s1", "s2"] {
        let (status, held) = call(
            &http,
            Method::POST,
            &sem_url,
            &[],
            Some(json!({ "ttlMs": 5000, "owner": who })),
        )
        .await?;
        ensure!(status == 200, "{status} {held}");
        slots.push(held["slot"].as_u64().context("no slot")?);
    }
    slots.sort();
    ensure!(slots == [0, 1], "{slots:?}");
    let (status, _) = call(
        &http,
        Method::POST,
        &sem_url,
        &[],
        Some(json!({ "ttlMs": 5000 })),
    )
    .await?;
    ensure!(status == 409, "a third of two slots: {status}");
    let (status, view) = call(&http, Method::GET, &sem_url, &[], None).await?;
    ensure!(
        status == 200 && view["holders"].as_array().map(Vec::len) == Some(2),
        "{view}"
    );
    ensure!(
        view["free"] == 0 && view["holders"][0]["slot"] == 0,
        "{view}"
    );

    // Client mistakes are 400s that say what is wrong.
    for (url, body) in [
        (
            format!("{base}/v1/semaphores/ramp"),
            json!({ "ttlMs": 5000 }),
        ),
        (lease_url.clone(), json!({ "ttlMs": 5 })),
        (lease_url.clone(), json!({})),
        (format!("{base}/v1/leases/a%20b"), json!({ "ttlMs": 5000 })),
    ] {
        let (status, error) = call(&http, Method::POST, &url, &[], Some(body)).await?;
        ensure!(status == 400, "{url}: {status} {error}");
    }
    let (status, _) = call(&http, Method::DELETE, &lease_url, &[], None).await?;
    ensure!(status == 400, "DELETE without a token: {status}");
    Ok(())
}

#[tokio::test]
async fn a_semaphores_slots_are_fixed_while_it_has_holders_over_http() -> Result<()> {
    use reqwest::Method;
    let rig = common::rig(|_| {}).await;
    let http = reqwest::Client::new();
    let base = rig.gateway.base_url();
    let one_slot = format!("{base}/v1/semaphores/oven?slots=1");
    let body = json!({ "ttlMs": 5000, "owner": "first" });
    let (status, held) = call(&http, Method::POST, &one_slot, &[], Some(body)).await?;
    ensure!(status == 200, "{status} {held}");
    let many = format!("{base}/v1/semaphores/oven?slots=1000");
    let body = json!({ "ttlMs": 5000, "owner": "greedy" });
    let (status, refused) = call(&http, Method::POST, &many, &[], Some(body)).await?;
    ensure!(
        status == 409,
        "slots=1000 on a held one-slot semaphore: {status} {refused}"
    );
    let message = refused["error"].as_str().unwrap_or("");
    ensure!(
        message.contains("has 1 slots") && message.contains("slots=1"),
        "{refused}"
    );
    let (status, view) = call(&http, Method::GET, &one_slot, &[], None).await?;
    ensure!(
        status == 200 && view["holders"].as_array().map(Vec::len) == Some(1),
        "{view}"
    );
    Ok(())
}

#[tokio::test]
async fn a_client_chosen_token_only_gets_back_the_lease_it_holds_over_http() -> Result<()> {
    use reqwest::Method;
    let rig = common::rig(|_| {}).await;
    let http = reqwest::Client::new();
    let lease_url = format!("{}/v1/leases/dataset-7", rig.gateway.base_url());
    let body = |owner: &str| Some(json!({ "ttlMs": 5000, "owner": owner }));
    let weak = [("X-Lease-Token", "1")];
    // A weak token with the POST of a free lease: taken, with a token of the server's own.
    let (status, taken) = call(&http, Method::POST, &lease_url, &weak, body("A")).await?;
    ensure!(status == 200, "{status} {taken}");
    let token = taken["token"].as_str().context("no token")?.to_owned();
    ensure!(
        token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "the server kept the client's token: {taken}"
    );
    // A second client guessing X-Lease-Token: 1 gets nothing.
    let (status, refused) = call(&http, Method::POST, &lease_url, &weak, body("B")).await?;
    ensure!(
        status == 409,
        "a guessed token got the lease: {status} {refused}"
    );
    let (status, _) = call(&http, Method::PUT, &lease_url, &weak, None).await?;
    ensure!(status == 404, "a guessed token renewed it: {status}");
    let (status, _) = call(&http, Method::DELETE, &lease_url, &weak, None).await?;
    ensure!(status == 404, "a guessed token released it: {status}");
    // The retry with the token the server gave gets the lease back, same fence.
    let mine = [("X-Lease-Token", token.as_str())];
    let (status, again) = call(&http, Method::POST, &lease_url, &mine, body("A")).await?;
    ensure!(
        status == 200 && again["fence"] == taken["fence"] && again["token"] == token.as_str(),
        "{status} {again}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A renewal the store confirms only after the lease's deadline, on every
// backend: the store is wrapped so that its refresh answers late, as a slow database would.

/// While a renewal waits on the store past the lease's deadline, nobody may change the station;
/// the renewal, confirmed too late, does not extend the lease; the store agrees it ended.
async fn a_late_renewal_never_opens_a_gap(url: &str) -> Result<()> {
    use station_gateway::lease::{Access, ControlLease, LeaseError};
    use std::time::Duration;
    const TTL: Duration = Duration::from_millis(1000);
    let inner = BackendUrl::parse(url)?.open().await?;
    let name = format!(
        "control:late-renewal-{}",
        &LeaseToken::random().as_str()[..12]
    );
    let (events, _) = tokio::sync::broadcast::channel(16);
    let lease = std::sync::Arc::new(ControlLease::new(
        std::sync::Arc::new(common::backends::SlowRefresh {
            inner: inner.clone(),
            delay: Duration::from_millis(600),
        }),
        name.clone(),
        events,
    ));
    let started = tokio::time::Instant::now();
    let held = lease
        .acquire("A".into(), TTL, None, Duration::ZERO)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Renew 100 ms before the deadline; the store answers 500 ms after it.
    tokio::time::sleep_until(started + TTL - Duration::from_millis(100)).await;
    let renewal = tokio::spawn({
        let (lease, id) = (lease.clone(), held.lease_id.clone());
        async move { lease.renew(&id, None).await }
    });
    tokio::time::sleep_until(started + TTL + Duration::from_millis(100)).await;
    ensure!(
        !renewal.is_finished(),
        "the slow store answered before the check; the test checked nothing"
    );
    let refusal = lease.admit(Access::Change, None).err();
    ensure!(
        matches!(refusal, Some(LeaseError::Ending { .. })),
        "a non-holder was admitted while the renewal waited past the deadline: {refusal:?}"
    );
    let renewed = renewal.await?;
    ensure!(
        matches!(renewed, Err(LeaseError::NoSuchLease)),
        "a renewal confirmed after the deadline extended the lease: {renewed:?}"
    );
    ensure!(!lease.view().held, "still held after the late renewal");
    ensure!(
        inner.current(&name).await?.is_none(),
        "the store still holds the lease whose renewal came too late"
    );
    Ok(())
}

#[tokio::test]
async fn a_late_renewal_never_opens_a_gap_in_memory() -> Result<()> {
    a_late_renewal_never_opens_a_gap("memory").await
}

#[tokio::test]
async fn a_late_renewal_never_opens_a_gap_on_sqlite() -> Result<()> {
    let path = sqlite_path();
    let result = a_late_renewal_never_opens_a_gap(&format!("sqlite:{}", path.display())).await;
    let _ = std::fs::remove_file(&path);
    result
}

#[tokio::test]
async fn a_late_renewal_never_opens_a_gap_on_postgres() -> Result<()> {
    let url = postgres_url();
    ensure_reachable("PostgreSQL", "LEASE_TEST_POSTGRES_URL", &url).await;
    a_late_renewal_never_opens_a_gap(&url).await
}

#[tokio::test]
async fn a_late_renewal_never_opens_a_gap_on_redis() -> Result<()> {
    let url = redis_url();
    ensure_reachable("Redis", "LEASE_TEST_REDIS_URL", &url).await;
    a_late_renewal_never_opens_a_gap(&url).await
}
