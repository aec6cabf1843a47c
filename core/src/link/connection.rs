//! One connection's work between handshake and loss: queues the callers' commands, puts them
//! on the wire as the window allows, and hands every reply to whoever waits for it. The
//! decisions are the pure parts': [`ReadQueue`] (which reads go out merged), [`Session`]
//! (ids, the window, timeouts, doubt), `decisions` (which queued change goes out, judged by
//! its send guard, and what a reply comes to: cache writes, the restart flag, which caller
//! gets what) and `list_refresh` (the LIST refresh a configuration NOTIFY starts); this only
//! carries them out: the frames, the value cache, the counters and the published
//! [`StationInfo`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::SinkExt;
use station_protocol::{ChangeType, ChannelDescriptor, ConfigureReply, RawFrame, Request};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tracing::{info, warn};

use super::command::{Command, Settled};
use super::doubts::{DoubtBook, SettleScope};
use super::error::{LinkDown, LinkError};
use super::guard::SendGuard;
use super::handshake::Framing;
use super::info::{LinkEvent, LinkStats, PublishedInfo, StationInfo};
use super::owner_gate::OwnerGate;
use super::read_queue::{CoalescePolicy, ReadQueue};
use super::session::{self, InFlightKind, Session};
use crate::cache::ValueCache;

mod decisions;
mod list_refresh;
mod replies;

use decisions::{Queued, Taken};
use list_refresh::{ListRefresh, ListStep};

/// What the link task shares with its handles: the published state and the value cache.
pub struct Shared {
    pub info: PublishedInfo,
    pub events: broadcast::Sender<LinkEvent>,
    pub cache: Arc<ValueCache>,
    pub stats: Arc<LinkStats>,
    /// The station answered a RESET: it restarts its application, so the next connection
    /// reports a configuration change (`configuration` event) whatever its channel list.
    pub restarted: std::sync::atomic::AtomicBool,
    /// With a shared lease backend: this gateway's hold on the station's link, checked right
    /// before any frame is written (`None`: the only gateway there can be).
    pub owner: Option<Arc<OwnerGate>>,
    /// The station's changes in doubt, published whenever they change (the ledger of what the
    /// station is owed records them).
    pub doubts: tokio::sync::watch::Sender<Arc<Vec<super::doubts::Doubt>>>,
}

impl Shared {
    /// Publishes `book`'s doubts when they changed since `seen` (its version then).
    pub fn publish_doubts(&self, book: &DoubtBook, seen: &mut u64) {
        if book.version() != *seen {
            *seen = book.version();
            self.doubts.send_replace(Arc::new(book.doubts()));
        }
    }
}

impl Shared {
    /// `Err(NotOwner)` once this gateway may no longer send to the station.
    pub fn may_send(&self) -> Result<(), LinkDown> {
        match &self.owner {
            Some(gate) if !gate.owned_at(Instant::now()) => Err(LinkDown::NotOwner),
            _ => Ok(()),
        }
    }

    /// `Err` while this gateway may not even connect: not owner, or standing by because the
    /// station is another gateway's (a HELLO now could disturb a station that keeps one
    /// connection).
    pub fn may_connect(&self) -> Result<(), LinkDown> {
        self.may_send()?;
        match self.owner.as_ref().and_then(|gate| gate.standing_by()) {
            Some(why) => Err(LinkDown::NotThisStation(why)),
            None => Ok(()),
        }
    }
}

impl Shared {
    /// A LIST refresh's channels with the configurations its inquiries brought, then the
    /// `configuration` event: a client reloading on it finds every channel's details.
    fn publish_relisted(
        &self,
        channels: Vec<ChannelDescriptor>,
        configs: &[ConfigureReply],
        change: ChangeType,
        generation: u64,
    ) {
        let previous = self.info.borrow().clone();
        info!(
            channels = channels.len(),
            configured = configs.len(),
            "station channel list changed ({})",
            change.label()
        );
        self.info.send_replace(Arc::new(StationInfo {
            connected: previous.connected,
            generation: previous.generation,
            last_error: previous.last_error.clone(),
            hello: previous.hello.clone(),
            modules: previous.modules.clone(),
            channels: Arc::new(previous.channels.relisted(channels).configured_all(configs)),
        }));
        let _ = self
            .events
            .send(LinkEvent::Configuration { change, generation });
    }

