//! The audit trail: one line for every request (`timestamp ip method path status duration`,
//! as the .NET client's `docs/api/audit.md` documents it), and for every change (REST, legacy port, the
//! lease's own acquisitions, releases, expiries, breaks and safe states) who asked, under which
//! lease owner and fence, and what came of it. `GET api/audit/log?tail=N` reads it.
//!
//! Two streams with their own rotation ([`files`]): the changes (`changes.log`: every change,
//! refused ones included, and the lease's own lines) and every other request (`audit.log`), so
//! that read load never rotates a change out; `GET api/audit/log` merges them in time order.
//! One writer thread owns the files: lines are queued to it, and it appends everything
//! queued in one write per stream and, when any of them is a change, one `fdatasync` of the
//! changes (group commit: concurrent changes share a sync). A change (or a reader waiting for the trail) wakes
//! the writer at once; lines of requests that changed nothing wake it at most once per
//! [`BATCH_WINDOW`], so reads do not pay a thread wake-up each. A change's request awaits [`AuditLog::record`]
//! before its answer is sent, so an answered change is on disk even after a `kill -9`.
//!
//! A request that changed nothing has its line rendered under the queue's lock straight into
//! one text the writer swaps for its own. The control lease reports its changes of hands
//! through a callback (`lease::notice`).
//!
//! A gateway serving several stations keeps one trail for all of them: each station's parts
//! write through [`AuditLog::for_station`], a view of the same trail that ends every line it
//! sends with ` station=<id>` (after the documented six fields and a change's own), and reads
//! back only the lines ending so. A trail not made by it writes its lines as a single-station
//! gateway always has, without the field, and reads them all.

pub mod files;
pub mod lease_lines;
pub mod line;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::config::AuditConfig;
use files::{CHANGES, MemoryLines, REQUESTS, RotatingFiles, Sink};
pub use line::{ChangeFields, Outcome, RequestLine};

/// How many change lines the status page shows.
pub const RECENT_CHANGES: usize = 20;
/// The most lines one write (and one sync) takes.
const MOST_PER_BATCH: usize = 4096;
/// The longest a line of a request that changed nothing waits before it is written.
pub const BATCH_WINDOW: Duration = Duration::from_millis(50);
/// The longest a change's answer waits for its line: a disk that hangs (a stalled network
/// file system) must not keep the answer of a change that happened from its client forever.
pub const RECORD_LIMIT: Duration = Duration::from_secs(5);

/// What wants the writer at once: a change's line (or the lease's own), written to the changes
/// and synced before `done` is told, or a waiter (an empty line) told once everything queued
/// before it is written. The lines of requests that changed nothing are not jobs: they go to
/// [`QueueState::quiet`].
struct Job {
    line: String,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// What the writer thread and the readers share.
struct Shared {
    /// `None`: memory only.
    dir: Option<PathBuf>,
    /// Memory only: the requests' lines and the changes'.
    memory: Streams<Arc<Mutex<MemoryLines>>>,
    recent: Mutex<VecDeque<String>>,
    last_error: Mutex<Option<String>>,
    batches: AtomicU64,
    syncs: AtomicU64,
    /// Lines sent and not yet taken by the writer.
    queued: AtomicU64,
    /// No writer thread: each line is written to memory by whoever sends it, before `send`
    /// returns ([`AuditLog::memory_inline`], for the deterministic simulation).
    inline: bool,
}

/// One thing for each of the two streams.
#[derive(Clone, Debug)]
struct Streams<T> {
    requests: T,
    changes: T,
}

impl Streams<Arc<Mutex<MemoryLines>>> {
    fn in_memory(config: &AuditConfig) -> Self {
        Streams {
            requests: Arc::new(Mutex::new(MemoryLines::new(config.file_bytes))),
            changes: Arc::new(Mutex::new(MemoryLines::new(config.change_file_bytes))),
        }
    }
}

/// What waits for the writer thread.
#[derive(Default)]
struct QueueState {
    jobs: Vec<Job>,
    /// The lines of requests that changed nothing, each with its newline, rendered here under
    /// the lock: no line of its own to allocate and free on another thread.
    quiet: String,
    /// How many lines `quiet` holds.
    quiet_lines: u64,
    /// A job is queued: it wants to be written at once.
    urgent: bool,
    /// Every [`AuditLog`] is gone: write what is queued and stop.
    closed: bool,
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
}

/// Closes the queue when the last [`AuditLog`] clone is dropped.
struct QueueHandle(Arc<Queue>);

impl Drop for QueueHandle {
    fn drop(&mut self) {
        lock(&self.0.state).closed = true;
        self.0.wake.notify_one();
    }
}

/// The audit trail; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    queue: Arc<QueueHandle>,
    shared: Arc<Shared>,
    /// Of a station's view ([`AuditLog::for_station`]): ` station=<id>`, escaped, appended to
    /// every line this view sends. `None`: lines as they are rendered.
    station_suffix: Option<Arc<str>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dir", &self.shared.dir)
            .field("station_suffix", &self.station_suffix)
            .finish()
    }
}

