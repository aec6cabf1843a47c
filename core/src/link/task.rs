//! The link task: the connect/back-off loop, and one session's `select!` over the framed
//! stream, the command channel and the timers. Every decision is made by the pure parts it
//! drives: [`ReadQueue`](super::read_queue::ReadQueue) (coalescing),
//! [`Session`](super::session::Session) (ids, in flight, timeouts, the reply check) and the
//! handshake; [`Connection`] turns their decisions into frames.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use station_protocol::ChangeType;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::LinkHandle;
use super::command::{Command, Settled};
use super::connection::{Connection, Shared};
use super::doubts::DoubtBook;
use super::error::{LinkDown, LinkError};
use super::handshake::{self, Connected};
use super::info::{ChannelTable, LinkEvent, LinkStats, PublishedInfo, StationInfo};
use super::owner_gate::OwnerGate;
use super::read_queue::CoalescePolicy;
use super::settings::LinkSettings;
use super::state::Settling;
use crate::cache::ValueCache;
use crate::config::MAX_PROCESSING_PER_TIMEOUT;

/// The most requests kept in flight, whatever the station offers.
const MAX_WINDOW: usize = 64;

/// The task that owns the station link. Make one with [`LinkTask::new`], spawn [`LinkTask::run`].
pub struct LinkTask {
    settings: LinkSettings,
    /// The longest the station may take over a request (`station.max_processing_ms`).
    max_processing: Duration,
    commands: mpsc::Receiver<Command>,
    shared: Shared,
    /// What outlives a connection: the station's changes in doubt and the settles waiting.
    between: BetweenSessions,
    /// The version of the doubts last published.
    doubts_published: u64,
    /// Opens the station's byte stream instead of its URL (a simulated station's pipe).
    opener: Option<super::transport::StationOpener>,
}

/// What the link task keeps while no session runs, and lends to each session.
#[derive(Default)]
struct BetweenSessions {
    /// The station's changes in doubt, across connections.
    doubts: DoubtBook,
    /// Settles waiting, answered as time settles the doubts.
    settling: Vec<Settling>,
}

/// Why a session with the station ended.
enum SessionEnd {
    Lost(LinkDown),
    Shutdown,
}

impl LinkTask {
    /// A link task whose station may take [`MAX_PROCESSING_PER_TIMEOUT`] request timeouts
    /// over a request (the default of `station.max_processing_ms`).
    pub fn new(settings: LinkSettings) -> (LinkTask, LinkHandle) {
        let max_processing = settings.request_timeout * MAX_PROCESSING_PER_TIMEOUT;
        LinkTask::with_max_processing(settings, max_processing)
    }

    /// A link task whose station may take `max_processing` over a request: how long a change
    /// answered 504 stays in doubt, and the most the end of a lease waits for it.
    pub fn with_max_processing(
        settings: LinkSettings,
        max_processing: Duration,
    ) -> (LinkTask, LinkHandle) {
        let max_processing = max_processing.max(settings.request_timeout);
        let (commands_tx, commands) = mpsc::channel(settings.queue_depth.max(1));
        let (info_tx, info_rx) = PublishedInfo::new(StationInfo {
            last_error: Some(LinkDown::Connecting.to_string()),
            ..StationInfo::default()
        });
        let (events, _) = broadcast::channel(256);
        let (doubts_tx, doubts) = watch::channel(Arc::default());
        let cache = Arc::new(ValueCache::new());
        let stats = Arc::new(LinkStats::default());
        let handle = LinkHandle {
            commands: commands_tx,
            info: info_rx,
            events: events.clone(),
            cache: cache.clone(),
            stats: stats.clone(),
            request_timeout: settings.request_timeout,
            max_processing,
            doubts,
        };
        let task = LinkTask {
            settings,
            max_processing,
            commands,
            shared: Shared {
                info: info_tx,
                events,
                cache,
                stats,
                restarted: Default::default(),
                owner: None,
                doubts: doubts_tx,
            },
            between: BetweenSessions::default(),
            doubts_published: 0,
            opener: None,
        };
        (task, handle)
    }

