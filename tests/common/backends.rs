//! Lease backends for tests that run on each of them: memory, an SQLite file of the test's own,
//! and the machine's PostgreSQL and Redis — the tests' own database on each
//! (`LEASE_TEST_POSTGRES_URL`, default `station_gateway_test`; `LEASE_TEST_REDIS_URL`, default
//! database 15), never the user's. A shared backend that cannot be reached fails the test,
//! naming it and the fix; nothing is skipped.

use std::sync::Arc;
use std::time::Duration;

use station_gateway::lease::{BackendUrl, LeaseKind, LeaseStore, LeaseStoreError, LeaseToken};

fn postgres_url() -> String {
    std::env::var("LEASE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/station_gateway_test".into())
}

fn redis_url() -> String {
    std::env::var("LEASE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/15".into())
}

/// Fails the test when the shared backend at `url` cannot be reached, saying how to get one.
async fn ensure_reachable(url: &str) {
    let reached = async {
        let store = BackendUrl::parse(url)?.open().await?;
        store.holders(LeaseKind::Exclusive, "test:probe").await?;
        Ok::<_, LeaseStoreError>(())
    }
    .await;
    if let Err(error) = reached {
        panic!(
            "the lease backend {url} cannot be reached: {error}. Set LEASE_TEST_POSTGRES_URL or \
             LEASE_TEST_REDIS_URL to a reachable one, or run `bash tests/run-all.sh`."
        );
    }
}

/// A control lease name of the calling test's own, for `lease.name`. Tests on one shared
/// backend (PostgreSQL, Redis) run at once, and the default name comes from the station's
/// address: a simulator port that a finished test used can come back to the next test while
/// the finished test's lease still lives in the backend (CI saw a 409 "held by TAT station 4"
/// that way, from another test's lease).
pub fn own_lease_name(test: &str) -> String {
    format!("control:{test}-{}", &LeaseToken::random().as_str()[..12])
}

/// A backend URL for one test, and what to remove afterwards.
pub struct Backend {
    pub url: String,
    file: Option<std::path::PathBuf>,
}

impl Backend {
    pub async fn named(kind: &str) -> Backend {
        match kind {
            "memory" => Backend {
                url: "memory".into(),
                file: None,
            },
            "sqlite" => {
                let path = std::env::temp_dir().join(format!(
                    "station-gateway-hangup-{}.db",
                    &LeaseToken::random().as_str()[..16]
                ));
                Backend {
                    url: format!("sqlite:{}", path.display()),
                    file: Some(path),
                }
            }
            "postgres" => Backend::shared(postgres_url()).await,
            "redis" => Backend::shared(redis_url()).await,
            other => panic!("no backend {other}"),
        }
    }

    async fn shared(url: String) -> Backend {
        ensure_reachable(&url).await;
        Backend { url, file: None }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A store whose refresh answers only after `delay`, as a slow database would.
pub struct SlowRefresh {
    pub inner: Arc<dyn LeaseStore>,
    pub delay: Duration,
}

impl LeaseStore for SlowRefresh {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: station_gateway::lease::AcquireRequest,
    ) -> futures::future::BoxFuture<'a, Result<station_gateway::lease::Acquisition, LeaseStoreError>>
    {
        self.inner.try_acquire_kind(kind, name, request)
    }

    fn refresh_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<station_gateway::lease::LeaseGrant>, LeaseStoreError>,
    > {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            self.inner.refresh_kind(kind, name, token, ttl).await
        })
    }

    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> futures::future::BoxFuture<'a, Result<bool, LeaseStoreError>> {
        self.inner.release_kind(kind, name, token)
    }

    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Vec<station_gateway::lease::LeaseGrant>, LeaseStoreError>,
    > {
        self.inner.holders(kind, name)
    }
}

/// The PostgreSQL database for the value history's archive tests (`LEASE_TEST_POSTGRES_URL`,
/// default `station_gateway_test`), with a connection to it; fails the test, naming the URL and
/// the fix, when it cannot be reached. Nothing is skipped.
pub async fn history_postgres() -> (String, tokio_postgres::Client) {
    let url = postgres_url();
    match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(async move {
                let _ = connection.await;
            });
            (url, client)
        }
        Err(error) => panic!(
            "the history archive tests need PostgreSQL at {url}: {error}. Set \
             LEASE_TEST_POSTGRES_URL to a reachable one, or run `bash tests/run-all.sh`."
        ),
    }
}

/// Drops an archive test's table and the tables the archive keeps beside it.
pub async fn drop_history_tables(client: &tokio_postgres::Client, table: &str) {
    client
        .batch_execute(&format!(
            "DROP TABLE {table}, {table}_minutes, {table}_meta, {table}_batches"
        ))
        .await
        .unwrap();
}

/// Now, in milliseconds since the Unix epoch (the archive's time axis).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A table name of the test's own, so tests running at once never share one.
pub fn history_table(test: &str) -> String {
    format!(
        "history_test_{test}_{}",
        &LeaseToken::random().as_str()[..8].to_lowercase()
    )
}