impl AuditLog {
    /// The trail `config` asks for: rotating files in `dir`, or memory only when it is empty
    /// (then `$STATE_DIRECTORY/audit` when systemd gives the service a state directory).
    pub fn open(config: &AuditConfig) -> std::io::Result<AuditLog> {
        let dir = config.directory();
        let memory = Streams::in_memory(config);
        match &dir {
            Some(dir) => {
                let requests = RotatingFiles::open(dir, REQUESTS, config.file_bytes, config.files)?;
                let changes = RotatingFiles::open(
                    dir,
                    CHANGES,
                    config.change_file_bytes,
                    config.change_files,
                )?;
                info!(
                    dir = %dir.display(),
                    "audit trail in {}: changes in {}, other requests in {}",
                    dir.display(),
                    CHANGES,
                    REQUESTS
                );
                let log = AuditLog::start(requests, changes, Some(dir.clone()), memory);
                log.seed_recent();
                Ok(log)
            }
            None => {
                warn!(
                    "the audit trail is kept in memory only and is lost when the gateway stops: set [audit] dir in the config"
                );
                let (requests, changes) = (
                    MemorySink(memory.requests.clone()),
                    MemorySink(memory.changes.clone()),
                );
                Ok(AuditLog::start(requests, changes, None, memory))
            }
        }
    }

    /// A trail kept in memory only, whatever the environment says (tests and tools).
    pub fn memory_only() -> AuditLog {
        let memory = Streams::in_memory(&AuditConfig::default());
        let (requests, changes) = (
            MemorySink(memory.requests.clone()),
            MemorySink(memory.changes.clone()),
        );
        AuditLog::start(requests, changes, None, memory)
    }

    /// A trail kept in memory and written by whoever sends a line, with no writer thread: a
    /// change's line is written before its `record` returns, so that a simulation with paused
    /// time never waits on another thread.
    pub fn memory_inline() -> AuditLog {
        let memory = Streams::in_memory(&AuditConfig::default());
        AuditLog {
            queue: Arc::new(QueueHandle(Arc::new(Queue::default()))),
            shared: Arc::new(Shared {
                dir: None,
                memory,
                recent: Mutex::new(VecDeque::with_capacity(RECENT_CHANGES)),
                last_error: Mutex::new(None),
                batches: AtomicU64::new(0),
                syncs: AtomicU64::new(0),
                queued: AtomicU64::new(0),
                inline: true,
            }),
            station_suffix: None,
        }
    }

    /// Writes what is queued now, in the sender's own call (a trail without a writer thread).
    fn write_inline(&self) {
        let queue = &self.queue.0;
        let mut quiet = String::new();
        let (batch, quiet_lines) = {
            let mut state = lock(&queue.state);
            std::mem::swap(&mut state.quiet, &mut quiet);
            state.urgent = false;
            (
                std::mem::take(&mut state.jobs),
                std::mem::take(&mut state.quiet_lines),
            )
        };
        let mut requests = MemorySink(self.shared.memory.requests.clone());
        let mut changes = MemorySink(self.shared.memory.changes.clone());
        write_batch(
            (&mut requests, &mut changes),
            (batch, quiet_lines),
            &mut quiet,
            &mut Vec::new(),
            &self.shared,
        );
    }

