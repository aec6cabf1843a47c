//! The archive's writer task: takes samples from the recorder's bounded queue (the recorder
//! never waits for it), writes them in batches with COPY and merges the batch's per-minute
//! summaries into the minutes table in the same transaction, and while the database cannot be
//! reached appends them to the spool file, which it writes out first once the database is
//! back. Every batch has an id the archive keeps: a batch written again (its commit's answer
//! was lost) is taken once. It runs beside every other task, never in a request's future; a stalled database
//! only makes it spool.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::SinkExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::rollup::{minute_rows, value_columns};
use super::rows::{copy_row, is_sample_line, spool_header, spool_line, spooled_batches};
use super::schema::{
    claim_batch, copy_in, create_partition, create_table, day_of, forget_batches, list_partitions,
    minutes_table, partitions_to_drop, upsert_minutes,
};
use crate::history::recorder::{ArchivedSample, History};
use crate::history::ring::SampleValue;

/// The most samples in one COPY.
pub const BATCH: usize = 10_000;
/// How long a batch gathers once its first sample came.
const GATHER: Duration = Duration::from_millis(200);
/// The most one database operation (connect, COPY, a statement) may take before the writer
/// counts the database unreachable.
const DATABASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the writer waits before trying an unreachable database again.
const RETRY: Duration = Duration::from_secs(1);
/// How often retention runs.
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// What the writer needs to know.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub url: String,
    pub table: String,
    pub spool: PathBuf,
    pub retention_days: u32,
}

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("the database did not answer within {} s", DATABASE_TIMEOUT.as_secs())]
    Timeout,
}

async fn bounded<T>(
    work: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, WriteError> {
    match tokio::time::timeout(DATABASE_TIMEOUT, work).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(WriteError::Timeout),
    }
}

/// Opens a connection (its driver on a task of its own) and makes the table.
pub async fn connect(url: &str, table: &str) -> Result<Client, WriteError> {
    let (client, connection) = bounded(tokio_postgres::connect(url, NoTls)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    bounded(client.batch_execute(&create_table(table))).await?;
    Ok(client)
}

/// Makes the partitions of every day `batch` touches that this writer has not made yet.
async fn ensure_partitions(
    client: &Client,
    table: &str,
    batch: &[ArchivedSample],
    made: &mut HashSet<i64>,
) -> Result<(), WriteError> {
    let days: HashSet<i64> = batch.iter().map(|s| day_of(s.sample.t_ms)).collect();
    for day in days {
        if made.contains(&day) {
            continue;
        }
        bounded(client.batch_execute(&create_partition(table, day))).await?;
        made.insert(day);
    }
    Ok(())
}

/// A new batch's id (random, 128 bits).
pub fn new_batch_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// What became of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Now,
    /// The archive had taken this batch before; nothing was written again.
    Before,
}

/// Writes `batch` (with its id) with one COPY and merges its per-minute summaries into the
/// minutes table, in one transaction: the minutes always sum up exactly the samples in the
/// table, and a batch the archive took before is not written again.
pub async fn copy_batch(
    client: &mut Client,
    table: &str,
    batch: &[ArchivedSample],
    id: &str,
    made: &mut HashSet<i64>,
) -> Result<Written, WriteError> {
    ensure_partitions(client, table, batch, made).await?;
    let mut text = String::with_capacity(batch.len() * 64);
    for sample in batch {
        copy_row(sample, &mut text);
    }
    let minutes = MinuteColumns::of(batch);
    let copy = copy_in(table);
    let upsert = upsert_minutes(table);
    let claim = claim_batch(table);
    let write = async {
        let transaction = client.transaction().await?;
        if transaction.execute(&claim, &[&id]).await? == 0 {
            transaction.rollback().await?;
            return Ok(Written::Before);
        }
        let sink = transaction.copy_in::<_, Bytes>(&copy).await?;
        futures::pin_mut!(sink);
        sink.send(Bytes::from(text)).await?;
        sink.finish().await?;
        transaction
            .execute(
                &upsert,
                &[
                    &minutes.channel,
                    &minutes.minute_ms,
                    &minutes.count,
                    &minutes.numbers,
                    &minutes.sum,
                    &minutes.min,
                    &minutes.min_ms,
                    &minutes.max,
                    &minutes.max_ms,
                    &minutes.first_ms,
                    &minutes.first_value,
                    &minutes.first_text,
                    &minutes.last_ms,
                    &minutes.last_value,
                    &minutes.last_text,
                    &minutes.irregular,
                ],
            )
            .await?;
        transaction.commit().await?;
        Ok(Written::Now)
    };
    bounded(write).await
}