    /// Sends to the station only while `gate` says this gateway owns its link (a shared lease
    /// backend's link-owner lease): checked before connecting and right before every write.
    pub fn with_owner_gate(mut self, gate: Arc<OwnerGate>) -> LinkTask {
        self.shared.owner = Some(gate);
        self
    }

    /// Opens the station's byte stream with `opener` instead of the URL: each connection is
    /// what it returns (the deterministic simulation's in-memory pipes).
    pub fn with_opener(mut self, opener: super::transport::StationOpener) -> LinkTask {
        self.opener = Some(opener);
        self
    }

    /// Runs until `shutdown` is cancelled: connect, serve, and on loss reconnect.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = self.settings.reconnect_min;
        let mut generation = 0u64;
        let mut down = LinkDown::Connecting;
        // A gate that opens (a standby taking over, a station accepted again) ends the
        // back-off at once.
        let mut reopenings = self.shared.owner.as_ref().map(|gate| gate.reopenings());
        loop {
            if let Some(reopenings) = reopenings.as_mut() {
                reopenings.borrow_and_update();
            }
            let attempt = match self.shared.may_connect() {
                // Not even a HELLO without the link: another gateway may own the station.
                Err(not_owner) => Err(not_owner),
                Ok(()) => {
                    let connecting = handshake::connect(
                        &self.settings,
                        self.shared.owner.as_deref(),
                        self.opener.as_ref(),
                    );
                    tokio::pin!(connecting);
                    loop {
                        self.shared
                            .publish_doubts(&self.between.doubts, &mut self.doubts_published);
                        let next_lapse = self.between.doubts.next_lapse();
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => return,
                            result = &mut connecting => break result,
                            Some(command) = self.commands.recv() => self.between.take(command, &down),
                            _ = sleep_until_opt(next_lapse), if next_lapse.is_some() => {
                                self.between.lapse(self.max_processing);
                            }
                        }
                    }
                }
            };
            down = match attempt {
                Ok(connected) => {
                    backoff = self.settings.reconnect_min;
                    generation += 1;
                    if generation > 1 {
                        self.shared.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    match self.serve(connected, generation, &shutdown).await {
                        SessionEnd::Shutdown => return,
                        // Hole put back (reintroduce-holes only): a link drop erases the doubts.
                        SessionEnd::Lost(why) if crate::holes::active("link-drop-doubt") => {
                            self.between.doubts = DoubtBook::default();
                            why
                        }
                        SessionEnd::Lost(why) => why,
                    }
                }
                Err(why) => why,
            };
            self.publish_disconnected(&down, generation);
            let pause = tokio::time::sleep(backoff);
            tokio::pin!(pause);
            loop {
                self.shared
                    .publish_doubts(&self.between.doubts, &mut self.doubts_published);
                let next_lapse = self.between.doubts.next_lapse();
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    _ = &mut pause => break,
                    Ok(()) = reopened(&mut reopenings) => {
                        backoff = self.settings.reconnect_min;
                        break;
                    }
                    Some(command) = self.commands.recv() => self.between.take(command, &down),
                    _ = sleep_until_opt(next_lapse), if next_lapse.is_some() => {
                        self.between.lapse(self.max_processing);
                    }
                }
            }
            backoff = (backoff * 2).min(self.settings.reconnect_max);
        }
    }

    fn publish_disconnected(&self, why: &LinkDown, generation: u64) {
        let why = why.to_string();
        let previous = self.shared.info.borrow().clone();
        if previous.last_error.as_deref() == Some(why.as_str()) && !previous.connected {
            return;
        }
        warn!(station = %self.settings.url, "station link down: {why}");
        self.shared.info.send_replace(Arc::new(StationInfo {
            connected: false,
            generation,
            last_error: Some(why.clone()),
            hello: previous.hello.clone(),
            modules: previous.modules.clone(),
            channels: previous.channels.clone(),
        }));
        if previous.connected {
            let _ = self.shared.events.send(LinkEvent::Connection {
                connected: false,
                generation,
                last_error: Some(why),
            });
        }
    }

    async fn serve(
        &mut self,
        connected: Connected,
        generation: u64,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let Connected {
            framed,
            hello,
            modules,
            channels,
            configs,
            next_id,
        } = connected;
        let previous = self.shared.info.borrow().channels.clone();
        let restarted = self.shared.restarted.swap(false, Ordering::SeqCst);
        let changed = restarted || (!previous.channels.is_empty() && previous.channels != channels);
        info!(
            station = %self.settings.url, identity = %handshake::station_identity(&hello),
            firmware = %hello.firmware,
            window = hello.window, channels = channels.len(), generation, "station link up"
        );
        let window = usize::from(hello.window).clamp(1, MAX_WINDOW);
        self.shared.info.send_replace(Arc::new(StationInfo {
            connected: true,
            generation,
            last_error: None,
            hello: Some(hello),
            modules,
            channels: Arc::new(if restarted {
                ChannelTable::new(channels).configured_all(&configs)
            } else {
                ChannelTable::new(channels)
                    .with_first_directions_of(&previous)
                    .configured_all(&configs)
            }),
        }));
        let _ = self.shared.events.send(LinkEvent::Connection {
            connected: true,
            generation,
            last_error: None,
        });
        if changed {
            let _ = self.shared.events.send(LinkEvent::Configuration {
                change: ChangeType::Changed,
                generation,
            });
        }
        let settings = &self.settings;
        let policy = CoalescePolicy {
            quiet: settings.coalesce_quiet,
            max: settings.coalesce_max,
            max_names: settings.max_names_per_read,
        };
        let timeouts = (settings.request_timeout, self.max_processing);
        let carried = (
            std::mem::take(&mut self.between.doubts),
            std::mem::take(&mut self.between.settling),
        );
        let mut c = Connection::new(framed, generation, window, timeouts, policy, carried);
        c.ids_from(next_id);
        let end = self.session_loop(&mut c, shutdown).await;
        if let SessionEnd::Lost(LinkDown::ChangeInDoubt { .. }) = &end {
            // The reset: the connection is closed, and on TCP the station has closed its side
            // (having abandoned or finished the change in doubt), before anyone waiting for the
            // change is answered (below) and before the next connection (SPEC.md §4).
            let station_closes = matches!(
                self.settings.url,
                crate::config::station_url::StationUrl::Tcp { .. }
            );
            c.close(station_closes, self.settings.request_timeout).await;
        }
        let why = match &end {
            SessionEnd::Lost(why) => why.clone(),
            SessionEnd::Shutdown => LinkDown::ShuttingDown,
        };
        (self.between.doubts, self.between.settling) = c.fail_everything(&why);
        self.between.answer_settled();
        // What is still at the station as the session ends, for the ledger (a clean stop too).
        self.shared
            .publish_doubts(&self.between.doubts, &mut self.doubts_published);
        while let Ok(command) = self.commands.try_recv() {
            self.between.take(command, &why);
        }
        end
    }
    async fn session_loop(
        &mut self,
        c: &mut Connection,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        loop {
            self.shared
                .publish_doubts(c.doubts(), &mut self.doubts_published);
            if let Err(why) = c.dispatch(&self.shared).await {
                return SessionEnd::Lost(why);
            }
            let next_deadline = c.next_deadline();
            let next_release = c.next_release();
            // (A closed gate: at once.)
            let owned_until = self
                .shared
                .owner
                .as_ref()
                .map(|gate| gate.until().unwrap_or_else(Instant::now))
                // Hole put back (reintroduce-holes only): a gate once opened never closes by
                // itself, so its lapse ends no session.
                .filter(|_| {
                    !(crate::holes::active("owner-gate-never-closes")
                        && self
                            .shared
                            .owner
                            .as_ref()
                            .is_some_and(|g| g.until().is_some()))
                });
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
                frame = c.framed.next() => {
                    // Take every answer already buffered, and every queued command, before
                    // sending anything: one write and one flush for all of them.
                    let mut next = Some(frame);
                    while let Some(frame) = next {
                        match frame {
                            Some(Ok(frame)) => {
                                if let Err(why) = c.on_frame(&self.shared, frame) {
                                    return SessionEnd::Lost(why);
                                }
                            }
                            Some(Err(error)) => return SessionEnd::Lost(LinkDown::Read(Arc::new(error))),
                            None => {
                                c.count_codec_errors(&self.shared);
                                return SessionEnd::Lost(LinkDown::Closed);
                            }
                        }
                        next = c.framed.next().now_or_never();
                    }
                    c.count_codec_errors(&self.shared);
                    self.take_commands(c);
                }
                command = self.commands.recv() => {
                    let Some(command) = command else { return SessionEnd::Shutdown };
                    c.enqueue(command);
                    self.take_commands(c);
                }
                _ = sleep_until_opt(next_release), if next_release.is_some() => {}
                // The link-owner lease lapsing (not renewed in time) ends the session at once.
                _ = sleep_until_opt(owned_until), if owned_until.is_some() => {
                    if let Err(not_owner) = self.shared.may_send() {
                        return SessionEnd::Lost(not_owner);
                    }
                }
                _ = sleep_until_opt(next_deadline), if next_deadline.is_some() => {
                    if let Err(why) = c.on_timeouts(&self.shared) {
                        return SessionEnd::Lost(why);
                    }
                }
            }
        }
    }

    fn take_commands(&mut self, c: &mut Connection) {
        while let Ok(command) = self.commands.try_recv() {
            c.enqueue(command);
        }
    }
}

