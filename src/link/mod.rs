//! The station link: one task ([`LinkTask`]) owns the connection to the station; everyone else
//! holds a cheap, cloneable [`LinkHandle`] that sends it requests over a bounded channel.
//!
//! The task connects (HELLO, SYSTEM, LIST), pipelines requests up to the station's window,
//! merges concurrent reads into READ frames, lets concurrent reads of one channel share one
//! hardware read (single flight), times requests out, and reconnects with capped back-off.
//! What it learned of the station is published as a [`StationInfo`] snapshot; changes of state
//! are broadcast as [`LinkEvent`]s.

mod connection;
mod error;
mod handshake;
mod read_queue;
mod session;
mod task;
mod transport;
mod url;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use station_protocol::sample::{SampleAssembler, SampleEnd, SampleRequest};
use station_protocol::{
    ChangeType, ChannelConfig, ChannelDescriptor, Configure, ConfigureReply, HelloReply,
    ItemResult, ModuleInfo, Notify, Opcode, Request, Response, Value,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub use error::{HandshakeError, LinkDown, LinkError, OpenError, OutcomeCause, ProtocolError};
pub use task::{LinkSettings, LinkTask};
pub use url::{Parity, SerialSettings, StationUrl, UrlError};

use crate::cache::ValueCache;

/// A check run by the link task just before a change is put on the wire; an `Err` refuses it
/// with [`LinkError::Refused`] and it is never sent. This is where lease fencing happens.
///
/// It carries the lease fence the change was admitted under, so the link knows which changes
/// of a given lease are still at the station.
#[derive(Clone)]
pub struct SendGuard {
    fence: Option<u64>,
    check: Arc<GuardCheck>,
}

type GuardCheck = dyn Fn() -> Result<(), String> + Send + Sync;

impl SendGuard {
    /// A guard for a change admitted under the lease with `fence` (`None`: nobody held it).
    pub fn new(
        fence: Option<u64>,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) -> SendGuard {
        SendGuard {
            fence,
            check: Arc::new(check),
        }
    }

    /// The lease fence the change was admitted under.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Whether the change may still be sent; the reason it may not.
    pub fn check(&self) -> Result<(), String> {
        (self.check)()
    }
}

/// Calling a guard runs its check, as when it was a plain closure.
impl std::ops::Deref for SendGuard {
    type Target = GuardCheck;

    fn deref(&self) -> &GuardCheck {
        &*self.check
    }
}

/// The station's channel list, indexed by name, with the configuration (CONFIGURE, SPEC.md
/// §6.13) of the channels the station has told it this connection.
#[derive(Debug, Default)]
pub struct ChannelTable {
    pub channels: Vec<ChannelDescriptor>,
    by_name: HashMap<String, usize>,
    configs: HashMap<String, ChannelConfig>,
}

impl ChannelTable {
    pub fn new(channels: Vec<ChannelDescriptor>) -> ChannelTable {
        let by_name = channels
            .iter()
            .enumerate()
            .map(|(i, ch)| (ch.name.clone(), i))
            .collect();
        ChannelTable {
            channels,
            by_name,
            configs: HashMap::new(),
        }
    }

    /// A channel's configuration, once a CONFIGURE answer told it.
    pub fn config(&self, name: &str) -> Option<&ChannelConfig> {
        self.configs.get(name)
    }

    /// This table with the channel of a CONFIGURE answer replaced by what it says now.
    fn configured(&self, reply: &ConfigureReply) -> ChannelTable {
        let mut channels = self.channels.clone();
        if let Some(position) = self.position(&reply.channel.name) {
            channels[position] = reply.channel.clone();
        }
        let mut table = ChannelTable::new(channels);
        table.configs = self.configs.clone();
        table
            .configs
            .insert(reply.channel.name.clone(), reply.config.clone());
        table
    }

    /// A new list (LIST after a configuration NOTIFY) keeping the configurations known of
    /// channels still in it.
    fn relisted(&self, channels: Vec<ChannelDescriptor>) -> ChannelTable {
        let mut table = ChannelTable::new(channels);
        table.configs = self
            .configs
            .iter()
            .filter(|(name, _)| table.by_name.contains_key(*name))
            .map(|(name, config)| (name.clone(), config.clone()))
            .collect();
        table
    }

    pub fn get(&self, name: &str) -> Option<&ChannelDescriptor> {
        self.by_name.get(name).map(|&i| &self.channels[i])
    }

    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

/// What the gateway knows of the station, replaced as a whole whenever it changes.
#[derive(Debug, Default)]
pub struct StationInfo {
    pub connected: bool,
    /// Goes up by one at every successful (re)connection.
    pub generation: u64,
    pub last_error: Option<String>,
    pub hello: Option<HelloReply>,
    pub modules: Vec<ModuleInfo>,
    /// Kept from the last connection while the link is down.
    pub channels: Arc<ChannelTable>,
}

/// Changes on the link, for the event stream and the legacy listener.
#[derive(Debug, Clone)]
pub enum LinkEvent {
    Connection {
        connected: bool,
        generation: u64,
        last_error: Option<String>,
    },
    Configuration {
        change: ChangeType,
        generation: u64,
    },
    /// Every NOTIFY from the station, as it came.
    Notify(Notify),
}

/// Counters of the link's work, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct LinkStats {
    pub frames_sent: AtomicU64,
    pub read_frames: AtomicU64,
    pub names_read: AtomicU64,
    pub timeouts: AtomicU64,
    pub reconnects: AtomicU64,
    pub crc_errors: AtomicU64,
    pub refused_by_guard: AtomicU64,
    /// Replies whose request id was not in flight (late after a timeout, or unknown): dropped.
    pub late_replies: AtomicU64,
    /// Time from sending a request frame to its answer.
    pub latency: crate::metrics::Histogram,
}

impl LinkStats {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// What a caller asks of the link task.
pub(crate) enum Command {
    Read {
        names: Vec<String>,
        /// Who asks (a client connection), for telling a burst from one client's loop.
        caller: Option<Caller>,
        reply: oneshot::Sender<Result<Vec<ItemResult<Value>>, LinkError>>,
    },
    Change {
        request: Request,
        guard: Option<SendGuard>,
        reply: oneshot::Sender<Result<Response, LinkError>>,
    },
    /// Any other request, answered with the station's response as it came (legacy clients).
    Pass {
        request: Request,
        reply: oneshot::Sender<Result<Response, LinkError>>,
    },
    /// A request answered by several frames (SAMPLE), sent under `guard` like a change; every
    /// frame goes to `parts` as it comes.
    Stream {
        request: Request,
        guard: Option<SendGuard>,
        parts: session::PartSink,
    },
    /// Answered once no change admitted under `fence` may still be at the station.
    Settle {
        fence: u64,
        reply: oneshot::Sender<()>,
    },
}

/// A client connection, by its peer address: who asked for a read.
pub type Caller = std::net::SocketAddr;

/// A cloneable handle to the link task.
#[derive(Clone)]
pub struct LinkHandle {
    commands: mpsc::Sender<Command>,
    info: watch::Receiver<Arc<StationInfo>>,
    events: broadcast::Sender<LinkEvent>,
    cache: Arc<ValueCache>,
    stats: Arc<LinkStats>,
    request_timeout: Duration,
}

impl LinkHandle {
    /// Reads `names` from the hardware: a forced read. One result per name, in order.
    ///
    /// The read joins a READ of the same channel that has not been sent yet, never one
    /// already on the wire, so its value was read after the call.
    pub async fn read(&self, names: Vec<String>) -> Result<Vec<ItemResult<Value>>, LinkError> {
        self.read_as(None, names).await
    }

    /// [`LinkHandle::read`] for a client connection: readers from other connections that
    /// arrive just after this one's answer are gathered as a burst; this one's next read is not.
    pub async fn read_for(
        &self,
        caller: Caller,
        names: Vec<String>,
    ) -> Result<Vec<ItemResult<Value>>, LinkError> {
        self.read_as(Some(caller), names).await
    }

    async fn read_as(
        &self,
        caller: Option<Caller>,
        names: Vec<String>,
    ) -> Result<Vec<ItemResult<Value>>, LinkError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Read {
            names,
            caller,
            reply,
        })?;
        self.wait(answer, LinkError::Timeout(self.request_timeout))
            .await
    }

    /// Reads `names`, channels whose read consumes data, as a change: in its own READ frame,
    /// queued with the changes, sent only if `guard` still passes at that moment, and counted
    /// under the guard's fence until answered (so the end of a lease waits for it). Never merged
    /// with other reads. One result per name, in order.
    pub async fn read_guarded(
        &self,
        names: Vec<String>,
        guard: SendGuard,
    ) -> Result<Vec<ItemResult<Value>>, LinkError> {
        let asked = names.len();
        let (reply, answer) = oneshot::channel();
        self.send(Command::Change {
            request: Request::Read { names },
            guard: Some(guard),
            reply,
        })?;
        let response = self
            .wait(answer, LinkError::Timeout(self.request_timeout))
            .await
            .map_err(|error| match error {
                LinkError::WriteTimeout(timeout) => LinkError::Timeout(timeout),
                other => other,
            })?;
        match response {
            Response::Read(results) if results.len() == asked => Ok(results),
            Response::Read(results) => Err(LinkError::Protocol(ProtocolError::ReadMismatch {
                names: asked,
                answered: Response::Read(results).opcode(),
            })),
            Response::Error(error) => Err(LinkError::Station(error)),
            other => Err(unexpected(Opcode::Read, &other)),
        }
    }

    /// Writes `items` in one WRITE frame; one status per item.
    pub async fn write(
        &self,
        items: Vec<(String, Value)>,
        guard: Option<SendGuard>,
    ) -> Result<Vec<ItemResult<()>>, LinkError> {
        match self.change(Request::Write { items }, guard).await? {
            Response::Write(results) => Ok(results),
            other => Err(unexpected(Opcode::Write, &other)),
        }
    }

    /// Writes `value` to `name` and reads `name` back, as one step on the station.
    pub async fn transact(
        &self,
        name: String,
        value: Value,
        guard: Option<SendGuard>,
    ) -> Result<Value, LinkError> {
        match self
            .change(Request::Transact { name, value }, guard)
            .await?
        {
            Response::Transact(value) => Ok(value),
            other => Err(unexpected(Opcode::Transact, &other)),
        }
    }

    /// Restarts the station's application (RESET, SPEC.md §6.10). Once answered, the station
    /// drops its connections; the link reconnects by itself (generation + 1) and reports a
    /// configuration change.
    pub async fn reset(
        &self,
        requester: String,
        guard: Option<SendGuard>,
    ) -> Result<(), LinkError> {
        let request = Request::Reset(station_protocol::Reset { requester });
        match self.change(request, guard).await? {
            Response::Reset => Ok(()),
            other => Err(unexpected(Opcode::Reset, &other)),
        }
    }

    /// CONFIGURE: changes a channel's configuration under `guard` and answers with the channel
    /// as it is now; with no settings only asks (a read: no guard, nothing changes). The
    /// channel table is updated from the answer before it returns.
    pub async fn configure(
        &self,
        request: Configure,
        guard: Option<SendGuard>,
    ) -> Result<ConfigureReply, LinkError> {
        let response = if request.settings.is_empty() {
            match self.pass(Request::Configure(request)).await? {
                Response::Error(error) => return Err(LinkError::Station(error)),
                response => response,
            }
        } else {
            self.change(Request::Configure(request), guard).await?
        };
        match response {
            Response::Configure(reply) => Ok(*reply),
            other => Err(unexpected(Opcode::Configure, &other)),
        }
    }

    /// One bus transaction: the bytes the station received.
    pub async fn bus(
        &self,
        request: station_protocol::BusRequest,
        guard: Option<SendGuard>,
    ) -> Result<bytes::Bytes, LinkError> {
        match self.change(Request::Bus(request), guard).await? {
            Response::Bus(received) => Ok(received),
            other => Err(unexpected(Opcode::Bus, &other)),
        }
    }

    async fn change(
        &self,
        request: Request,
        guard: Option<SendGuard>,
    ) -> Result<Response, LinkError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Change {
            request,
            guard,
            reply,
        })?;
        match self
            .wait(answer, LinkError::WriteTimeout(self.request_timeout))
            .await?
        {
            Response::Error(error) => Err(LinkError::Station(error)),
            response => Ok(response),
        }
    }

    /// Returns once no change admitted under the lease with `fence` (`None`: while nobody held
    /// it) may still be at the station: each was answered, timed out and then answered late or
    /// taken as lost after a second timeout, or the link was reset. Changes of that fence still
    /// queued are not waited for: their send guard refuses them once the lease has ended, which
    /// the caller makes sure of first. Never fails: with no link, nothing is at the station.
    pub async fn settle(&self, fence: Option<u64>) {
        let (reply, settled) = oneshot::channel();
        let fence = fence.unwrap_or(session::FREE_FENCE);
        if self
            .commands
            .send(Command::Settle { fence, reply })
            .await
            .is_ok()
        {
            let _ = settled.await;
        }
    }

    /// Runs an acquisition (SAMPLE, SPEC.md §6.12) under `guard`: the samples in order and the
    /// station's end frame. Other requests keep flowing while its frames stream; each frame
    /// must come within the request timeout of the one before, and the whole within `expected`
    /// plus the request timeout.
    pub async fn sample(
        &self,
        request: SampleRequest,
        guard: Option<SendGuard>,
        expected: Duration,
    ) -> Result<(Vec<f64>, SampleEnd), LinkError> {
        let (parts_tx, mut parts) = mpsc::unbounded_channel();
        self.send(Command::Stream {
            request: Request::Sample(request),
            guard,
            parts: parts_tx,
        })?;
        let deadline = tokio::time::Instant::now() + expected + self.request_timeout;
        let mut assembler = SampleAssembler::new();
        loop {
            let part = tokio::time::timeout_at(deadline, parts.recv())
                .await
                .map_err(|_| LinkError::Timeout(expected + self.request_timeout))?;
            match part {
                None => return Err(LinkError::ShuttingDown),
                Some(Err(error)) => return Err(error),
                Some(Ok(Response::Sample(part))) => {
                    let done = assembler
                        .push(part)
                        .map_err(|e| LinkError::Protocol(ProtocolError::Samples(e)))?;
                    if let Some(done) = done {
                        return Ok(done);
                    }
                }
                Some(Ok(Response::Error(error))) => return Err(LinkError::Station(error)),
                Some(Ok(other)) => return Err(unexpected(Opcode::Sample, &other)),
            }
        }
    }

    /// Sends any request and returns the station's response as it came, errors included.
    pub async fn pass(&self, request: Request) -> Result<Response, LinkError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Pass { request, reply })?;
        self.wait(answer, LinkError::Timeout(self.request_timeout))
            .await
    }

    fn send(&self, command: Command) -> Result<(), LinkError> {
        self.commands
            .try_send(command)
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => {
                    LinkError::Overloaded(self.commands.max_capacity())
                }
                mpsc::error::TrySendError::Closed(_) => LinkError::ShuttingDown,
            })
    }

    async fn wait<T>(
        &self,
        answer: oneshot::Receiver<Result<T, LinkError>>,
        on_timeout: LinkError,
    ) -> Result<T, LinkError> {
        match tokio::time::timeout(self.request_timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(LinkError::ShuttingDown),
            Err(_) => Err(on_timeout),
        }
    }

    /// What the gateway knows of the station now.
    pub fn info(&self) -> Arc<StationInfo> {
        self.info.borrow().clone()
    }

    /// A receiver that sees every new [`StationInfo`].
    pub fn watch_info(&self) -> watch::Receiver<Arc<StationInfo>> {
        self.info.clone()
    }

    pub fn subscribe_events(&self) -> broadcast::Receiver<LinkEvent> {
        self.events.subscribe()
    }

    pub fn cache(&self) -> &Arc<ValueCache> {
        &self.cache
    }

    pub fn stats(&self) -> &Arc<LinkStats> {
        &self.stats
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Requests waiting for the link task to take them off the channel.
    pub fn queue_depth(&self) -> usize {
        self.commands.max_capacity() - self.commands.capacity()
    }
}

fn unexpected(asked: Opcode, response: &Response) -> LinkError {
    LinkError::Protocol(ProtocolError::UnexpectedReply {
        asked,
        answered: response.opcode(),
    })
}
