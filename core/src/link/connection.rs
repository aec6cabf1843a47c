//! One connection's shell around the link's state machine ([`LinkState`]): it hands the state
//! machine the callers' commands, the station's frames and the time, and carries out the
//! effects it answers with: frames written and flushed (only while this gateway owns the
//! link), answers delivered, counters bumped, the published [`StationInfo`] and the link's
//! events. Every decision is the state machine's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::SinkExt;
use station_protocol::{ChangeType, ChannelDescriptor, ConfigureReply, RawFrame};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tracing::info;

use super::command::Command;
use super::doubts::DoubtBook;
use super::error::LinkDown;
use super::handshake::Framing;
use super::info::{LinkEvent, LinkStats, PublishedInfo, StationInfo};
use super::owner_gate::OwnerGate;
use super::read_queue::CoalescePolicy;
use super::state::{Count, Effect, Effects, LinkState, Settling};
use crate::cache::ValueCache;
#[cfg(test)]
use {
    super::doubts::SettleScope, super::error::LinkError, super::guard::SendGuard,
    station_protocol::Request,
};

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
    /// The station's changes in doubt and the lapses no settle took yet, published whenever
    /// they change (the ledger of what the station is owed records them).
    pub doubts: tokio::sync::watch::Sender<Arc<super::doubts::AtStation>>,
}

impl Shared {
    /// Publishes `book`'s doubts when they changed since `seen` (its version then).
    pub fn publish_doubts(&self, book: &DoubtBook, seen: &mut u64) {
        if book.version() != *seen {
            *seen = book.version();
            self.doubts.send_replace(Arc::new(book.at_station()));
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

/// One connection, from handshake to loss: the framed stream and the link's state machine.
pub struct Connection {
    pub framed: Framing,
    pub generation: u64,
    state: LinkState,
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
        carried: (DoubtBook, Vec<Settling>),
    ) -> Connection {
        Connection {
            framed,
            generation,
            state: LinkState::new(generation, window, timeouts, policy, carried),
            codec_errors_seen: 0,
        }
    }

    /// Request ids from `next` on (the handshake used those below).
    pub fn ids_from(&mut self, next: u32) {
        self.state.ids_from(next);
    }

    /// The station's changes in doubt, as they are now.
    pub fn doubts(&self) -> &DoubtBook {
        self.state.doubts()
    }

    /// When the next request in flight times out.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.state.next_deadline()
    }

    /// When a held READ is due to be sent.
    pub fn next_release(&self) -> Option<Instant> {
        self.state.next_release()
    }

    pub fn enqueue(&mut self, command: Command) {
        for effect in self.state.on_command(command, Instant::now()) {
            let rest = effect.deliver();
            debug_assert!(rest.is_none(), "a command only answers: {rest:?}");
        }
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

    /// The session ended for `why`: everything queued and in flight is answered, a change
    /// still at the station stays in doubt, and the station's doubts and the settles still
    /// waiting go back to the link task, which answers them as time settles the doubts.
    pub fn fail_everything(&mut self, why: &LinkDown) -> (DoubtBook, Vec<Settling>) {
        for effect in self.state.on_link_down(why) {
            let rest = effect.deliver();
            debug_assert!(rest.is_none(), "a session's end only answers: {rest:?}");
        }
        self.state.carried()
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

    /// Puts queued work on the wire while the station's window has room, and flushes.
    pub async fn dispatch(&mut self, shared: &Shared) -> Result<(), LinkDown> {
        // Nothing is put on the wire by a gateway that may no longer own the link.
        shared.may_send()?;
        let mut sent_any = false;
        loop {
            let effects = self
                .state
                .next_frame(Instant::now(), &shared.cache, &shared.info);
            if carry_out(&mut self.framed, shared, self.generation, effects)? == 0 {
                break;
            }
            sent_any = true;
        }
        // Frames queued outside dispatch (the LIST a configuration NOTIFY starts) go out too.
        if sent_any || !self.framed.write_buffer().is_empty() {
            // Checked again at the last moment before the bytes leave.
            shared.may_send()?;
            self.flush().await?;
        }
        Ok(())
    }

    /// Hands a frame from the station to the state machine. Frames it queues (the next LIST
    /// page) go out with the next dispatch's flush.
    pub fn on_frame(&mut self, shared: &Shared, frame: RawFrame) -> Result<(), LinkDown> {
        let effects = self.state.on_frame(frame, Instant::now(), &shared.cache);
        carry_out(&mut self.framed, shared, self.generation, effects).map(drop)
    }

    /// Answers requests whose time is up (see [`LinkState::on_tick`]); `Err` ends the session.
    pub fn on_timeouts(&mut self, shared: &Shared) -> Result<(), LinkDown> {
        self.count_codec_errors(shared);
        let effects = self.state.on_tick(Instant::now());
        carry_out(&mut self.framed, shared, self.generation, effects).map(drop)
    }
}

/// Carries out `effects` in order: writes into `framed`'s buffer, answers, counters and what
/// is published. Returns how many frames were written, or why the session is over (after
/// every answer among the effects was delivered).
fn carry_out(
    framed: &mut Framing,
    shared: &Shared,
    generation: u64,
    effects: Effects<'_>,
) -> Result<usize, LinkDown> {
    let mut written = 0;
    let mut down = None;
    for effect in effects {
        let Some(effect) = effect.deliver() else {
            continue;
        };
        match effect {
            Effect::Write(frame) => {
                if down.is_some() {
                    continue;
                }
                match framed.start_send_unpin(frame) {
                    Ok(()) => written += 1,
                    Err(error) => down = Some(LinkDown::Write(Arc::new(error))),
                }
            }
            Effect::Count(count) => count_in(&shared.stats, count),
            Effect::Latency(latency) => shared.stats.latency.observe(latency),
            Effect::Restarted => shared.restarted.store(true, Ordering::SeqCst),
            Effect::Configured(reply) => shared.publish_configured(&reply),
            Effect::Relisted {
                change,
                channels,
                configs,
            } => shared.publish_relisted(channels, &configs, change, generation),
            Effect::Notified(notify) => {
                let _ = shared.events.send(LinkEvent::Notify(notify));
            }
            Effect::Down(why) => {
                down.get_or_insert(why);
            }
            Effect::Reply(..) | Effect::Part(..) | Effect::Fail(..) | Effect::Settled(..) => {
                unreachable!("answers are delivered")
            }
        }
    }
    match down {
        Some(why) => Err(why),
        None => Ok(written),
    }
}

fn count_in(stats: &LinkStats, count: Count) {
    match count {
        Count::ReadFrame { names } => {
            stats.frames_sent.fetch_add(1, Ordering::Relaxed);
            stats.read_frames.fetch_add(1, Ordering::Relaxed);
            stats.names_read.fetch_add(names, Ordering::Relaxed);
        }
        Count::ChangeFrame => {
            stats.frames_sent.fetch_add(1, Ordering::Relaxed);
        }
        Count::RefusedByGuard => {
            stats.refused_by_guard.fetch_add(1, Ordering::Relaxed);
        }
        Count::LateReply => {
            stats.late_replies.fetch_add(1, Ordering::Relaxed);
        }
        Count::Timeout => {
            stats.timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
