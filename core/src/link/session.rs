//! The bookkeeping of one connection, without I/O: request ids, what is in flight and until
//! when, the changes in doubt, the PING that checks the station still answers, and the one
//! check that a reply answers its request. Unit-tested below with `Instant`s passed in.
//!
//! A change (anything sent under a send guard: a write, a consuming read, a SAMPLE) answered
//! 504 is in doubt, not lost: the station may still carry it out. It stays in doubt, counted
//! under its fence in the station's [`DoubtBook`] (which the session borrows from the link task
//! and gives back when it ends), until its late answer comes (dropped, but it settles it) or
//! `station.max_processing_ms` has passed since it was sent (a SAMPLE: since its last frame);
//! a change still at the station when the session ends stays in doubt the same way, for a
//! station on a serial line never sees the close and a station may ignore one. At that bound
//! [`Session::lapse_doubts`] decides: if a lease's settle waits for its fence and it was sent on
//! this connection, the link is reset (`LinkDown::ChangeInDoubt`: the sending side closed, on
//! TCP the station's close awaited, then the usual reconnect); else it leaves doubt with a
//! warning. Either way it lapsed, and what a settle reports (`Settled::lapsed_at`) comes from
//! [`Session::take_lapsed`]: the lease machine's lock-delay runs from it.
//!
//! A SAMPLE is a streaming request (`InFlightKind::Stream`): each data frame keeps it in flight
//! with its deadline counted again, and the first gives its window slot back, so other requests
//! go out between its frames even on a window of 1.

use std::collections::HashMap;
use std::time::Duration;

use station_protocol::{ChangeType, ChannelDescriptor, Opcode, PayloadError, Response};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::command::PartSink;
pub use super::doubts::SettleScope;
use super::doubts::{DoubtBook, Lapsed};
use super::error::{LinkError, ProtocolError};
use super::read_queue::ReadBatch;

pub use super::doubts::FREE_FENCE;

/// Where the answer to a change or passed-through request goes.
pub type ResponseReply = oneshot::Sender<Result<Response, LinkError>>;

/// What a request in flight was for.
pub enum InFlightKind {
    /// A request answered by several frames (SAMPLE, SPEC.md §6.12): every frame but the last
    /// goes to `parts` and keeps it in flight; the last (or an ERROR) ends it.
    Stream {
        parts: PartSink,
    },
    Read(ReadBatch),
    Change {
        reply: ResponseReply,
        /// The channels whose values its answer carries, for the cache: a TRANSACT's channel,
        /// a guarded READ's names (reads of channels whose read consumes data).
        answers_for: Vec<String>,
    },
    Pass {
        reply: ResponseReply,
    },
    Ping,
    /// A page of a LIST refresh after a configuration change, with the pages so far.
    ListPage {
        change: ChangeType,
        channels: Vec<ChannelDescriptor>,
    },
    /// CONFIGURE's inquiry of one channel, in a LIST refresh (the refresh keeps the rest).
    ConfigInquiry,
}

/// A request on the wire.
pub struct InFlight {
    pub sent_at: Instant,
    pub deadline: Instant,
    /// What was asked, to check the reply against.
    pub asked: Opcode,
    /// For a change, the lease fence its send guard admitted it under.
    pub fence: Option<u64>,
    pub kind: InFlightKind,
    /// A streaming request gives its window slot back with its first frame (SPEC.md §6.12).
    released: bool,
}

/// What became of the changes in doubt whose time ran out ([`Session::lapse_doubts`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Lapse {
    /// Nobody waits for them: their fences (one per change; empty when none lapsed).
    Forgotten(Vec<u64>),
    /// Someone waits for `fence`, one of theirs: reset the link before they go on.
    Reset { fence: u64 },
}

/// What a reply with a request id turned out to be.
pub enum Reply {
    /// It answers its request: the station's response, or its ERROR.
    Answer(InFlight, Response),
    /// One frame of a streaming answer that is not the last: the request stays in flight,
    /// its deadline counted again from this frame. The frame goes to the sink.
    Part(PartSink, Response),
    /// It has a known id but does not answer its request (wrong kind, unreadable payload).
    Mismatch(InFlight, ProtocolError),
    /// No request in flight has that id: a late reply after a timeout, or garbage. Dropped.
    Unknown,
}

