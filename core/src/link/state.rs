//! The link's state machine, for one connection from handshake to loss: every decision of
//! the link, taken without a socket or a clock. It is told what happens (`on_command`,
//! `on_frame`, `on_tick`, `on_link_down`, each with the time now) and asked what to send next
//! (`next_frame`), and answers each with [`Effect`]s for its shell ([`Connection`]) to carry
//! out: frames to write, answers to send, counters, what to publish, and the link going down.
//!
//! It stitches together the pure parts: [`Session`] (request ids, the window, timeouts, the
//! reply check, the book of doubts), [`ReadQueue`] (which reads go out merged, and their
//! readers' answers), `decisions` (which queued change goes out, judged by its send guard,
//! and what a reply or a timeout comes to) and `list_refresh` (the LIST refresh a
//! configuration NOTIFY starts). It owns the turn-taking of reads and changes, the filling of
//! the window, the settles waiting for the station's doubts, and the value cache's updates
//! (values the station answered, channels a change makes stale), which it writes as it
//! decides so that a reader is answered only once the cache holds the value.
//!
//! [`Connection`]: super::connection::Connection

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use station_protocol::{
    ChangeType, ChannelDescriptor, ConfigureReply, Notify, Opcode, RawFrame, Request, Response,
};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::command::{Command, PartSink, Settled};
use super::doubts::{DoubtBook, SettleScope};
use super::error::{LinkDown, LinkError};
use super::handshake;
use super::info::PublishedInfo;
use super::read_queue::{CoalescePolicy, ReadAnswer, ReadQueue};
use super::session::{self, InFlightKind, Lapse, Reply, ResponseReply, Session};
use crate::cache::ValueCache;

mod decisions;
mod list_refresh;

pub(crate) use decisions::Waiting;
use decisions::{Expired, Queued, ReadOutcome, ReplyPlan, Taken};
use list_refresh::{ListRefresh, ListStep};

/// One settle waiting: until no change its scope covers may still be at the station.
pub type Settling = (SettleScope, oneshot::Sender<Settled>);

/// What the state machine asks its shell to do, in the order given.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Write this frame (it leaves with the shell's next flush).
    Write(RawFrame),
    /// The answer to a change or passed-through request.
    Reply(ResponseReply, Result<Response, LinkError>),
    /// A frame of a streaming answer (SAMPLE), or why it ends.
    Part(PartSink, Result<Response, LinkError>),
    /// A request that comes to nothing: its caller gets the error.
    Fail(Waiting, LinkError),
    /// A settle none of whose changes may still be at the station.
    Settled(oneshot::Sender<Settled>, Settled),
    /// One of the link's counters to bump.
    Count(Count),
    /// A request answered this long after it was sent.
    Latency(Duration),
    /// The station answered a RESET: the next connection reports a configuration change.
    Restarted,
    /// A CONFIGURE answer's channel, to take into the published table at once.
    Configured(Box<ConfigureReply>),
    /// A LIST refresh is over: publish these channels with their configurations, then the
    /// `configuration` event.
    Relisted {
        change: ChangeType,
        channels: Vec<ChannelDescriptor>,
        configs: Vec<ConfigureReply>,
    },
    /// A NOTIFY from the station, for the link's event subscribers.
    Notified(Notify),
    /// The session is over for this reason: nothing more may be written. Always the last.
    Down(LinkDown),
}

/// Which of the link's counters an [`Effect::Count`] bumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// A merged READ of this many names was sent.
    ReadFrame { names: u64 },
    /// A change or passed-through request was sent.
    ChangeFrame,
    /// A change's send guard refused it at the moment of sending.
    RefusedByGuard,
    /// A reply came for no request in flight (late, after its timeout, or garbage).
    LateReply,
    /// A request went unanswered in time.
    Timeout,
}

impl Effect {
    /// Sends the answer an answering effect carries (a caller's, a settle's); any other
    /// effect comes back for the shell.
    pub(crate) fn deliver(self) -> Option<Effect> {
        match self {
            Effect::Reply(reply, answer) => {
                let _ = reply.send(answer);
            }
            // The caller may have given up; the station streams on until the end anyway.
            Effect::Part(parts, answer) => {
                let _ = parts.send(answer);
            }
            Effect::Fail(waiting, error) => waiting.answer(error),
            Effect::Settled(reply, settled) => {
                let _ = reply.send(settled);
            }
            other => return Some(other),
        }
        None
    }
}