/// A batch's minute rows as the upsert's arrays, one a column.
#[derive(Default)]
struct MinuteColumns {
    channel: Vec<String>,
    minute_ms: Vec<i64>,
    count: Vec<i32>,
    numbers: Vec<i32>,
    sum: Vec<f64>,
    min: Vec<Option<f64>>,
    min_ms: Vec<Option<i32>>,
    max: Vec<Option<f64>>,
    max_ms: Vec<Option<i32>>,
    first_ms: Vec<Option<i32>>,
    first_value: Vec<Option<f64>>,
    first_text: Vec<Option<String>>,
    last_ms: Vec<Option<i32>>,
    last_value: Vec<Option<f64>>,
    last_text: Vec<Option<String>>,
    irregular: Vec<i32>,
}

impl MinuteColumns {
    fn of(batch: &[ArchivedSample]) -> MinuteColumns {
        let mut columns = MinuteColumns::default();
        for row in minute_rows(batch) {
            let (first_value, first_text) = value_columns(row.first.as_ref().map(|(_, v)| v));
            let (last_value, last_text) = value_columns(row.last.as_ref().map(|(_, v)| v));
            columns.channel.push(row.channel.to_string());
            columns.minute_ms.push(row.minute_ms as i64);
            columns.count.push(row.count);
            columns.numbers.push(row.numbers);
            columns.sum.push(row.sum);
            columns.min.push(row.min.map(|(_, v)| v));
            columns.min_ms.push(row.min.map(|(t, _)| t));
            columns.max.push(row.max.map(|(_, v)| v));
            columns.max_ms.push(row.max.map(|(t, _)| t));
            columns.first_ms.push(row.first.as_ref().map(|(t, _)| *t));
            columns.first_value.push(first_value);
            columns.first_text.push(first_text);
            columns.last_ms.push(row.last.as_ref().map(|(t, _)| *t));
            columns.last_value.push(last_value);
            columns.last_text.push(last_text);
            columns.irregular.push(row.irregular);
        }
        columns
    }
}

/// Drops the partitions, of the samples and of the minutes, older than `retention_days` (by
/// `now_ms`'s day); returns their names.
pub async fn drop_expired(
    client: &Client,
    table: &str,
    now_ms: u64,
    retention_days: u32,
) -> Result<Vec<String>, WriteError> {
    let mut dropped = Vec::new();
    for parent in [table.to_owned(), minutes_table(table)] {
        let rows = bounded(client.query(list_partitions(), &[&parent])).await?;
        let names: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
        let expired = partitions_to_drop(&names, &parent, day_of(now_ms), retention_days);
        for name in expired {
            bounded(client.batch_execute(&format!("DROP TABLE IF EXISTS {name}"))).await?;
            dropped.push(name);
        }
    }
    let days = i32::try_from(retention_days).unwrap_or(i32::MAX);
    bounded(client.execute(&forget_batches(table), &[&days])).await?;
    Ok(dropped)
}

/// The writer's state between batches.
struct Writer {
    settings: WriterSettings,
    history: Arc<History>,
    client: Option<Client>,
    made: HashSet<i64>,
    /// Samples in the spool file not yet written to the database.
    spooled: usize,
    retry_at: Option<Instant>,
    retention_at: Instant,
}