    /// A trail writing to `requests` and `changes` (tests give their own).
    fn start(
        requests: impl Sink,
        changes: impl Sink,
        dir: Option<PathBuf>,
        memory: Streams<Arc<Mutex<MemoryLines>>>,
    ) -> AuditLog {
        let queue = Arc::new(Queue::default());
        let shared = Arc::new(Shared {
            dir,
            memory,
            recent: Mutex::new(VecDeque::with_capacity(RECENT_CHANGES)),
            last_error: Mutex::new(None),
            batches: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            inline: false,
        });
        let (writer, writer_queue) = (shared.clone(), queue.clone());
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_lines(requests, changes, &writer_queue, &writer))
            .expect("the audit writer thread starts");
        AuditLog {
            queue: Arc::new(QueueHandle(queue)),
            shared,
            station_suffix: None,
        }
    }

    /// The same trail (its writer, queue, files, recent changes) for one station of a gateway
    /// serving several: every line sent through this view (by [`record`](Self::record),
    /// [`note_change`](Self::note_change), [`note`](Self::note) and
    /// [`note_with`](Self::note_with)) ends with ` station=<id>`, the id escaped as every
    /// field is ([`line::push_escaped`]). A view of a view names the new station only.
    /// [`tail`](Self::tail) reads this station's lines only; [`recent_changes`]
    /// (Self::recent_changes) is the whole trail's, every station's lines.
    pub fn for_station(&self, id: &str) -> AuditLog {
        let mut suffix = String::with_capacity(id.len() + 9);
        suffix.push_str(" station=");
        line::push_escaped(&mut suffix, id);
        AuditLog {
            queue: self.queue.clone(),
            shared: self.shared.clone(),
            station_suffix: Some(suffix.into()),
        }
    }

    /// `line` with this view's station field, if it has one (an empty line stays empty).
    fn tagged(&self, mut line: String) -> String {
        if let Some(suffix) = &self.station_suffix
            && !line.is_empty()
        {
            line.push_str(suffix);
        }
        line
    }

    /// Appends a change's line and waits until it is on disk (written and synced), at most
    /// [`RECORD_LIMIT`]. `Err` says why it is not: the change's answer goes out all the same
    /// (the change happened), and the failure is logged and shown on the status page.
    pub async fn record(&self, line: String) -> Result<(), String> {
        let (done, written) = oneshot::channel();
        self.send(self.tagged(line), Some(done));
        match tokio::time::timeout(RECORD_LIMIT, written).await {
            Ok(result) => result.unwrap_or_else(|_| Err("the audit writer has stopped".into())),
            Err(_) => Err(format!(
                "the audit trail's disk did not confirm a line within {} s (it stays queued)",
                RECORD_LIMIT.as_secs()
            )),
        }
    }

    /// Appends a change's line (synced with its batch) without waiting: the lease's own events,
    /// whose request line is recorded after them and waits for both.
    pub fn note_change(&self, line: String) {
        self.send(self.tagged(line), None);
    }

    /// Appends a line of a request that changed nothing, without waiting or syncing.
    pub fn note(&self, line: &str) {
        self.note_with(|quiet| quiet.push_str(line));
    }

    /// Appends a line of a request that changed nothing, rendered by `render` straight into
    /// the queue (without its newline), without waiting or syncing.
    pub fn note_with(&self, render: impl FnOnce(&mut String)) {
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        let queue = &self.queue.0;
        let mut state = lock(&queue.state);
        let was_empty = state.jobs.is_empty() && state.quiet.is_empty();
        let start = state.quiet.len();
        render(&mut state.quiet);
        if let Some(suffix) = &self.station_suffix
            && state.quiet.len() > start
        {
            state.quiet.push_str(suffix);
        }
        state.quiet.push('\n');
        state.quiet_lines += 1;
        // The writer is woken when this starts a batch; it then gathers for up to
        // BATCH_WINDOW.
        if was_empty {
            queue.wake.notify_one();
        }
        drop(state);
        if self.shared.inline {
            self.write_inline();
        }
    }

    /// Queues a job (a change's line, or a waiter's empty one) and wakes the writer at once.
    fn send(&self, line: String, done: Option<oneshot::Sender<Result<(), String>>>) {
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        let queue = &self.queue.0;
        let mut state = lock(&queue.state);
        state.jobs.push(Job { line, done });
        state.urgent = true;
        queue.wake.notify_one();
        drop(state);
        if self.shared.inline {
            self.write_inline();
        }
    }

    /// Waits until every line queued before this call is written (not synced): a reader of
    /// the trail sees the requests answered before it asked.
    pub async fn written(&self) {
        let (done, written) = oneshot::channel();
        self.send(String::new(), Some(done));
        let _ = written.await;
    }

    /// The last `tail` lines of the trail (`0`: all of both current files): the requests'
    /// and the changes' merged in time order. A station's view ([`AuditLog::for_station`])
    /// reads its own station's lines only: a lab's station answers `api/audit/log` as a
    /// station of its own would.
    pub fn tail(&self, tail: usize) -> std::io::Result<Vec<String>> {
        let suffix = self.station_suffix.as_deref();
        let ours = |line: &str| suffix.is_none_or(|suffix| line.ends_with(suffix));
        let ours_bytes =
            |line: &[u8]| suffix.is_none_or(|suffix| line.ends_with(suffix.as_bytes()));
        let (requests, changes) = match &self.shared.dir {
            Some(dir) => (
                files::tail_of_file_where(dir, REQUESTS, tail, ours_bytes)?,
                files::tail_of_file_where(dir, CHANGES, tail, ours_bytes)?,
            ),
            None => (
                lock(&self.shared.memory.requests).tail_where(tail, ours),
                lock(&self.shared.memory.changes).tail_where(tail, ours),
            ),
        };
        Ok(files::merged_in_time_order(requests, changes, tail))
    }

    /// The last [`RECENT_CHANGES`] change lines, oldest first.
    pub fn recent_changes(&self) -> Vec<String> {
        lock(&self.shared.recent).iter().cloned().collect()
    }

    /// Writes and syncs so far (for measurements: lines per sync).
    pub fn batches_and_syncs(&self) -> (u64, u64) {
        (
            self.shared.batches.load(Ordering::Relaxed),
            self.shared.syncs.load(Ordering::Relaxed),
        )
    }

    /// Lines sent and not yet taken by the writer.
    pub fn jobs_queued(&self) -> u64 {
        self.shared.queued.load(Ordering::Relaxed)
    }

    /// What `status.json` shows of the trail.
    pub fn status(&self) -> Json {
        json!({
            "onDisk": self.shared.dir.is_some(),
            "lastError": *lock(&self.shared.last_error),
            "recentChanges": self.recent_changes(),
        })
    }

    /// The status page's recent changes after a restart: from the current files (the
    /// requests' too: a trail written before the streams were apart has its changes there).
    fn seed_recent(&self) {
        if let Ok(lines) = self.tail(0) {
            let mut recent = lock(&self.shared.recent);
            for line in lines.into_iter().filter(|l| line::is_change_line(l)) {
                push_recent(&mut recent, line);
            }
        }
    }
}

