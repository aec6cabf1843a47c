//! Leases in PostgreSQL (`postgres://...`), shared by every gateway and lab script that reaches
//! the database. The same table and rules as SQLite (see `sqlite`): `sm_lease`, slot 0 for a
//! lease, slots `0..n` and the fence counter in slot -1 for a semaphore, rows never deleted.
//!
//! Every comparison uses the database's clock, `clock_timestamp()` (not `now()`, which stands
//! still for a whole transaction), read after the row locks are held. An acquisition locks the
//! name's fence-counter row (`SELECT ... FOR UPDATE`), so attempts on one name queue.
//!
//! One connection, opened on first use and again after it broke; this process's calls take
//! turns on it.

use std::str::FromStr;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls, Row};
use tracing::warn;

use crate::sqlite::{counter_slot, max_slot};
use crate::store::plan::{
    AcquirePlan, SEMAPHORE_COUNTER_SLOT, SlotRow, duration_to_millis, plan_acquire,
};
use crate::store::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseKind, LeaseStore, LeaseStoreError, LeaseToken,
};

/// How long connecting, and any one operation, may take before it is an error.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS sm_lease (
    name TEXT NOT NULL,
    slot BIGINT NOT NULL,
    holder TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '',
    fence BIGINT NOT NULL DEFAULT 0,
    expires_at BIGINT NOT NULL DEFAULT 0,
    ttl_ms BIGINT NOT NULL DEFAULT 0,
    since_ms BIGINT NOT NULL DEFAULT 0,
    capacity BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (name, slot)
);
ALTER TABLE sm_lease ADD COLUMN IF NOT EXISTS capacity BIGINT NOT NULL DEFAULT 0";

/// The database's clock in milliseconds since the Unix epoch.
const NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

const ROW_COLUMNS: &str = "slot, holder, owner, fence, expires_at, ttl_ms, since_ms, capacity";

/// Leases in one PostgreSQL database.
pub struct PostgresLeaseStore {
    config: tokio_postgres::Config,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for PostgresLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLeaseStore")
            .field("hosts", &self.config.get_hosts())
            .field("dbname", &self.config.get_dbname())
            .finish()
    }
}

impl PostgresLeaseStore {
    /// A store for `url` (`postgres://user@host:port/db`). Connects on first use.
    pub fn new(url: &str) -> Result<PostgresLeaseStore, LeaseStoreError> {
        let mut config =
            tokio_postgres::Config::from_str(url).map_err(|error| LeaseStoreError::BadBackend {
                url: url.to_owned(),
                message: error.to_string(),
            })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(OPERATION_TIMEOUT);
        }
        config.application_name("station-gateway lease store");
        Ok(PostgresLeaseStore {
            config,
            client: Mutex::new(None),
        })
    }

    /// Runs `work` on the connection (opened, and the table created, when needed). A broken or
    /// timed-out connection is dropped so that the next call opens a new one.
    async fn run<T>(
        &self,
        work: impl for<'c> FnOnce(&'c mut Client) -> BoxFuture<'c, Result<T, tokio_postgres::Error>>,
    ) -> Result<T, LeaseStoreError> {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(Client::is_closed) {
            *slot = Some(self.connect().await?);
        }
        let Some(client) = slot.as_mut() else {
            return Err(LeaseStoreError::Unavailable("no connection".into()));
        };
        match tokio::time::timeout(OPERATION_TIMEOUT, work(client)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                if client.is_closed() || error.as_db_error().is_none() {
                    *slot = None;
                }
                Err(postgres_error(&error))
            }
            Err(_) => {
                *slot = None;
                Err(LeaseStoreError::Unavailable(format!(
                    "PostgreSQL did not answer within {} s",
                    OPERATION_TIMEOUT.as_secs()
                )))
            }
        }
    }

    async fn connect(&self) -> Result<Client, LeaseStoreError> {
        let connecting = async {
            let (mut client, connection) = self.config.connect(NoTls).await?;
            tokio::spawn(async move {
                if let Err(error) = connection.await {
                    warn!("lease store: PostgreSQL connection ended: {error}");
                }
            });
            // Concurrent CREATE TABLE IF NOT EXISTS can collide in the catalog: take turns.
            let transaction = client.transaction().await?;
            transaction
                .execute("SELECT pg_advisory_xact_lock(7007007)", &[])
                .await?;
            transaction.batch_execute(SCHEMA).await?;
            transaction.commit().await?;
            Ok::<Client, tokio_postgres::Error>(client)
        };
        match tokio::time::timeout(OPERATION_TIMEOUT, connecting).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(error)) => Err(postgres_error(&error)),
            Err(_) => Err(LeaseStoreError::Unavailable(format!(
                "PostgreSQL could not be reached within {} s",
                OPERATION_TIMEOUT.as_secs()
            ))),
        }
    }
}

fn read_row(row: &Row) -> Result<SlotRow, tokio_postgres::Error> {
    Ok(SlotRow {
        slot: row.try_get(0)?,
        holder: row.try_get(1)?,
        owner: row.try_get(2)?,
        fence: row.try_get(3)?,
        expires_at: row.try_get(4)?,
        ttl_ms: row.try_get(5)?,
        since: row.try_get(6)?,
        capacity: row.try_get(7)?,
    })
}