/// Runs until `shutdown`, then writes (or spools) what is queued and ends.
pub async fn run(
    history: Arc<History>,
    mut queue: mpsc::Receiver<ArchivedSample>,
    settings: WriterSettings,
    shutdown: CancellationToken,
) {
    let spooled = count_spooled(&settings.spool).await;
    let mut writer = Writer {
        settings,
        history,
        client: None,
        made: HashSet::new(),
        spooled,
        retry_at: None,
        retention_at: Instant::now(),
    };
    if spooled > 0 {
        info!(
            spooled,
            "history archive: samples spooled before a restart will be caught up"
        );
    }
    loop {
        let mut batch = Vec::new();
        let stopping = tokio::select! {
            () = shutdown.cancelled() => true,
            first = queue.recv() => match first {
                Some(sample) => {
                    batch.push(sample);
                    let until = Instant::now() + GATHER;
                    while batch.len() < BATCH {
                        match tokio::time::timeout_at(until, queue.recv()).await {
                            Ok(Some(sample)) => batch.push(sample),
                            Ok(None) | Err(_) => break,
                        }
                    }
                    false
                }
                None => true,
            },
            // With nothing new, a spool still waiting is caught up when the database is back.
            () = tokio::time::sleep(RETRY), if writer.spooled > 0 => false,
        };
        if stopping {
            // Until it runs again, every channel's history is a gap "gateway stopped".
            let history = writer.history.clone();
            history.record_everywhere(history.clock().now_ms(), SampleValue::GatewayStopped);
            while let Ok(sample) = queue.try_recv() {
                batch.push(sample);
            }
            writer.write(batch).await;
            return;
        }
        writer.write(batch).await;
    }
}

impl Writer {
    /// Writes the spool (when any) and then `batch`; spools `batch` when the database cannot
    /// take it.
    async fn write(&mut self, batch: Vec<ArchivedSample>) {
        if self.connected().await {
            let id = new_batch_id();
            if self.spooled > 0 && self.catch_up().await.is_err() {
                self.spool(&batch, &id).await;
                return;
            }
            if batch.is_empty() {
                return;
            }
            match self.copy(&batch, &id).await {
                Ok(_) => self.archived(&batch),
                Err(error) => {
                    self.lost_database(&error);
                    self.spool(&batch, &id).await;
                }
            }
        } else {
            self.spool(&batch, &new_batch_id()).await;
        }
    }