fn push_recent(recent: &mut VecDeque<String>, line: String) {
    if recent.len() == RECENT_CHANGES {
        recent.pop_front();
    }
    recent.push_back(line);
}

/// The writer thread: everything queued in one write, one sync when any is a change, then
/// every waiter told. Returns once every [`AuditLog`] is gone.
fn write_lines(mut requests: impl Sink, mut changes: impl Sink, queue: &Queue, shared: &Shared) {
    // The requests' lines come rendered, in a text the writer swaps for this one.
    let mut request_bytes = String::with_capacity(64 * 1024);
    let mut change_bytes = Vec::with_capacity(4 * 1024);
    while let Some(taken) = next_batch(queue, &mut request_bytes) {
        write_batch(
            (&mut requests, &mut changes),
            taken,
            &mut request_bytes,
            &mut change_bytes,
            shared,
        );
    }
}

/// Writes one batch: the changes' lines appended and synced, the requests' appended, then
/// every waiter told.
fn write_batch(
    (requests, changes): (&mut impl Sink, &mut impl Sink),
    (batch, quiet_lines): (Vec<Job>, u64),
    request_bytes: &mut String,
    change_bytes: &mut Vec<u8>,
    shared: &Shared,
) {
    {
        shared
            .queued
            .fetch_sub(batch.len() as u64 + quiet_lines, Ordering::Relaxed);
        change_bytes.clear();
        for job in batch.iter().filter(|job| !job.line.is_empty()) {
            // Only changes come as jobs with a line (the requests' come in `request_bytes`).
            change_bytes.extend_from_slice(job.line.as_bytes());
            change_bytes.push(b'\n');
        }
        let mut result = Ok(());
        if !change_bytes.is_empty() {
            result = changes.append(change_bytes).and_then(|()| changes.sync());
            shared.syncs.fetch_add(1, Ordering::Relaxed);
        }
        if !request_bytes.is_empty() {
            // The requests' failure is the trail's too (shown, logged), and a waiting reader's.
            result = result.and(requests.append(request_bytes.as_bytes()));
            request_bytes.clear();
        }
        shared.batches.fetch_add(1, Ordering::Relaxed);
        let result = result.map_err(|why| {
            let why = format!("the audit trail could not be written: {why}");
            error!("{why}");
            why
        });
        *lock(&shared.last_error) = result.as_ref().err().cloned();
        {
            let mut recent = lock(&shared.recent);
            for job in batch
                .iter()
                .filter(|job| !job.line.is_empty() && result.is_ok())
            {
                if line::is_change_line(&job.line) {
                    push_recent(&mut recent, job.line.clone());
                }
            }
        }
        for job in batch {
            if let Some(done) = job.done {
                let _ = done.send(result.clone());
            }
        }
    }
}