async fn acquire_in(
    client: &mut Client,
    kind: LeaseKind,
    name: &str,
    request: &AcquireRequest,
) -> Result<Result<Acquisition, LeaseStoreError>, tokio_postgres::Error> {
    let transaction = client.transaction().await?;
    transaction
        .execute(
            "INSERT INTO sm_lease (name, slot) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&name, &counter_slot(kind)],
        )
        .await?;
    let last_fence: i64 = transaction
        .query_one(
            "SELECT fence FROM sm_lease WHERE name = $1 AND slot = $2 FOR UPDATE",
            &[&name, &counter_slot(kind)],
        )
        .await?
        .try_get(0)?;
    let now: i64 = transaction.query_one(NOW, &[]).await?.try_get(0)?;
    let rows = transaction
        .query(
            &format!(
                "SELECT {ROW_COLUMNS} FROM sm_lease WHERE name = $1 AND slot BETWEEN 0 AND $2"
            ),
            &[&name, &max_slot(kind)],
        )
        .await?
        .iter()
        .map(read_row)
        .collect::<Result<Vec<SlotRow>, _>>()?;
    let plan = plan_acquire(kind, &rows, last_fence, now, now, request);
    if let AcquirePlan::Renew(row) | AcquirePlan::Take(row) = &plan {
        transaction
            .execute(
                "INSERT INTO sm_lease
                     (name, slot, holder, owner, fence, expires_at, ttl_ms, since_ms, capacity)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (name, slot) DO UPDATE SET holder = excluded.holder,
                     owner = excluded.owner, fence = excluded.fence,
                     expires_at = excluded.expires_at, ttl_ms = excluded.ttl_ms,
                     since_ms = excluded.since_ms, capacity = excluded.capacity",
                &[
                    &name,
                    &row.slot,
                    &row.holder,
                    &row.owner,
                    &row.fence,
                    &row.expires_at,
                    &row.ttl_ms,
                    &row.since,
                    &row.capacity,
                ],
            )
            .await?;
    }
    if let (AcquirePlan::Take(row), true) = (&plan, kind.is_semaphore()) {
        transaction
            .execute(
                "UPDATE sm_lease SET fence = $3 WHERE name = $1 AND slot = $2",
                &[&name, &SEMAPHORE_COUNTER_SLOT, &row.fence],
            )
            .await?;
    }
    transaction.commit().await?;
    Ok(plan.outcome(kind, now))
}

async fn refresh_in(
    client: &mut Client,
    kind: LeaseKind,
    name: &str,
    token: &str,
    ttl_ms: Option<i64>,
) -> Result<Option<LeaseGrant>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            &format!(
                "WITH clock AS ({NOW} AS now)
                 UPDATE sm_lease SET ttl_ms = COALESCE($4, sm_lease.ttl_ms),
                     expires_at = clock.now + COALESCE($4, sm_lease.ttl_ms)
                 FROM clock
                 WHERE name = $1 AND slot BETWEEN 0 AND $2 AND holder = $3 AND holder <> ''
                   AND expires_at > clock.now
                 RETURNING {ROW_COLUMNS}, clock.now"
            ),
            &[&name, &max_slot(kind), &token, &ttl_ms],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let now: i64 = row.try_get(8)?;
    Ok(Some(read_row(&row)?.grant(now)))
}

async fn release_in(
    client: &mut Client,
    kind: LeaseKind,
    name: &str,
    token: &str,
) -> Result<bool, tokio_postgres::Error> {
    let ended = client
        .execute(
            &format!(
                "WITH clock AS ({NOW} AS now)
                 UPDATE sm_lease SET expires_at = clock.now - 1
                 FROM clock
                 WHERE name = $1 AND slot BETWEEN 0 AND $2 AND holder = $3 AND holder <> ''
                   AND expires_at > clock.now"
            ),
            &[&name, &max_slot(kind), &token],
        )
        .await?;
    Ok(ended > 0)
}

async fn holders_in(
    client: &mut Client,
    kind: LeaseKind,
    name: &str,
) -> Result<Vec<LeaseGrant>, tokio_postgres::Error> {
    let rows = client
        .query(
            &format!(
                "WITH clock AS ({NOW} AS now)
                 SELECT {ROW_COLUMNS}, clock.now FROM sm_lease, clock
                 WHERE name = $1 AND slot BETWEEN 0 AND $2 AND holder <> ''
                   AND expires_at > clock.now
                 ORDER BY slot"
            ),
            &[&name, &max_slot(kind)],
        )
        .await?;
    rows.iter()
        .map(|row| Ok(read_row(row)?.grant(row.try_get(8)?)))
        .collect()
}

/// An error from the database itself (it answered) is a failure; anything else (connection
/// refused, closed, timed out) is "unavailable".
fn postgres_error(error: &tokio_postgres::Error) -> LeaseStoreError {
    match error.as_db_error() {
        Some(db) => LeaseStoreError::Backend(format!("PostgreSQL: {}", db.message())),
        None => LeaseStoreError::Unavailable(format!("PostgreSQL: {error}")),
    }
}

impl LeaseStore for PostgresLeaseStore {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        let name = name.to_owned();
        Box::pin(async move {
            self.run(move |client| {
                Box::pin(async move { acquire_in(client, kind, &name, &request).await })
            })
            .await?
        })
    }

    fn refresh_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, LeaseStoreError>> {
        let ttl_ms = ttl.map(duration_to_millis);
        let (name, token) = (name.to_owned(), token.as_str().to_owned());
        Box::pin(async move {
            self.run(move |client| {
                Box::pin(async move { refresh_in(client, kind, &name, &token, ttl_ms).await })
            })
            .await
        })
    }

    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>> {
        let (name, token) = (name.to_owned(), token.as_str().to_owned());
        Box::pin(async move {
            self.run(move |client| {
                Box::pin(async move { release_in(client, kind, &name, &token).await })
            })
            .await
        })
    }

    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LeaseGrant>, LeaseStoreError>> {
        let name = name.to_owned();
        Box::pin(async move {
            self.run(move |client| Box::pin(async move { holders_in(client, kind, &name).await }))
                .await
        })
    }
}
