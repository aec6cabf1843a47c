//! The archive in PostgreSQL (`[history] archive`): the tables' SQL (`schema`), a sample as
//! a row (`rows`), the per-minute summaries (`rollup`), the writer task (`writer`), and
//! [`ArchiveReader`], which a query asks for the times memory no longer holds.

pub mod rollup;
pub mod rows;
pub mod schema;
pub mod writer;

use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::Client;

use crate::history::bucket::{MINUTE_MS, MinuteSummary};
use crate::history::ring::Sample;
use rollup::{StoredMinute, sample_windows, summary_of};
use rows::sample_of;
use schema::{select_minutes, select_minutes_from, select_range, select_windows};

/// How long a query waits for the archive before it answers 503.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the archive could not answer a query.
#[derive(Debug, thiserror::Error)]
#[error("the history archive cannot be read: {0}")]
pub struct ArchiveUnavailable(pub String);

/// The query side of the archive: a connection of its own, made when first needed and again
/// after it broke.
pub struct ArchiveReader {
    url: String,
    table: String,
    client: Mutex<Option<Client>>,
    /// Where the minutes begin (`schema::meta_table`), once read.
    minutes_from_ms: std::sync::OnceLock<u64>,
}

impl std::fmt::Debug for ArchiveReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveReader")
            .field("table", &self.table)
            .finish()
    }
}

impl ArchiveReader {
    pub fn new(url: String, table: String) -> ArchiveReader {
        ArchiveReader {
            url,
            table,
            client: Mutex::new(None),
            minutes_from_ms: std::sync::OnceLock::new(),
        }
    }

    /// The connection, made when there is none (or it broke).
    async fn connection(&self) -> Result<MutexGuard<'_, Option<Client>>, ArchiveUnavailable> {
        let mut client = self.client.lock().await;
        if client.as_ref().is_none_or(Client::is_closed) {
            *client = Some(
                writer::connect(&self.url, &self.table)
                    .await
                    .map_err(|error| ArchiveUnavailable(error.to_string()))?,
            );
        }
        Ok(client)
    }

    /// `channel`'s samples in `[from_ms, to_ms)` with the one before, in time order.
    pub async fn range(
        &self,
        channel: &str,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<Sample>, ArchiveUnavailable> {
        let read = async {
            let mut client = self.connection().await?;
            let Some(connected) = client.as_ref() else {
                return Err(ArchiveUnavailable("no connection".into()));
            };
            let rows = connected
                .query(
                    &select_range(&self.table),
                    &[&channel, &(from_ms as f64), &(to_ms as f64)],
                )
                .await
                .map_err(|error| {
                    *client = None;
                    ArchiveUnavailable(error.to_string())
                })?;
            Ok(rows
                .iter()
                .map(|row| sample_of(row.get(0), row.get(1), row.get(2), row.get(3)))
                .collect())
        };
        within_timeout(read).await
    }

    /// `channel`'s `[from_ms, to_ms)` (`from_ms` a whole minute) by minute: the summaries of
    /// the whole minutes whose every sample has a value, and the samples of the rest (the
    /// minutes with a gap or a number not finite, the part of a minute at the end) with the
    /// one before `from_ms`, in time order. A range reaching back before the minutes begin
    /// (an archive made before them) is read as samples.
    pub async fn by_minute(
        &self,
        channel: &str,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<(Vec<Sample>, Vec<MinuteSummary>), ArchiveUnavailable> {
        let whole_to = (to_ms - to_ms % MINUTE_MS).max(from_ms);
        let read = async {
            let mut client = self.connection().await?;
            let Some(connected) = client.as_ref() else {
                return Err(ArchiveUnavailable("no connection".into()));
            };
            let answered = async {
                let minutes_from = match self.minutes_from_ms.get() {
                    Some(at) => *at,
                    None => {
                        let row = connected
                            .query_opt(&select_minutes_from(&self.table), &[])
                            .await?;
                        let at = row.map_or(0, |row| row.get::<_, i64>(0).max(0) as u64);
                        *self.minutes_from_ms.get_or_init(|| at)
                    }
                };
                if from_ms < minutes_from {
                    let rows = connected
                        .query(
                            &select_range(&self.table),
                            &[&channel, &(from_ms as f64), &(to_ms as f64)],
                        )
                        .await?;
                    let samples = rows
                        .iter()
                        .map(|row| sample_of(row.get(0), row.get(1), row.get(2), row.get(3)))
                        .collect();
                    return Ok((samples, Vec::new()));
                }
                let rows = connected
                    .query(
                        &select_minutes(&self.table),
                        &[&channel, &(from_ms as f64), &(whole_to as f64)],
                    )
                    .await?;
                let mut minutes = Vec::with_capacity(rows.len());
                let mut irregular = Vec::new();
                for row in &rows {
                    let stored = StoredMinute {
                        minute_ms: row.get(0),
                        count: row.get(1),
                        numbers: row.get(2),
                        sum: row.get(3),
                        min: row.get(4),
                        min_ms: row.get(5),
                        max: row.get(6),
                        max_ms: row.get(7),
                        first_ms: row.get(8),
                        first_value: row.get(9),
                        first_text: row.get(10),
                        last_ms: row.get(11),
                        last_value: row.get(12),
                        last_text: row.get(13),
                        irregular: row.get(14),
                    };
                    let minute_ms = stored.minute_ms.max(0) as u64;
                    match summary_of(stored) {
                        Some(summary) => minutes.push(summary),
                        None => irregular.push(minute_ms),
                    }
                }
                let (starts, ends): (Vec<f64>, Vec<f64>) =
                    sample_windows(&irregular, from_ms, to_ms)
                        .into_iter()
                        .map(|(from, to)| (from as f64, to as f64))
                        .unzip();
                let rows = connected
                    .query(
                        &select_windows(&self.table),
                        &[&channel, &starts, &ends, &(from_ms as f64)],
                    )
                    .await?;
                let samples = rows
                    .iter()
                    .map(|row| sample_of(row.get(0), row.get(1), row.get(2), row.get(3)))
                    .collect();
                Ok::<_, tokio_postgres::Error>((samples, minutes))
            };
            answered.await.map_err(|error| {
                *client = None;
                ArchiveUnavailable(error.to_string())
            })
        };
        within_timeout(read).await
    }
}

async fn within_timeout<T>(
    read: impl Future<Output = Result<T, ArchiveUnavailable>>,
) -> Result<T, ArchiveUnavailable> {
    match tokio::time::timeout(QUERY_TIMEOUT, read).await {
        Ok(answer) => answer,
        Err(_) => Err(ArchiveUnavailable(format!(
            "no answer within {} s",
            QUERY_TIMEOUT.as_secs()
        ))),
    }
}