/// Waits for the next batch: at once when a queued job is urgent, else up to [`BATCH_WINDOW`]
/// after the first quiet line. The requests' lines are swapped into `quiet` (empty when
/// called), the jobs returned with how many lines `quiet` then holds. `None` once the queue is
/// closed and empty.
fn next_batch(queue: &Queue, quiet: &mut String) -> Option<(Vec<Job>, u64)> {
    let mut state = lock(&queue.state);
    let mut gathering_until: Option<Instant> = None;
    loop {
        if state.jobs.is_empty() && state.quiet.is_empty() {
            if state.closed {
                return None;
            }
            gathering_until = None;
            state = queue
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        if state.urgent || state.closed {
            break;
        }
        let until = *gathering_until.get_or_insert_with(|| Instant::now() + BATCH_WINDOW);
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        state = queue
            .wake
            .wait_timeout(state, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    let take = state.jobs.len().min(MOST_PER_BATCH);
    let batch: Vec<Job> = state.jobs.drain(..take).collect();
    // Every request line queued so far, with the jobs: a waiter among them waits for the lines
    // queued before it, and those are all here.
    std::mem::swap(&mut state.quiet, quiet);
    let quiet_lines = std::mem::take(&mut state.quiet_lines);
    // What is left (beyond one batch) goes out right after, without another window.
    state.urgent = !state.jobs.is_empty();
    Some((batch, quiet_lines))
}

/// Memory only: lines kept in [`MemoryLines`].
struct MemorySink(Arc<Mutex<MemoryLines>>);

impl Sink for MemorySink {
    fn append(&mut self, lines: &[u8]) -> std::io::Result<()> {
        // One check of the batch: the lines were rendered from strings (`from_utf8` checks
        // ASCII a word at a time; the lossy form only for what cannot happen).
        let lines = match std::str::from_utf8(lines) {
            Ok(lines) => std::borrow::Cow::Borrowed(lines),
            Err(_) => String::from_utf8_lossy(lines),
        };
        lock(&self.0).push_lines(&lines);
        Ok(())
    }

    fn sync(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