    async fn connected(&mut self) -> bool {
        if self
            .client
            .as_ref()
            .is_some_and(|client| !client.is_closed())
        {
            self.retention().await;
            return true;
        }
        self.client = None;
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return false;
        }
        match connect(&self.settings.url, &self.settings.table).await {
            Ok(client) => {
                if self.retry_at.take().is_some() {
                    info!("history archive: the database is reachable again");
                }
                self.client = Some(client);
                self.made.clear();
                self.retention().await;
                true
            }
            Err(error) => {
                self.lost_database(&error);
                false
            }
        }
    }

    fn lost_database(&mut self, error: &WriteError) {
        if self.retry_at.is_none() {
            warn!(%error, "history archive: the database cannot be reached; samples are spooled to {} until it can", self.settings.spool.display());
        }
        self.client = None;
        self.retry_at = Some(Instant::now() + RETRY);
    }

    async fn retention(&mut self) {
        if Instant::now() < self.retention_at {
            return;
        }
        self.retention_at = Instant::now() + RETENTION_EVERY;
        let Some(client) = &self.client else { return };
        let now_ms = self.history.clock().now_ms();
        match drop_expired(
            client,
            &self.settings.table,
            now_ms,
            self.settings.retention_days,
        )
        .await
        {
            Ok(dropped) if !dropped.is_empty() => {
                info!(
                    ?dropped,
                    "history archive: dropped partitions past retention"
                )
            }
            Ok(_) => {}
            Err(error) => {
                warn!(%error, "history archive: retention failed; tried again in an hour")
            }
        }
    }

    async fn copy(&mut self, batch: &[ArchivedSample], id: &str) -> Result<Written, WriteError> {
        let Some(client) = &mut self.client else {
            return Err(WriteError::Timeout);
        };
        copy_batch(client, &self.settings.table, batch, id, &mut self.made).await
    }

    fn archived(&self, batch: &[ArchivedSample]) {
        let counters = &self.history.counters;
        counters
            .archived
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        if let Some(newest) = batch.iter().map(|s| s.sample.t_ms).max() {
            counters
                .archived_up_to_ms
                .fetch_max(newest, Ordering::Relaxed);
        }
    }

    /// Appends `batch` to the spool file. A spool that cannot be written loses the batch,
    /// counted as dropped and logged.
    async fn spool(&mut self, batch: &[ArchivedSample], id: &str) {
        if batch.is_empty() {
            return;
        }
        let mut text = String::with_capacity(batch.len() * 64);
        text.push_str(&spool_header(id));
        for sample in batch {
            text.push_str(&spool_line(sample));
        }
        let written = async {
            if let Some(dir) = self
                .settings
                .spool
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                tokio::fs::create_dir_all(dir).await?;
            }
            let mut file = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.settings.spool)
                .await?;
            file.write_all(text.as_bytes()).await?;
            file.sync_data().await
        }
        .await;
        let counters = &self.history.counters;
        match written {
            Ok(()) => {
                self.spooled += batch.len();
                counters
                    .spooled
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
            Err(error) => {
                warn!(%error, lost = batch.len(), "history archive: cannot write the spool {}", self.settings.spool.display());
                counters
                    .dropped
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Writes the whole spool to the database in batches, then empties it.
    async fn catch_up(&mut self) -> Result<(), WriteError> {
        let text = match tokio::fs::read_to_string(&self.settings.spool).await {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => {
                warn!(%error, "history archive: cannot read the spool {}", self.settings.spool.display());
                return Ok(());
            }
        };
        // Each batch as it was spooled, with its id (samples spooled by an older gateway, in
        // batches of new ids).
        let mut batches: Vec<(String, Vec<ArchivedSample>)> = Vec::new();
        for spooled in spooled_batches(&text) {
            match spooled.id {
                Some(id) => batches.push((id, spooled.samples)),
                None => batches.extend(
                    spooled
                        .samples
                        .chunks(BATCH)
                        .map(|chunk| (new_batch_id(), chunk.to_vec())),
                ),
            }
        }
        let total: usize = batches.iter().map(|(_, samples)| samples.len()).sum();
        for at in 0..batches.len() {
            let (id, samples) = &batches[at];
            if let Err(error) = self.copy(samples, id).await {
                self.lost_database(&error);
                // The spool keeps what is not written yet, each batch with its id: one whose
                // commit's answer was lost is taken once when it comes again.
                let rest: String = batches[at..]
                    .iter()
                    .flat_map(|(id, samples)| {
                        std::iter::once(spool_header(id)).chain(samples.iter().map(spool_line))
                    })
                    .collect();
                if let Err(error) = tokio::fs::write(&self.settings.spool, rest).await {
                    warn!(%error, "history archive: cannot rewrite the spool; it is written out again whole");
                } else {
                    self.spooled = batches[at..].iter().map(|(_, s)| s.len()).sum();
                }
                return Err(error);
            }
            self.archived(samples);
        }
        if let Err(error) = tokio::fs::remove_file(&self.settings.spool).await
            && error.kind() != std::io::ErrorKind::NotFound
        {
            warn!(%error, "history archive: cannot empty the spool");
        }
        info!(samples = total, "history archive: the spool is caught up");
        self.spooled = 0;
        Ok(())
    }
}

async fn count_spooled(path: &std::path::Path) -> usize {
    tokio::fs::read_to_string(path).await.map_or(0, |text| {
        text.lines().filter(|line| is_sample_line(line)).count()
    })
}