/// The time the station takes over `request` by its own asking, beyond the request timeout:
/// a bus transaction's receive timeout (a UART's `TimeoutMs`); nothing for anything else.
pub fn allowance_of(request: &station_protocol::Request) -> Duration {
    match request {
        station_protocol::Request::Bus(bus) => bus.line.map_or(Duration::ZERO, |line| {
            Duration::from_millis(u64::from(line.timeout_ms))
        }),
        _ => Duration::ZERO,
    }
}

/// The requests in flight on one connection.
pub struct Session {
    window: usize,
    timeout: Duration,
    next_id: u32,
    in_flight: HashMap<u32, InFlight>,
    /// Requests in flight that count against the window (all but the PING).
    busy: usize,
    /// Changes in flight per lease fence ([`FREE_FENCE`]: admitted while nobody held it).
    fences: HashMap<u64, usize>,
    /// The station's changes in doubt (this connection's and those of connections before it):
    /// they count as at the station (under their fence) until their late reply comes or
    /// `max_processing` has passed since they were sent.
    doubts: DoubtBook,
    /// The longest the station may take over a request (`station.max_processing_ms`).
    max_processing: Duration,
    ping_outstanding: bool,
    late_replies: u64,
}

impl Session {
    /// A session that keeps at most `window` requests in flight, each for at most `timeout`,
    /// and a change unanswered in time in doubt until `max_processing` after it was sent.
    pub fn new(window: usize, timeout: Duration, max_processing: Duration) -> Session {
        Session {
            window,
            timeout,
            max_processing: max_processing.max(timeout),
            next_id: 1,
            in_flight: HashMap::new(),
            busy: 0,
            fences: HashMap::new(),
            doubts: DoubtBook::default(),
            ping_outstanding: false,
            late_replies: 0,
        }
    }

    /// The session, keeping the station's changes in doubt in `doubts` (those of connections
    /// before it, from the link task).
    pub fn with_doubts(mut self, doubts: DoubtBook) -> Session {
        self.doubts = doubts;
        self
    }

    /// Ids from `next` on: those below went out before this session (the handshake's), and a
    /// late answer to one of them finds nothing in flight.
    pub fn ids_from(&mut self, next: u32) {
        self.next_id = next.max(1);
    }