/// The effects of one step, in order; whatever is not taken is dropped with it.
pub(crate) type Effects<'a> = std::vec::Drain<'a, Effect>;

/// The state of the link during one connection, between handshake and loss.
pub struct LinkState {
    generation: u64,
    request_timeout: Duration,
    max_processing: Duration,
    session: Session,
    reads: ReadQueue,
    /// Changes and passed-through requests waiting for room in the window, oldest first.
    changes: VecDeque<Queued>,
    /// Who waits until the changes a scope covers have left the station.
    settling: Vec<Settling>,
    /// The LIST refresh a configuration NOTIFY starts.
    list: ListRefresh,
    /// Whether reads go first at the next turn (reads and changes take turns).
    reads_turn: bool,
    /// The callers' work of this round of `next_frame` is out (or the window is full): a LIST
    /// refresh's inquiries take the room left, then the round ends.
    callers_done: bool,
    /// The effects of the step under way, handed out by draining (kept for its capacity).
    effects: Vec<Effect>,
}

impl LinkState {
    /// `window`: requests the station takes at once; `timeouts`: the request timeout, and the
    /// longest the station may take over a request; `doubts` and `settling`: the station's
    /// changes in doubt and the settles waiting, from the connections before this one.
    pub fn new(
        generation: u64,
        window: usize,
        timeouts: (Duration, Duration),
        policy: CoalescePolicy,
        (doubts, settling): (DoubtBook, Vec<Settling>),
    ) -> LinkState {
        let (request_timeout, max_processing) = timeouts;
        LinkState {
            generation,
            request_timeout,
            max_processing,
            session: Session::new(window, request_timeout, max_processing).with_doubts(doubts),
            reads: ReadQueue::new(policy),
            changes: VecDeque::new(),
            settling,
            list: ListRefresh::default(),
            reads_turn: true,
            callers_done: false,
            effects: Vec::new(),
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

    /// When the next request in flight times out (the next `on_tick` due).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.session.next_deadline()
    }

    /// When a held READ is due to be sent (the next `next_frame` worth asking).
    pub fn next_release(&self) -> Option<Instant> {
        self.reads.next_release(self.session.has_room())
    }

    /// A caller's command: a read joins the read queue, a change or passed-through request
    /// the queue of changes, a settle waits (answered at once when nothing it covers is in
    /// doubt), inherited doubts join the book.
    pub(crate) fn on_command(&mut self, command: Command, now: Instant) -> Effects<'_> {
        match command {
            Command::Read {
                names,
                caller,
                reply,
            } => self.reads.enqueue(names, caller, reply, now),
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
        self.effects.drain(..)
    }

    /// The next frame to send, if the window has room and anything waits: reads and changes
    /// take turns so that neither starves the other (a change whose send guard refuses it now
    /// is answered instead, with a write's channels made stale in `cache` as it goes out);
    /// then a LIST refresh's configuration inquiries take the room the callers leave. Asked
    /// again until it writes nothing: that ends the round. `info` is the station's table
    /// and link generation as published, which the send guards are judged against.
    pub(crate) fn next_frame(
        &mut self,
        now: Instant,
        cache: &ValueCache,
        info: &PublishedInfo,
    ) -> Effects<'_> {
        if let Err(why) = self.fill_window(now, cache, info) {
            self.effects.push(Effect::Down(why));
        }
        self.effects.drain(..)
    }

    fn fill_window(
        &mut self,
        now: Instant,
        cache: &ValueCache,
        info: &PublishedInfo,
    ) -> Result<(), LinkDown> {
        if !self.callers_done {
            if self.session.has_room() {
                let mut sent = false;
                for reads in [self.reads_turn, !self.reads_turn] {
                    sent = if reads {
                        self.send_read_batch(now)?
                    } else {
                        self.send_change(now, cache, info)?
                    };
                    if sent {
                        break;
                    }
                }
                self.reads_turn = !self.reads_turn;
                if sent {
                    return Ok(());
                }
            }
            self.callers_done = true;
        }
        if self.send_config_inquiry(now)? {
            return Ok(());
        }
        self.callers_done = false;
        Ok(())
    }

