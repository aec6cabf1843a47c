//! The station link: one task ([`LinkTask`]) owns the connection to the station; everyone else
//! holds a cheap, cloneable [`LinkHandle`] that sends it requests over a bounded channel.
//!
//! The task connects (HELLO, SYSTEM, LIST), pipelines requests up to the station's window,
//! merges concurrent reads into READ frames, lets concurrent reads of one channel share one
//! hardware read (single flight), times requests out, and reconnects with capped back-off.
//! What it learned of the station is published as a [`StationInfo`] snapshot; changes of state
//! are broadcast as [`LinkEvent`]s.
//!
//! A request unanswered within the request timeout gets 504 and the task sends a PING; no
//! answer to it reconnects. A lost connection answers everything queued and in flight at once:
//! 503, or 502 for a change already sent (it may or may not have been applied), never success.
//! A hardware read of channels whose read consumes data ([`LinkHandle::read_guarded`]) is
//! queued with the changes under its send guard, never merged with other reads.
//! [`LinkHandle::settle`] returns once nothing of a lease's fence can still be at the station.
//! An answered RESET sets the connection's `restarted` flag, so the next connection reports a
//! `configuration` change.

mod command;
mod connection;
mod doubts;
mod error;
mod guard;
mod handshake;
mod info;
mod owner_gate;
mod read_queue;
mod session;
mod settings;
mod state;
mod task;
mod transport;

use std::sync::Arc;
use std::time::Duration;

use station_protocol::sample::{SampleAssembler, SampleEnd, SampleRequest};
use station_protocol::{Configure, ConfigureReply, ItemResult, Opcode, Request, Response, Value};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub use crate::config::station_url::{Parity, SerialSettings, StationUrl, UrlError};
use command::Command;
pub use command::{Caller, Settled};
pub use doubts::{ANY_FENCE, AtStation, Doubt, FREE_FENCE, Lapse, SettleScope};
pub use error::{HandshakeError, LinkDown, LinkError, OpenError, OutcomeCause, ProtocolError};
pub use guard::{
    Forbidden, GuardRefusal, Guarded, Interlock, InterlockBroken, Interlocks, LeaseSnapshot,
    LeaseWatch, SendGuard, SendMoment,
};
use info::InfoReader;
pub use info::{ChannelPlace, ChannelTable, LinkEvent, LinkStats, StationInfo};
pub use owner_gate::{IdentityVerdict, OwnerGate};
pub use settings::LinkSettings;
pub use task::LinkTask;
pub use transport::{StationOpener, StationStream};

use crate::cache::ValueCache;

/// A cloneable handle to the link task.
#[derive(Clone)]
pub struct LinkHandle {
    commands: mpsc::Sender<Command>,
    info: InfoReader,
    events: broadcast::Sender<LinkEvent>,
    cache: Arc<ValueCache>,
    stats: Arc<LinkStats>,
    request_timeout: Duration,
    /// The longest the station may take over a request (`station.max_processing_ms`).
    max_processing: Duration,
    /// The station's changes in doubt, as the link task last published them.
    doubts: watch::Receiver<Arc<AtStation>>,
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
                LinkError::WriteTimeout { timeout, .. } => LinkError::Timeout(timeout),
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
        let allowance = session::allowance_of(&request);
        self.send(Command::Change {
            request,
            guard,
            reply,
        })?;
        let in_doubt = LinkError::WriteTimeout {
            timeout: self.request_timeout + allowance,
            max_processing: self.max_processing,
        };
        match self
            .wait_up_to(self.request_timeout + allowance, answer, in_doubt)
            .await?
        {
            Response::Error(error) => Err(LinkError::Station(error)),
            response => Ok(response),
        }
    }

    /// Returns once no change that `scope` covers (one lease's fence at its end; every fence
    /// before a grant) may still be at the station: each was answered, or it is in doubt
    /// (timed out, or at the station when its connection ended) and was answered late or
    /// outlived `station.max_processing_ms` since it was sent — whatever happened to the link
    /// meanwhile, for a station on a serial line never sees a close and one may ignore it. A
    /// change of this connection still in doubt at that bound while this waits makes the link
    /// reset (close the connection, and reopen it) before this returns: a station that keeps
    /// SPEC.md §4 abandons a closed connection's requests. Changes still queued are not waited
    /// for: their send guard refuses them once the lease has ended, which the caller makes
    /// sure of first. Never fails. Says when the last of those changes left doubt unanswered
    /// ([`Settled::lapsed_at`]), if one did.
    pub async fn settle(&self, scope: SettleScope) -> Settled {
        let (reply, settled) = oneshot::channel();
        match self.commands.send(Command::Settle { scope, reply }).await {
            Ok(()) => settled.await.unwrap_or_default(),
            Err(_) => Settled::default(),
        }
    }

    /// Changes a gateway before this one left in doubt at the station (from the ledger of what
    /// the station is owed): each is waited for by settles, as this gateway's own would be.
    pub async fn inherit_doubts(&self, doubts: Vec<Doubt>) {
        if doubts.is_empty() {
            return;
        }
        let _ = self.commands.send(Command::Inherit { doubts }).await;
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
        self.wait_up_to(self.request_timeout, answer, on_timeout)
            .await
    }

    async fn wait_up_to<T>(
        &self,
        limit: Duration,
        answer: oneshot::Receiver<Result<T, LinkError>>,
        on_timeout: LinkError,
    ) -> Result<T, LinkError> {
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(LinkError::ShuttingDown),
            Err(_) => Err(on_timeout),
        }
    }

    /// What the gateway knows of the station now.
    pub fn info(&self) -> Arc<StationInfo> {
        self.info.full()
    }

    /// What the gateway knows of the station now, to look at without keeping it: the read
    /// path's way, which writes nothing the other worker threads share.
    pub fn info_now(&self) -> arc_swap::Guard<Arc<StationInfo>> {
        self.info.now()
    }

    /// A receiver that sees every new [`StationInfo`].
    pub fn watch_info(&self) -> watch::Receiver<Arc<StationInfo>> {
        self.info.watch()
    }

    /// The station's changes in doubt and the lapses no settle took yet, whenever they change
    /// (for the ledger of what the station is owed).
    pub fn watch_doubts(&self) -> watch::Receiver<Arc<AtStation>> {
        self.doubts.clone()
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

    /// The longest the station may take over a request (`station.max_processing_ms`).
    pub fn max_processing(&self) -> Duration {
        self.max_processing
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