    /// Takes a CONFIGURE answer's channel into the table at once, so whoever asked reads it
    /// back; the station's configuration NOTIFY brings the `configuration` event.
    fn publish_configured(&self, reply: &ConfigureReply) {
        let previous = self.info.borrow().clone();
        self.info.send_replace(Arc::new(StationInfo {
            connected: previous.connected,
            generation: previous.generation,
            last_error: previous.last_error.clone(),
            hello: previous.hello.clone(),
            modules: previous.modules.clone(),
            channels: Arc::new(previous.channels.configured(reply)),
        }));
    }
}

/// One settle waiting: until no change its scope covers may still be at the station.
pub type Settling = (SettleScope, tokio::sync::oneshot::Sender<Settled>);

/// The state of one connection, from handshake to loss.
pub struct Connection {
    pub framed: Framing,
    pub generation: u64,
    request_timeout: Duration,
    max_processing: Duration,
    session: Session,
    reads: ReadQueue,
    changes: VecDeque<Queued>,
    /// Who waits until the changes a scope covers have left the station.
    settling: Vec<Settling>,
    /// The LIST refresh a configuration NOTIFY starts (its decisions).
    list: ListRefresh,
    reads_turn: bool,
    codec_errors_seen: u64,
}

impl Connection {
    /// `timeouts`: the request timeout, and the longest the station may take over a request;
    /// `doubts` and `settling`: the station's changes in doubt and the settles waiting, from
    /// the connections before this one.
    pub fn new(
        framed: Framing,
        generation: u64,
        window: usize,
        timeouts: (Duration, Duration),
        policy: CoalescePolicy,
        (doubts, settling): (DoubtBook, Vec<Settling>),
    ) -> Connection {
        let (request_timeout, max_processing) = timeouts;
        Connection {
            framed,
            generation,
            request_timeout,
            max_processing,
            session: Session::new(window, request_timeout, max_processing).with_doubts(doubts),
            reads: ReadQueue::new(policy),
            changes: VecDeque::new(),
            settling,
            list: ListRefresh::default(),
            reads_turn: true,
            codec_errors_seen: 0,
        }
    }

    /// Request ids from `next` on (the handshake used those below).
    pub fn ids_from(&mut self, next: u32) {
        self.session.ids_from(next);
    }

    /// The station's changes in doubt, as they are now.
    pub fn doubts(&self) -> &DoubtBook {
        self.session.doubts()
    }

