//! Leases in an SQLite file (`sqlite:PATH`), shared by every process on the host that opens it.
//!
//! The table (created when missing), shared with the Postgres backend:
//! `sm_lease(name, slot, holder, owner, fence, expires_at, ttl_ms, since_ms, capacity)`, primary
//! key `(name, slot)`. An exclusive lease is slot 0 and keeps its fence there; a semaphore uses
//! slots `0..n` and keeps its fence counter in slot -1; each slot's `capacity` is the `n` it was
//! taken with (added to a table from before it, as 0: unknown). Rows are never deleted: a released lease is a
//! row whose `expires_at` is past, so a name's fence keeps going up for the life of the file.
//! Times are milliseconds since the Unix epoch read from SQLite's own clock
//! (`julianday('now')`), inside the transaction that compares them.
//!
//! Every acquisition takes the write lock before it reads (`BEGIN IMMEDIATE`), so processes
//! queue on `busy_timeout` instead of racing; past it the attempt fails with
//! [`LeaseStoreError::Unavailable`]. rusqlite is blocking: every call runs in `spawn_blocking`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::store::plan::{
    AcquirePlan, SEMAPHORE_COUNTER_SLOT, SlotRow, duration_to_millis, plan_acquire,
};
use crate::store::{
    AcquireRequest, Acquisition, LeaseGrant, LeaseKind, LeaseStore, LeaseStoreError, LeaseToken,
};

/// How long an attempt waits for another process's write lock, unless the URL says otherwise.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS sm_lease (
    name TEXT NOT NULL,
    slot INTEGER NOT NULL,
    holder TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '',
    fence INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0,
    ttl_ms INTEGER NOT NULL DEFAULT 0,
    since_ms INTEGER NOT NULL DEFAULT 0,
    capacity INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, slot)
)";

/// Whether a table made before `capacity` was kept lacks it.
const LACKS_CAPACITY: &str =
    "SELECT COUNT(*) = 0 FROM pragma_table_info('sm_lease') WHERE name = 'capacity'";
const ADD_CAPACITY: &str = "ALTER TABLE sm_lease ADD COLUMN capacity INTEGER NOT NULL DEFAULT 0";

/// SQLite's clock in milliseconds since the Unix epoch.
const NOW: &str = "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

const ROW_COLUMNS: &str = "slot, holder, owner, fence, expires_at, ttl_ms, since_ms, capacity";

/// Leases in one SQLite file.
pub struct SqliteLeaseStore {
    path: PathBuf,
    connection: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLeaseStore")
            .field("path", &self.path)
            .finish()
    }
}