    /// The next request id: never 0 (that is a notification's), never one still in flight.
    pub fn take_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.checked_add(1).unwrap_or(1);
            if !self.in_flight.contains_key(&id) && !self.doubts.holds_id(id) {
                return id;
            }
        }
    }

    /// Remembers that request `id` asking `asked` was sent at `now`; it times out a request
    /// timeout plus `allowance` later: the time the station takes over it by its own asking
    /// (a UART receive's `TimeoutMs`), which also keeps it in doubt that much longer.
    pub fn track(
        &mut self,
        id: u32,
        asked: Opcode,
        fence: Option<u64>,
        kind: InFlightKind,
        now: Instant,
        allowance: Duration,
    ) {
        match kind {
            InFlightKind::Ping => self.ping_outstanding = true,
            _ => self.busy += 1,
        }
        if let Some(fence) = fence {
            *self.fences.entry(fence).or_default() += 1;
        }
        let entry = InFlight {
            sent_at: now,
            deadline: now + self.timeout + allowance,
            asked,
            fence,
            kind,
            released: false,
        };
        if let Some(replaced) = self.in_flight.insert(id, entry) {
            self.forget(&replaced);
        }
    }

    /// Whether the station's window has room for one more request.
    pub fn has_room(&self) -> bool {
        self.busy < self.window
    }

    /// When the next request in flight times out, or the next change in doubt outlives the
    /// longest the station may take over it.
    pub fn next_deadline(&self) -> Option<Instant> {
        let in_flight = self.in_flight.values().map(|f| f.deadline);
        in_flight.chain(self.doubts.next_lapse()).min()
    }

    /// Whether a PING is on the wire.
    pub fn ping_outstanding(&self) -> bool {
        self.ping_outstanding
    }

    /// Replies dropped because no request in flight had their id.
    pub fn late_replies(&self) -> u64 {
        self.late_replies
    }

    /// Whether changes that `scope` covers ([`FREE_FENCE`]: admitted while nobody held the
    /// lease) may still be at the station: sent and not yet answered, or in doubt (timed out
    /// or sent on a connection that ended, not answered late, and `max_processing` not yet
    /// passed). The end of a lease, and a new grant, wait until this is false.
    pub fn changes_at_the_station(&self, scope: SettleScope) -> bool {
        // (A fence leaves the map when its last change does.)
        self.fences.keys().any(|&fence| scope.covers(fence)) || self.doubts.holds(scope)
    }

    /// Whether a change of `fence` is in doubt (timed out and not answered since).
    #[cfg(test)]
    pub fn in_doubt_under(&self, fence: u64) -> bool {
        self.doubts.holds(SettleScope::Fence(fence))
    }

    /// The one check of a reply: its id is in flight, and it answers what was asked (the
    /// request's opcode with the reply bit, or an ERROR; a READ's reply has one result per
    /// name). The request leaves the in-flight map whatever the verdict.
    #[cfg(test)]
    pub fn verify_reply(
        &mut self,
        request_id: u32,
        reply: Result<Response, PayloadError>,
    ) -> Reply {
        self.verify_reply_at(request_id, reply, Instant::now())
    }

    /// [`Session::verify_reply`] for a frame that came at `now`. A frame of a streaming
    /// answer other than its last leaves the request in flight: it frees the request's window
    /// slot (the first time) and counts its deadline again from `now`.
    pub fn verify_reply_at(
        &mut self,
        request_id: u32,
        reply: Result<Response, PayloadError>,
        now: Instant,
    ) -> Reply {
        if let Ok(Response::Sample(part)) = &reply
            && !part.is_last()
            && let Some(entry) = self.in_flight.get_mut(&request_id)
            && let InFlightKind::Stream { parts } = &entry.kind
            && entry.asked == Opcode::Sample
        {
            let parts = parts.clone();
            entry.deadline = now + self.timeout;
            if !entry.released {
                entry.released = true;
                self.busy -= 1;
                // The station has started the acquisition: what follows is data, nothing it
                // could still change, so the end of its lease no longer waits for it.
                if let Some(fence) = entry.fence.take() {
                    self.release_fence(fence);
                }
            }
            if let Ok(response) = reply {
                return Reply::Part(parts, response);
            }
            return Reply::Unknown;
        }
        let Some(entry) = self.remove(request_id) else {
            // A change in doubt's late answer settles it.
            self.doubts.answered(request_id);
            self.late_replies += 1;
            return Reply::Unknown;
        };
        let response = match reply {
            Ok(response) => response,
            Err(error) => return Reply::Mismatch(entry, ProtocolError::BadPayload(error)),
        };
        match check_kind(&entry, &response) {
            Ok(()) => Reply::Answer(entry, response),
            Err(error) => Reply::Mismatch(entry, error),
        }
    }

    /// Takes out every request whose deadline is at or before `now`. A change among them
    /// (one with a fence) is in doubt from now until `max_processing` after it was sent.
    pub fn expired(&mut self, now: Instant) -> Vec<InFlight> {
        let ids: Vec<u32> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        let expired: Vec<(u32, InFlight)> = ids
            .into_iter()
            .filter_map(|id| Some((id, self.remove(id)?)))
            .collect();
        for (id, entry) in &expired {
            if let Some(fence) = entry.fence {
                let until = self.doubt_bound(entry);
                self.doubts.add(*id, fence, until);
            }
        }
        expired.into_iter().map(|(_, entry)| entry).collect()
    }

    /// Takes out every change in doubt that has outlived, at `now`, the longest the station
    /// may take over it: by the station's contract it was carried out or never will be, but
    /// the gateway cannot tell which. When someone waits for its fence (`waited_for`: a lease's
    /// end, a grant) and it was sent on this connection, the link is reset before they go on,
    /// so that a station that keeps SPEC.md §4 abandons it should it be slower than it says;
    /// otherwise it just leaves doubt. Either way the lapse is remembered for the settle.
    pub fn lapse_doubts(&mut self, now: Instant, waited_for: impl Fn(u64) -> bool) -> Lapse {
        let Lapsed { current, orphaned } = self.doubts.lapse(now);
        match current.iter().find(|&&fence| waited_for(fence)) {
            Some(&fence) => Lapse::Reset { fence },
            None => Lapse::Forgotten(current.into_iter().chain(orphaned).collect()),
        }
    }

    /// When the last change that `scope` covers left doubt unanswered (it outlived
    /// `max_processing`), if one did since the last time this was asked of its fences: the
    /// settle of a lease's end (or of a grant) asks, for its lock-delay.
    pub fn take_lapsed(&mut self, scope: SettleScope) -> Option<Instant> {
        self.doubts.take_lapsed(scope)
    }

    /// The instant after which the station can no longer carry out the change `entry` by its
    /// contract: `max_processing` after it was sent, and the time it takes by its own asking
    /// (a UART receive's `TimeoutMs`, its allowance) on top: the station is carrying it out
    /// until then. The deadline is a request timeout and the allowance after the sending.
    fn doubt_bound(&self, entry: &InFlight) -> Instant {
        entry.deadline - self.timeout + self.max_processing
    }

    /// Takes out everything in flight, when the session ends. A change among them stays in
    /// doubt until the station can no longer carry it out by its contract (a station on a
    /// serial line never sees the close, and one may ignore it), and so does every change in
    /// doubt already: only time settles them now.
    pub fn drain(&mut self) -> Vec<InFlight> {
        let ids: Vec<u32> = self.in_flight.keys().copied().collect();
        let drained: Vec<InFlight> = ids.into_iter().filter_map(|id| self.remove(id)).collect();
        self.doubts.connection_ended();
        for entry in &drained {
            if let Some(fence) = entry.fence {
                let until = self.doubt_bound(entry);
                self.doubts.orphan(fence, until);
            }
        }
        drained
    }

    /// Changes a gateway before this one left in doubt: only time settles them.
    pub fn inherit(&mut self, doubts: Vec<super::doubts::Doubt>) {
        for doubt in doubts {
            self.doubts.orphan(doubt.fence, doubt.until);
        }
    }

    /// The station's changes in doubt, as they are now.
    pub fn doubts(&self) -> &DoubtBook {
        &self.doubts
    }

    /// The station's changes in doubt, given back to the link task when the session ends
    /// (after [`Session::drain`]).
    pub fn take_doubts(&mut self) -> DoubtBook {
        std::mem::take(&mut self.doubts)
    }

    fn remove(&mut self, id: u32) -> Option<InFlight> {
        let entry = self.in_flight.remove(&id)?;
        self.forget(&entry);
        Some(entry)
    }

    fn forget(&mut self, entry: &InFlight) {
        match entry.kind {
            InFlightKind::Ping => self.ping_outstanding = false,
            _ if entry.released => {}
            _ => self.busy -= 1,
        }
        if let Some(fence) = entry.fence {
            self.release_fence(fence);
        }
    }

    /// One change of `fence` no longer in flight.
    fn release_fence(&mut self, fence: u64) {
        if let Some(count) = self.fences.get_mut(&fence) {
            *count -= 1;
            if *count == 0 {
                self.fences.remove(&fence);
            }
        }
    }
}

/// Whether `response` is of the kind that answers `entry`'s request.
fn check_kind(entry: &InFlight, response: &Response) -> Result<(), ProtocolError> {
    let answered = response.opcode();
    if answered == Opcode::Error {
        return Ok(());
    }
    let kind_matches = answered as u8 == entry.asked as u8 | 0x80;
    match (&entry.kind, response) {
        (InFlightKind::Read(batch), Response::Read(results))
            if kind_matches && results.len() == batch.names.len() =>
        {
            Ok(())
        }
        (InFlightKind::Read(batch), _) => Err(ProtocolError::ReadMismatch {
            names: batch.names.len(),
            answered,
        }),
        _ if kind_matches => Ok(()),
        _ => Err(ProtocolError::UnexpectedReply {
            asked: entry.asked,
            answered,
        }),
    }
}

#[cfg(test)]
mod tests;