    /// A frame from the station: a reply handed to whoever waits for it after the reply
    /// check (a READ's values into `cache` before its readers hear of them), or a NOTIFY.
    pub(crate) fn on_frame(
        &mut self,
        frame: RawFrame,
        now: Instant,
        cache: &ValueCache,
    ) -> Effects<'_> {
        match self.take_frame(frame, now, cache) {
            Ok(()) => self.answer_settled(),
            Err(why) => self.effects.push(Effect::Down(why)),
        }
        self.effects.drain(..)
    }

    fn take_frame(
        &mut self,
        frame: RawFrame,
        now: Instant,
        cache: &ValueCache,
    ) -> Result<(), LinkDown> {
        let response = Response::from_frame(&frame);
        if frame.request_id == 0 {
            match response {
                Ok(Response::Notify(notify)) => return self.on_notify(notify, now),
                Ok(other) => debug!("ignoring {:?} with request id 0", other.opcode()),
                Err(error) => warn!("ignoring an unreadable notification: {error}"),
            }
            return Ok(());
        }
        let (in_flight, answer) =
            match self
                .session
                .verify_reply_at(frame.request_id, response, now)
            {
                Reply::Part(parts, response) => {
                    self.effects.push(Effect::Part(parts, Ok(response)));
                    return Ok(());
                }
                Reply::Answer(in_flight, response) => (in_flight, Ok(response)),
                Reply::Mismatch(in_flight, error) => (in_flight, Err(error)),
                Reply::Unknown => {
                    self.effects.push(Effect::Count(Count::LateReply));
                    debug!(
                        request_id = frame.request_id,
                        late_replies = self.session.late_replies(),
                        "dropping a late or unknown reply"
                    );
                    return Ok(());
                }
            };
        self.effects.push(Effect::Latency(
            now.saturating_duration_since(in_flight.sent_at),
        ));
        let read_at = in_flight.sent_at.into_std();
        match decisions::plan_reply(in_flight.kind, answer) {
            ReplyPlan::Part { parts, answer } => self.effects.push(Effect::Part(parts, answer)),
            ReplyPlan::Read { batch, outcome } => match outcome {
                ReadOutcome::Answered(answer) => {
                    if let ReadAnswer::Values(results) = &answer {
                        for (name, result) in batch.names.iter().zip(results) {
                            match result {
                                Ok(value) => {
                                    cache.insert(name, value.clone(), read_at, self.generation)
                                }
                                Err(_) => cache.read_failed(name, read_at),
                            }
                        }
                    }
                    self.reads.answered(batch, answer, now);
                }
                ReadOutcome::Wrong(error) => self.reads.answered_wrongly(batch, error, now),
                ReadOutcome::Lost(error) => self.reads.lost(batch, error),
            },
            ReplyPlan::Answer {
                reply,
                cache: values,
                restarted,
                configured,
                answer,
            } => {
                for (name, value) in values {
                    cache.insert(&name, value, read_at, self.generation);
                }
                if restarted {
                    self.effects.push(Effect::Restarted);
                }
                if let Some(configured) = configured {
                    self.effects.push(Effect::Configured(configured));
                }
                self.effects.push(Effect::Reply(reply, answer));
            }
            ReplyPlan::Nothing => {}
            ReplyPlan::Inquiry { answer, warning } => {
                if let Some(warning) = warning {
                    warn!("{warning}");
                }
                let step = self.list.on_inquiry(answer);
                self.carry_out_list(step, now)?;
            }
            ReplyPlan::Page {
                change,
                channels,
                answer,
            } => {
                let step = self.list.on_page(change, channels, answer);
                self.carry_out_list(Some(step), now)?;
            }
        }
        Ok(())
    }

    /// A NOTIFY: a configuration change starts a LIST refresh (or makes the one running
    /// stale); every NOTIFY goes to the link's subscribers.
    fn on_notify(&mut self, notify: Notify, now: Instant) -> Result<(), LinkDown> {
        info!("station notification: {notify:?}");
        if let Notify::ConfigurationChanged { change, .. } = &notify {
            let starts = !self.list.is_running();
            match self.list.on_notify(*change) {
                Some(ListStep::AskPage { change, channels }) if starts => {
                    let kind = InFlightKind::ListPage { change, channels };
                    // A page that cannot be encoded starts no refresh.
                    if self.send(handshake::list_page(0), kind, now).is_err() {
                        self.list.page_not_sent();
                    }
                }
                // A refresh running, made stale: it starts over now if it only waited for
                // inquiries with none in flight.
                step => self.carry_out_list(step, now)?,
            }
        }
        self.effects.push(Effect::Notified(notify));
        Ok(())
    }

    /// Time has come to `now`: requests whose time is up are answered, and a PING checks that
    /// the station still answers at all; a PING that times out ends the session. A change in
    /// doubt that a settle waits for, still unanswered the longest the station may take, ends
    /// it too: the link is reset so that the change cannot land after the lease's end.
    pub(crate) fn on_tick(&mut self, now: Instant) -> Effects<'_> {
        // Down: the settles go back to the link task, answered only once the link is closed.
        match self.time_passes(now) {
            Ok(()) => self.answer_settled(),
            Err(why) => self.effects.push(Effect::Down(why)),
        }
        self.effects.drain(..)
    }

    fn time_passes(&mut self, now: Instant) -> Result<(), LinkDown> {
        let timeout = self.request_timeout;
        let settling = &self.settling;
        let waited_for = |fence: u64| settling.iter().any(|(scope, _)| scope.covers(fence));
        match self.session.lapse_doubts(now, waited_for) {
            Lapse::Reset { fence } => {
                warn!(
                    fence,
                    "a change in doubt is still unanswered {} ms after it was sent \
                     (station.max_processing_ms) and the end of its lease waits for it: \
                     resetting the link",
                    self.max_processing.as_millis()
                );
                return Err(LinkDown::ChangeInDoubt {
                    fence,
                    max_processing: self.max_processing,
                });
            }
            Lapse::Forgotten(fences) => {
                for fence in fences {
                    warn!(
                        fence,
                        "a change in doubt is still unanswered {} ms after it was sent \
                         (station.max_processing_ms): the station has carried it out or never \
                         will",
                        self.max_processing.as_millis()
                    );
                }
            }
        }
        let expired = self.session.expired(now);
        let expired_any = !expired.is_empty();
        let mut ping_timed_out = false;
        for in_flight in &expired {
            self.effects.push(Effect::Count(Count::Timeout));
            ping_timed_out |= matches!(in_flight.kind, InFlightKind::Ping);
        }
        for in_flight in expired {
            match decisions::expired(in_flight.kind, timeout, self.max_processing) {
                Expired::Ping => {}
                Expired::ReadLost(batch, error) => self.reads.lost(batch, error),
                Expired::Answer(waiting, error) => self.effects.push(Effect::Fail(waiting, error)),
                Expired::ListPage => {
                    let step = self.list.on_page_timeout();
                    self.carry_out_list(Some(step), now)?;
                }
                Expired::ConfigInquiry => {
                    warn!("the station did not answer a configuration inquiry in time");
                    let step = self.list.on_inquiry(None);
                    self.carry_out_list(step, now)?;
                }
            }
        }
        if ping_timed_out {
            return Err(LinkDown::PingTimeout(timeout));
        }
        if !expired_any || self.session.ping_outstanding() {
            return Ok(());
        }
        let id = self.session.take_id();
        let ping = Request::Ping {
            nonce: u64::from(id),
        };
        self.send_with_id(id, ping, InFlightKind::Ping, now)
    }

    /// The session ended for `why`: everything in flight and queued is answered (a change
    /// already sent has an unknown outcome and stays in doubt; anything else was not done).
    /// The station's doubts and the settles still waiting are taken with [`Self::carried`].
    pub(crate) fn on_link_down(&mut self, why: &LinkDown) -> Effects<'_> {
        for in_flight in self.session.drain() {
            // A READ's readers are among the read queue's, failed below.
            if let Some((waiting, error)) = decisions::cut_off(in_flight.kind, why) {
                self.effects.push(Effect::Fail(waiting, error));
            }
        }
        self.reads.fail_all(&LinkError::Disconnected(why.clone()));
        for queued in self.changes.drain(..) {
            let (waiting, error) = decisions::never_sent(queued, why);
            self.effects.push(Effect::Fail(waiting, error));
        }
        self.effects.drain(..)
    }

    /// What outlives the connection, for the link task to keep and answer as time settles the
    /// doubts: the station's changes in doubt and the settles still waiting.
    pub fn carried(&mut self) -> (DoubtBook, Vec<Settling>) {
        (
            self.session.take_doubts(),
            std::mem::take(&mut self.settling),
        )
    }

    /// Answers who waits for a scope none of whose changes may still be at the station.
    fn answer_settled(&mut self) {
        if self.settling.is_empty() {
            return;
        }
        let session = &self.session;
        let (settled, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.settling)
            .into_iter()
            .partition(|(scope, _)| !session.changes_at_the_station(*scope));
        self.settling = waiting;
        for (scope, reply) in settled {
            let lapsed_at = self.session.take_lapsed(scope);
            self.effects
                .push(Effect::Settled(reply, Settled { lapsed_at }));
        }
    }

    /// Sends a request the link makes itself (PING, LIST, a configuration inquiry) and
    /// tracks it.
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
        self.effects.push(Effect::Write(frame));
        self.session
            .track(id, request.opcode(), None, kind, now, Duration::ZERO);
        Ok(())
    }

    /// Sends a LIST refresh's next configuration inquiry, if the window has room and the
    /// refresh asks for one.
    fn send_config_inquiry(&mut self, now: Instant) -> Result<bool, LinkDown> {
        let Some(name) = self.list.next_inquiry(self.session.has_room()) else {
            return Ok(false);
        };
        let request = handshake::config_inquiry(&name);
        self.send(request, InFlightKind::ConfigInquiry, now)?;
        Ok(true)
    }

    /// Carries out what the LIST refresh asks next: a page sent, its inquiries sent (and the
    /// refresh ended when there are none), the new table published, or a warning.
    fn carry_out_list(&mut self, step: Option<ListStep>, now: Instant) -> Result<(), LinkDown> {
        match step {
            None => Ok(()),
            Some(ListStep::AskPage { change, channels }) => {
                let request = handshake::list_page(channels.len());
                self.send(request, InFlightKind::ListPage { change, channels }, now)
            }
            Some(ListStep::Inquire) => {
                while self.send_config_inquiry(now)? {}
                // No channels, nothing to ask: it ends here (else as they are answered).
                let step = self.list.idle();
                self.carry_out_list(step, now)
            }
            Some(ListStep::Publish {
                change,
                channels,
                configs,
            }) => {
                self.effects.push(Effect::Relisted {
                    change,
                    channels,
                    configs,
                });
                Ok(())
            }
            Some(ListStep::GiveUp(why)) => {
                warn!("{why}");
                Ok(())
            }
        }
    }

    /// Sends the READ the read queue says is due, if any.
    fn send_read_batch(&mut self, now: Instant) -> Result<bool, LinkDown> {
        let Some(mut batch) = self.reads.next_batch(now) else {
            return Ok(false);
        };
        let names = batch.names.len() as u64;
        // The names lent to the request for its encoding, and taken back: no copy per READ.
        let request = Request::Read {
            names: std::mem::take(&mut batch.names),
        };
        let id = self.session.take_id();
        let encoded = encode(id, &request);
        if let Request::Read { names } = request {
            batch.names = names;
        }
        self.effects.push(Effect::Write(encoded?));
        self.session.track(
            id,
            Opcode::Read,
            None,
            InFlightKind::Read(batch),
            now,
            Duration::ZERO,
        );
        self.effects.push(Effect::Count(Count::ReadFrame { names }));
        Ok(true)
    }

    /// Sends the oldest queued change or passed-through request that may go out now (the
    /// decision is [`decisions::take`]'s; refused ones are answered and counted).
    fn send_change(
        &mut self,
        now: Instant,
        cache: &ValueCache,
        info: &PublishedInfo,
    ) -> Result<bool, LinkDown> {
        while let Some(queued) = self.changes.pop_front() {
            let channels = info.borrow().channels.clone();
            let judge = |guard: &super::guard::SendGuard| {
                let generation = info.borrow().generation;
                guard.check(cache, generation)
            };
            let (request, fence, kind, stale) =
                match decisions::take(queued, judge, |name| channels.get(name).is_some()) {
                    Taken::Abandoned => continue,
                    Taken::Refused { waiting, why } => {
                        self.effects.push(Effect::Count(Count::RefusedByGuard));
                        self.effects.push(Effect::Fail(waiting, why));
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
                    if let Some(waiting) = decisions::waiting(kind) {
                        let error = LinkError::TooLarge(Arc::new(error));
                        self.effects.push(Effect::Fail(waiting, error));
                    }
                    continue;
                }
            };
            let invalidated_at = now.into_std();
            for name in &stale {
                cache.invalidate(name, invalidated_at);
            }
            self.effects.push(Effect::Write(frame));
            let allowance = session::allowance_of(&request);
            self.session
                .track(id, request.opcode(), fence, kind, now, allowance);
            self.effects.push(Effect::Count(Count::ChangeFrame));
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