impl BetweenSessions {
    /// A command: a settle waits for the doubts (answered at once when
    /// nothing it covers is in doubt), inherited doubts join the book, anything else fails.
    fn take(&mut self, command: Command, down: &LinkDown) {
        match command {
            Command::Settle { scope, reply } => {
                self.settling.push((scope, reply));
                self.answer_settled();
            }
            Command::Inherit { doubts } => {
                for doubt in doubts {
                    self.doubts.orphan(doubt.fence, doubt.until);
                }
            }
            other => other.fail(LinkError::Disconnected(down.clone())),
        }
    }

    /// While no session runs: doubts whose bound has passed lapse, and the settles nothing
    /// holds any more are answered.
    fn lapse(&mut self, max_processing: Duration) {
        let lapsed = self.doubts.lapse(Instant::now());
        for fence in lapsed.current.iter().chain(&lapsed.orphaned) {
            warn!(
                fence,
                "a change still at the station when the link went down is unanswered {} ms after it was sent (station.max_processing_ms): the station has carried it out or never will",
                max_processing.as_millis()
            );
        }
        self.answer_settled();
    }

    /// Answers the settles waiting while no session runs whose changes are no longer in doubt.
    fn answer_settled(&mut self) {
        let doubts = &self.doubts;
        let (settled, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.settling)
            .into_iter()
            .partition(|(scope, _)| !doubts.holds(*scope));
        self.settling = waiting;
        for (scope, reply) in settled {
            let lapsed_at = self.doubts.take_lapsed(scope);
            let _ = reply.send(Settled { lapsed_at });
        }
    }
}

impl Command {
    /// Answers a command the task cannot serve with `error`.
    fn fail(self, error: LinkError) {
        match self {
            Command::Read { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Command::Change { reply, .. } | Command::Pass { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Command::Stream { parts, .. } => {
                let _ = parts.send(Err(error));
            }
            // Never failed: `LinkTask::offline` keeps them.
            Command::Settle { .. } | Command::Inherit { .. } => {
                debug_assert!(false, "a settle or an inheritance is never failed");
            }
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Completes when the owner gate reopened; never without a gate.
async fn reopened(
    reopenings: &mut Option<watch::Receiver<u64>>,
) -> Result<(), watch::error::RecvError> {
    match reopenings {
        Some(reopenings) => reopenings.changed().await,
        None => std::future::pending().await,
    }
}