impl SqliteLeaseStore {
    /// Opens (or creates) the file and the table. Blocking: call it from `spawn_blocking` or
    /// use [`SqliteLeaseStore::open_async`].
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<SqliteLeaseStore, LeaseStoreError> {
        let mut connection = Connection::open(path).map_err(sqlite_error)?;
        connection
            .busy_timeout(busy_timeout)
            .map_err(sqlite_error)?;
        create_schema(&mut connection).map_err(sqlite_error)?;
        Ok(SqliteLeaseStore {
            path: path.to_owned(),
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    /// [`SqliteLeaseStore::open`] on a blocking thread.
    pub async fn open_async(
        path: PathBuf,
        busy_timeout: Duration,
    ) -> Result<SqliteLeaseStore, LeaseStoreError> {
        tokio::task::spawn_blocking(move || SqliteLeaseStore::open(&path, busy_timeout))
            .await
            .map_err(|error| LeaseStoreError::Backend(format!("SQLite task failed: {error}")))?
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on the connection in a blocking thread.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, LeaseStoreError> {
        let connection = self.connection.clone();
        tokio::task::spawn_blocking(move || {
            let mut connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
            work(&mut connection)
        })
        .await
        .map_err(|error| LeaseStoreError::Backend(format!("SQLite task failed: {error}")))?
        .map_err(sqlite_error)
    }
}

/// Creates the table, or adds what a table from an older version lacks; one process at a time.
fn create_schema(connection: &mut Connection) -> rusqlite::Result<()> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    transaction.execute_batch(SCHEMA)?;
    if transaction.query_row(LACKS_CAPACITY, [], |row| row.get::<_, bool>(0))? {
        transaction.execute_batch(ADD_CAPACITY)?;
    }
    transaction.commit()
}

/// The highest slot a kind's rows use in a query (`slot BETWEEN 0 AND max`).
pub(crate) fn max_slot(kind: LeaseKind) -> i64 {
    if kind.is_semaphore() { i64::MAX } else { 0 }
}

/// The row that keeps the name's fence counter.
pub(crate) fn counter_slot(kind: LeaseKind) -> i64 {
    if kind.is_semaphore() {
        SEMAPHORE_COUNTER_SLOT
    } else {
        0
    }
}

fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SlotRow> {
    Ok(SlotRow {
        slot: row.get(0)?,
        holder: row.get(1)?,
        owner: row.get(2)?,
        fence: row.get(3)?,
        expires_at: row.get(4)?,
        ttl_ms: row.get(5)?,
        since: row.get(6)?,
        capacity: row.get(7)?,
    })
}

fn acquire_in(
    connection: &mut Connection,
    kind: LeaseKind,
    name: &str,
    request: &AcquireRequest,
) -> rusqlite::Result<Result<Acquisition, LeaseStoreError>> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now: i64 = transaction.query_row(NOW, [], |row| row.get(0))?;
    transaction.execute(
        "INSERT INTO sm_lease (name, slot) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        params![name, counter_slot(kind)],
    )?;
    let last_fence: i64 = transaction.query_row(
        "SELECT fence FROM sm_lease WHERE name = ?1 AND slot = ?2",
        params![name, counter_slot(kind)],
        |row| row.get(0),
    )?;
    let rows = {
        let mut statement = transaction.prepare(&format!(
            "SELECT {ROW_COLUMNS} FROM sm_lease WHERE name = ?1 AND slot BETWEEN 0 AND ?2"
        ))?;
        statement
            .query_map(params![name, max_slot(kind)], read_row)?
            .collect::<rusqlite::Result<Vec<SlotRow>>>()?
    };
    let plan = plan_acquire(kind, &rows, last_fence, now, now, request);
    if let AcquirePlan::Renew(row) | AcquirePlan::Take(row) = &plan {
        transaction.execute(
            "INSERT INTO sm_lease
                 (name, slot, holder, owner, fence, expires_at, ttl_ms, since_ms, capacity)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (name, slot) DO UPDATE SET holder = excluded.holder,
                 owner = excluded.owner, fence = excluded.fence, expires_at = excluded.expires_at,
                 ttl_ms = excluded.ttl_ms, since_ms = excluded.since_ms,
                 capacity = excluded.capacity",
            params![
                name,
                row.slot,
                row.holder,
                row.owner,
                row.fence,
                row.expires_at,
                row.ttl_ms,
                row.since,
                row.capacity
            ],
        )?;
    }
    if let (AcquirePlan::Take(row), true) = (&plan, kind.is_semaphore()) {
        transaction.execute(
            "UPDATE sm_lease SET fence = ?3 WHERE name = ?1 AND slot = ?2",
            params![name, SEMAPHORE_COUNTER_SLOT, row.fence],
        )?;
    }
    transaction.commit()?;
    Ok(plan.outcome(kind, now))
}

fn refresh_in(
    connection: &mut Connection,
    kind: LeaseKind,
    name: &str,
    token: &str,
    ttl_ms: Option<i64>,
) -> rusqlite::Result<Option<LeaseGrant>> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now: i64 = transaction.query_row(NOW, [], |row| row.get(0))?;
    let row = transaction
        .query_row(
            &format!(
                "UPDATE sm_lease SET ttl_ms = COALESCE(?4, ttl_ms), expires_at = ?5 + COALESCE(?4, ttl_ms)
                 WHERE name = ?1 AND slot BETWEEN 0 AND ?2 AND holder = ?3 AND holder <> ''
                   AND expires_at > ?5
                 RETURNING {ROW_COLUMNS}"
            ),
            params![name, max_slot(kind), token, ttl_ms, now],
            read_row,
        )
        .optional()?;
    transaction.commit()?;
    Ok(row.map(|row| row.grant(now)))
}

fn release_in(
    connection: &mut Connection,
    kind: LeaseKind,
    name: &str,
    token: &str,
) -> rusqlite::Result<bool> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now: i64 = transaction.query_row(NOW, [], |row| row.get(0))?;
    let ended = transaction.execute(
        "UPDATE sm_lease SET expires_at = ?4 - 1
         WHERE name = ?1 AND slot BETWEEN 0 AND ?2 AND holder = ?3 AND holder <> ''
           AND expires_at > ?4",
        params![name, max_slot(kind), token, now],
    )?;
    transaction.commit()?;
    Ok(ended > 0)
}

fn holders_in(
    connection: &mut Connection,
    kind: LeaseKind,
    name: &str,
) -> rusqlite::Result<Vec<LeaseGrant>> {
    let now: i64 = connection.query_row(NOW, [], |row| row.get(0))?;
    let mut statement = connection.prepare(&format!(
        "SELECT {ROW_COLUMNS} FROM sm_lease
         WHERE name = ?1 AND slot BETWEEN 0 AND ?2 AND holder <> '' AND expires_at > ?3
         ORDER BY slot"
    ))?;
    let rows = statement
        .query_map(params![name, max_slot(kind), now], read_row)?
        .collect::<rusqlite::Result<Vec<SlotRow>>>()?;
    Ok(rows.iter().map(|row| row.grant(now)).collect())
}

/// A busy or locked database is "unavailable" (try again); anything else is a failure.
fn sqlite_error(error: rusqlite::Error) -> LeaseStoreError {
    match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => LeaseStoreError::Unavailable(
            format!("SQLite database is locked by another connection past busy_timeout: {error}"),
        ),
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => {
            LeaseStoreError::Unavailable(format!("SQLite database cannot be written: {error}"))
        }
        _ => LeaseStoreError::Backend(format!("SQLite: {error}")),
    }
}

impl LeaseStore for SqliteLeaseStore {
    fn try_acquire_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        request: AcquireRequest,
    ) -> BoxFuture<'a, Result<Acquisition, LeaseStoreError>> {
        let name = name.to_owned();
        Box::pin(async move {
            self.run(move |connection| acquire_in(connection, kind, &name, &request))
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
        let (name, token) = (name.to_owned(), token.as_str().to_owned());
        let ttl_ms = ttl.map(duration_to_millis);
        Box::pin(self.run(move |connection| refresh_in(connection, kind, &name, &token, ttl_ms)))
    }

    fn release_kind<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
        token: &'a LeaseToken,
    ) -> BoxFuture<'a, Result<bool, LeaseStoreError>> {
        let (name, token) = (name.to_owned(), token.as_str().to_owned());
        Box::pin(self.run(move |connection| release_in(connection, kind, &name, &token)))
    }

    fn holders<'a>(
        &'a self,
        kind: LeaseKind,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LeaseGrant>, LeaseStoreError>> {
        let name = name.to_owned();
        Box::pin(self.run(move |connection| holders_in(connection, kind, &name)))
    }
}
