//! State shared by the listener, the ticker, every connection and every handle ([`Shared`]),
//! and the vocabulary they all speak: a [`ConnectionId`], a [`WriteRecord`], the faults, the
//! counters and the channels acquiring now. Everything else in the crate builds on it.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use station_protocol::{Notify, RawFrame, Request, Response, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::history::History;
use crate::profile::Profile;
use crate::station::{AppliedWrite, Station};

/// Identifies one connection (or one pty session) for the life of the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionId(pub u64);

/// One write the station applied. Refused writes are never recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRecord {
    /// When it was applied.
    pub at: Instant,
    /// The same moment, as time since the simulator started.
    pub since_start: Duration,
    pub channel: String,
    /// The value as applied (enum names in their canonical spelling).
    pub value: Value,
    pub connection: ConnectionId,
    /// The client's address, or `pty` for the pseudo-terminal.
    pub peer: String,
}

impl WriteRecord {
    pub(crate) fn applied(
        write: crate::station::AppliedWrite,
        connection: ConnectionId,
        peer: &str,
        at: Instant,
        since_start: Duration,
    ) -> WriteRecord {
        WriteRecord {
            at,
            since_start,
            channel: write.channel,
            value: write.value,
            connection,
            peer: peer.to_owned(),
        }
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Faults that apply to every connection.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub stalled: AtomicBool,
    pub corrupt_next: AtomicBool,
    /// Only the next WRITE reply: whatever else is answered meanwhile (a PING) is left whole.
    pub corrupt_next_write_reply: AtomicBool,
    pub reply_delay: Mutex<Duration>,
    pub processing: Mutex<Duration>,
    /// A station that ignores SPEC.md §4: a closed connection's requests are carried out
    /// anyway (their writes applied, never answered) instead of abandoned.
    pub ignores_close: AtomicBool,
    /// Extra time the next WRITE to a channel takes (one request only: the first WRITE
    /// touching that channel takes it).
    pub next_write_extra: Mutex<Option<(String, Duration)>>,
    /// The most bytes a BUS reply carries, whatever the bus received (a short read).
    pub bus_read_limit: Mutex<Option<usize>>,
    /// Time a CONFIGURE inquiry (no settings) takes before it is answered.
    pub inquiry_delay: Mutex<Duration>,
}

impl Faults {
    pub(crate) fn reply_delay(&self) -> Duration {
        *lock(&self.reply_delay)
    }

    pub(crate) fn processing(&self) -> Duration {
        *lock(&self.processing)
    }

    /// The extra time of the next WRITE to its channel, taken by the first `request` that
    /// writes that channel (so only one request gets it).
    pub(crate) fn take_next_write_extra(&self, request: &Request) -> Duration {
        let Request::Write { items } = request else {
            return Duration::ZERO;
        };
        let mut armed = lock(&self.next_write_extra);
        match armed.as_ref() {
            Some((channel, extra)) if items.iter().any(|(name, _)| name == channel) => {
                let extra = *extra;
                *armed = None;
                extra
            }
            _ => Duration::ZERO,
        }
    }

    pub(crate) fn bus_read_limit(&self) -> Option<usize> {
        *lock(&self.bus_read_limit)
    }
}

/// Counters for tests.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub read_frames: AtomicU64,
    /// The number of names in each READ frame answered (the newest; see `history`).
    pub read_batches: Mutex<History<usize>>,
    pub connections_accepted: AtomicU64,
    /// RESETs carried out (`reset.rs`).
    pub resets: AtomicU64,
    /// Requests abandoned because their connection closed before they were carried out.
    pub abandoned: AtomicU64,
    /// Requests read and not yet carried out or abandoned (a closed connection's included,
    /// while a station that ignores SPEC.md §4 still works on them).
    pub working: AtomicU64,
}

/// Counts a request as being worked on until dropped.
pub(crate) struct Working(std::sync::Arc<Shared>);

impl Working {
    pub(crate) fn start(shared: std::sync::Arc<Shared>) -> Working {
        shared.stats.working.fetch_add(1, Ordering::SeqCst);
        Working(shared)
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.stats.working.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The NumericResult channels acquiring now.
#[derive(Debug, Default)]
pub(crate) struct Acquiring(Mutex<HashSet<String>>);

/// Marks a channel busy until dropped.
pub(crate) struct Busy<'a> {
    set: &'a Acquiring,
    channel: String,
}

impl Acquiring {
    pub(crate) fn claim(&self, channel: &str) -> Option<Busy<'_>> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(channel.to_owned()).then(|| Busy {
            set: self,
            channel: channel.to_owned(),
        })
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut set = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(&self.channel);
    }
}