    /// When the next request in flight times out.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.session.next_deadline()
    }

    /// When a held READ is due to be sent.
    pub fn next_release(&self) -> Option<Instant> {
        self.reads.next_release(self.session.has_room())
    }

    pub fn enqueue(&mut self, command: Command) {
        match command {
            Command::Read {
                names,
                caller,
                reply,
            } => self.reads.enqueue(names, caller, reply, Instant::now()),
            Command::Change {
                request,
                guard,
                reply,
            } => self.changes.push_back(Queued::Change {
                request,
                guard,
                reply,
            }),
            Command::Pass { request, reply } => {
                self.changes.push_back(Queued::Pass { request, reply })
            }
            Command::Stream {
                request,
                guard,
                parts,
            } => self.changes.push_back(Queued::Stream {
                request,
                guard,
                parts,
            }),
            Command::Settle { scope, reply } => self.settling.push((scope, reply)),
            Command::Inherit { doubts } => self.session.inherit(doubts),
        }
        self.answer_settled();
    }

    /// Answers who waits for a scope none of whose changes may still be at the station.
    fn answer_settled(&mut self) {
        let session = &self.session;
        let (settled, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.settling)
            .into_iter()
            .partition(|(scope, _)| !session.changes_at_the_station(*scope));
        self.settling = waiting;
        for (scope, reply) in settled {
            let lapsed_at = self.session.take_lapsed(scope);
            let _ = reply.send(Settled { lapsed_at });
        }
    }

    /// Queues a request the link makes itself (READ, PING, LIST) and tracks it.
    fn send(&mut self, request: Request, kind: InFlightKind, now: Instant) -> Result<(), LinkDown> {
        let id = self.session.take_id();
        self.send_with_id(id, request, kind, now)
    }

    fn send_with_id(
        &mut self,
        id: u32,
        request: Request,
        kind: InFlightKind,
        now: Instant,
    ) -> Result<(), LinkDown> {
        let frame = encode(id, &request)?;
        self.send_frame(id, request.opcode(), frame, kind, now)
    }

    /// Starts sending an encoded frame and tracks its request until answered.
    fn send_frame(
        &mut self,
        id: u32,
        opcode: station_protocol::Opcode,
        frame: RawFrame,
        kind: InFlightKind,
        now: Instant,
    ) -> Result<(), LinkDown> {
        self.start_send(frame)?;
        self.session
            .track(id, opcode, None, kind, now, Duration::ZERO);
        Ok(())
    }

    fn start_send(&mut self, frame: RawFrame) -> Result<(), LinkDown> {
        self.framed
            .start_send_unpin(frame)
            .map_err(|error| LinkDown::Write(Arc::new(error)))
    }

    /// Closes the connection (a TCP connection's sending side; the rest when it is dropped)
    /// and, when `station_closes`, waits for the station to close its side too: it does so
    /// only once it has abandoned or finished every request of this connection (SPEC.md §4).
    /// Whatever it still sends meanwhile is dropped. At most `limit` in all.
    pub async fn close(&mut self, station_closes: bool, limit: Duration) {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let closed = async {
            let _ = self.framed.get_mut().shutdown().await;
            while station_closes && matches!(self.framed.next().await, Some(Ok(_))) {}
        };
        let _ = tokio::time::timeout(limit, closed).await;
    }

    pub async fn flush(&mut self) -> Result<(), LinkDown> {
        SinkExt::<RawFrame>::flush(&mut self.framed)
            .await
            .map_err(|error| LinkDown::Write(Arc::new(error)))
    }

    /// Answers everything in flight and queued when the session ends: a change already sent
    /// has an unknown outcome; everything else was not done.
    /// The session ended for `why`: everything queued and in flight is answered, a change
    /// still at the station stays in doubt, and the station's doubts and the settles still
    /// waiting go back to the link task, which answers them as time settles the doubts.
    pub fn fail_everything(&mut self, why: &LinkDown) -> (DoubtBook, Vec<Settling>) {
        for in_flight in self.session.drain() {
            // A READ's readers are among the read queue's, failed below.
            if let Some((waiting, error)) = decisions::cut_off(in_flight.kind, why) {
                waiting.answer(error);
            }
        }
        self.reads.fail_all(&LinkError::Disconnected(why.clone()));
        for queued in self.changes.drain(..) {
            let (waiting, error) = decisions::never_sent(queued, why);
            waiting.answer(error);
        }
        (
            self.session.take_doubts(),
            std::mem::take(&mut self.settling),
        )
    }

    pub fn count_codec_errors(&mut self, shared: &Shared) {
        let stats = self.framed.codec().stats();
        let total = stats.crc_errors + stats.header_errors;
        if total > self.codec_errors_seen {
            shared
                .stats
                .crc_errors
                .fetch_add(total - self.codec_errors_seen, Ordering::Relaxed);
            self.codec_errors_seen = total;
        }
    }

    /// Puts queued work on the wire while the station's window has room.
    pub async fn dispatch(&mut self, shared: &Shared) -> Result<(), LinkDown> {
        self.answer_settled();
        // Nothing is put on the wire by a gateway that may no longer own the link.
        shared.may_send()?;
        let mut sent_any = false;
        while self.session.has_room() {
            // Reads and changes take turns, so neither can starve the other.
            let mut sent = false;
            for reads in [self.reads_turn, !self.reads_turn] {
                sent = if reads {
                    self.send_read_batch(shared)?
                } else {
                    self.send_change(shared)?
                };
                if sent {
                    break;
                }
            }
            self.reads_turn = !self.reads_turn;
            if !sent {
                break;
            }
            sent_any = true;
        }
        // A LIST refresh's configuration inquiries take the room the callers leave.
        sent_any |= self.send_config_inquiries(Instant::now())?;
        // Frames queued outside dispatch (the LIST a configuration NOTIFY starts) go out too.
        if sent_any || !self.framed.write_buffer().is_empty() {
            // Checked again at the last moment before the bytes leave.
            shared.may_send()?;
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends a LIST refresh's next inquiries while the window has room, as many as the
    /// refresh asks for.
    fn send_config_inquiries(&mut self, now: Instant) -> Result<bool, LinkDown> {
        let mut sent = false;
        while let Some(name) = self.list.next_inquiry(self.session.has_room()) {
            let request = super::handshake::config_inquiry(&name);
            self.send(request, InFlightKind::ConfigInquiry, now)?;
            sent = true;
        }
        Ok(sent)
    }

    /// Carries out what the LIST refresh asks next: a page sent, its inquiries sent (and the
    /// refresh ended when there are none), the new table published, or a warning.
    fn carry_out_list(
        &mut self,
        shared: &Shared,
        step: Option<ListStep>,
        now: Instant,
    ) -> Result<(), LinkDown> {
        match step {
            None => Ok(()),
            Some(ListStep::AskPage { change, channels }) => {
                let request = super::handshake::list_page(channels.len());
                self.send(request, InFlightKind::ListPage { change, channels }, now)
            }
            Some(ListStep::Inquire) => {
                self.send_config_inquiries(now)?;
                // No channels, nothing to ask: it ends here (else as they are answered).
                let step = self.list.idle();
                self.carry_out_list(shared, step, now)
            }
            Some(ListStep::Publish {
                change,
                channels,
                configs,
            }) => {
                shared.publish_relisted(channels, &configs, change, self.generation);
                Ok(())
            }
            Some(ListStep::GiveUp(why)) => {
                warn!("{why}");
                Ok(())
            }
        }
    }

    /// Sends the READ the read queue says is due, if any.
    fn send_read_batch(&mut self, shared: &Shared) -> Result<bool, LinkDown> {
        let now = Instant::now();
        let Some(batch) = self.reads.next_batch(now) else {
            return Ok(false);
        };
        let mut batch = batch;
        let count = batch.names.len() as u64;
        // The names lent to the request for its encoding, and taken back: no copy per READ.
        let request = Request::Read {
            names: std::mem::take(&mut batch.names),
        };
        let id = self.session.take_id();
        let encoded = encode(id, &request);
        if let Request::Read { names } = request {
            batch.names = names;
        }
        self.send_frame(
            id,
            station_protocol::Opcode::Read,
            encoded?,
            InFlightKind::Read(batch),
            now,
        )?;
        shared.stats.frames_sent.fetch_add(1, Ordering::Relaxed);
        shared.stats.read_frames.fetch_add(1, Ordering::Relaxed);
        shared.stats.names_read.fetch_add(count, Ordering::Relaxed);
        Ok(true)
    }

    /// Sends the oldest queued change or passed-through request that may go out now (the
    /// decision is [`decisions::take`]'s; refused ones are answered and counted).
    fn send_change(&mut self, shared: &Shared) -> Result<bool, LinkDown> {
        while let Some(queued) = self.changes.pop_front() {
            let channels = shared.info.borrow().channels.clone();
            let judge = |guard: &SendGuard| {
                let generation = shared.info.borrow().generation;
                guard.check(&shared.cache, generation)
            };
            let (request, fence, kind, stale) =
                match decisions::take(queued, judge, |name| channels.get(name).is_some()) {
                    Taken::Abandoned => continue,
                    Taken::Refused { waiting, why } => {
                        shared
                            .stats
                            .refused_by_guard
                            .fetch_add(1, Ordering::Relaxed);
                        waiting.answer(why);
                        continue;
                    }
                    Taken::Send {
                        request,
                        fence,
                        kind,
                        stale,
                    } => (request, fence, kind, stale),
                };
            let id = self.session.take_id();
            let frame = match request.to_frame(id) {
                Ok(frame) => frame,
                Err(error) => {
                    kind.fail(LinkError::TooLarge(Arc::new(error)));
                    continue;
                }
            };
            let now = std::time::Instant::now();
            for name in &stale {
                shared.cache.invalidate(name, now);
            }
            self.start_send(frame)?;
            let allowance = session::allowance_of(&request);
            self.session
                .track(id, request.opcode(), fence, kind, Instant::now(), allowance);
            shared.stats.frames_sent.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }
}

/// A request's frame with `id`; an encoding failure ends the connection, naming the opcode.
fn encode(id: u32, request: &Request) -> Result<RawFrame, LinkDown> {
    request.to_frame(id).map_err(|source| LinkDown::Encode {
        opcode: request.opcode(),
        source: Arc::new(source),
    })
}
#[cfg(test)]
mod tests;