pub(crate) struct ConnectionEntry {
    cancel: CancellationToken,
    outgoing: mpsc::Sender<RawFrame>,
}

pub(crate) struct ListenerCommand {
    pub accept: bool,
    pub done: oneshot::Sender<io::Result<()>>,
}

/// State shared by the listener, the ticker, every connection and every handle.
pub(crate) struct Shared {
    pub profile: Profile,
    pub started: Instant,
    pub station: Mutex<Station>,
    pub faults: Faults,
    pub stats: Stats,
    pub connections: Mutex<HashMap<ConnectionId, ConnectionEntry>>,
    pub next_connection: AtomicU64,
    /// The writes applied (the newest; see `history`).
    pub write_log: Mutex<History<WriteRecord>>,
    /// Attached pseudo-terminals by slave path; cancelling one detaches it.
    pub ptys: Mutex<HashMap<PathBuf, CancellationToken>>,
    pub local_addr: SocketAddr,
    pub listener_control: mpsc::Sender<ListenerCommand>,
    pub shutdown: CancellationToken,
    /// NumericResult channels acquiring now (SAMPLE).
    pub acquiring: Acquiring,
}

impl Shared {
    pub(crate) fn lock_station(&self) -> MutexGuard<'_, Station> {
        lock(&self.station)
    }

    /// Adds a connection to the registry: its id, its cancel token and its outgoing queue.
    pub(crate) fn register(
        &self,
        queue: usize,
    ) -> (
        ConnectionId,
        CancellationToken,
        mpsc::Sender<RawFrame>,
        mpsc::Receiver<RawFrame>,
    ) {
        let id = ConnectionId(self.next_connection.fetch_add(1, Ordering::SeqCst) + 1);
        let cancel = self.shutdown.child_token();
        let (tx, rx) = mpsc::channel(queue);
        self.stats
            .connections_accepted
            .fetch_add(1, Ordering::SeqCst);
        lock(&self.connections).insert(
            id,
            ConnectionEntry {
                cancel: cancel.clone(),
                outgoing: tx.clone(),
            },
        );
        (id, cancel, tx, rx)
    }

    pub(crate) fn unregister(&self, id: ConnectionId) {
        lock(&self.connections).remove(&id);
    }

    pub(crate) fn record_batch(&self, names: usize) {
        lock(&self.stats.read_batches).push(names);
    }

    /// Extra time the channels a request touches take.
    pub(crate) fn latency_of(&self, request: &Request) -> Duration {
        let station = self.lock_station();
        match request {
            Request::Read { names } => names.iter().map(|n| station.latency_of(n)).sum(),
            Request::Write { items } => items.iter().map(|(n, _)| station.latency_of(n)).sum(),
            Request::Transact { name, .. } => station.latency_of(name),
            Request::Bus(bus) => station.latency_of(&bus.channel),
            // A change of configuration, not an inquiry (a CONFIGURE without settings).
            Request::Configure(configure) if !configure.settings.is_empty() => {
                station.latency_of(&configure.name)
            }
            Request::Configure(_) => *lock(&self.faults.inquiry_delay),
            _ => Duration::ZERO,
        }
    }

    pub(crate) fn log_writes(&self, applied: Vec<AppliedWrite>, id: ConnectionId, peer: &str) {
        if applied.is_empty() {
            return;
        }
        let at = Instant::now();
        let since_start = at.saturating_duration_since(self.started);
        let mut log = lock(&self.write_log);
        for write in applied {
            log.push(WriteRecord::applied(write, id, peer, at, since_start));
        }
    }

    /// Sends the station's pending notifications to every connection.
    pub(crate) fn flush_notifies(&self) {
        let notifies = self.lock_station().take_notifies();
        for notify in notifies {
            self.broadcast(notify);
        }
    }

    pub(crate) fn broadcast(&self, notify: Notify) {
        tracing::info!(?notify, "notify");
        let Ok(frame) = Response::Notify(notify).to_frame(0) else {
            return;
        };
        for entry in lock(&self.connections).values() {
            // A client too slow to drain its queue misses a notification rather than
            // holding up the station.
            let _ = entry.outgoing.try_send(frame.clone());
        }
    }

    pub(crate) fn drop_connections(&self) {
        let dropped: Vec<_> = lock(&self.connections).drain().collect();
        for (_, entry) in dropped {
            entry.cancel.cancel();
        }
    }
}
