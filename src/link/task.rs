//! The link task: owns the byte stream to the station, and everything in flight on it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, SinkExt, StreamExt};
use station_protocol::{
    ChangeType, ChannelDescriptor, Hello, HelloReply, ItemResult, ModuleInfo, Notify,
    PROTOCOL_VERSION, RawFrame, Request, Response, StationCodec, StationError, Value,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::transport::{self, StationStream};
use super::url::StationUrl;
use super::{
    Caller, ChannelTable, Command, LinkError, LinkEvent, LinkHandle, LinkStats, SendGuard,
    StationInfo,
};
use crate::cache::ValueCache;

/// How the link task connects and paces its work.
#[derive(Debug, Clone)]
pub struct LinkSettings {
    pub url: StationUrl,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    pub max_names_per_read: usize,
    /// How long a burst of reads of one channel is gathered: until no new reader came for
    /// `coalesce_quiet`, at most `coalesce_max` after the first was held.
    pub coalesce_quiet: Duration,
    pub coalesce_max: Duration,
    pub queue_depth: usize,
    /// Sent in HELLO, for the station's log.
    pub client_name: String,
}

/// Names per LIST page asked of the station.
const LIST_PAGE: u16 = 128;
/// Payload bytes a READ may fill with names; leaves room under the frame limit.
const READ_PAYLOAD_BUDGET: usize = 60_000;
/// The most requests kept in flight, whatever the station offers.
const MAX_WINDOW: usize = 64;

type Framing = Framed<Box<dyn StationStream>, StationCodec>;

/// The task that owns the station link. Make one with [`LinkTask::new`], spawn [`LinkTask::run`].
pub struct LinkTask {
    settings: LinkSettings,
    commands: mpsc::Receiver<Command>,
    info: watch::Sender<Arc<StationInfo>>,
    events: broadcast::Sender<LinkEvent>,
    cache: Arc<ValueCache>,
    stats: Arc<LinkStats>,
}

/// Why a session with the station ended.
enum SessionEnd {
    Lost(String),
    Shutdown,
}

/// A forced read call waiting for one or more names.
struct ReadCall {
    results: Vec<Option<ItemResult<Value>>>,
    remaining: usize,
    caller: Option<Caller>,
    reply: oneshot::Sender<Result<Vec<ItemResult<Value>>, LinkError>>,
}

/// Where a name's result goes: which call, which position.
type Waiter = (u64, usize);

enum InFlightKind {
    Read {
        names: Vec<String>,
        waiters: Vec<Vec<Waiter>>,
    },
    Change {
        reply: oneshot::Sender<Result<Response, LinkError>>,
        transact_name: Option<String>,
    },
    Pass {
        reply: oneshot::Sender<Result<Response, LinkError>>,
    },
    Ping,
    ListPage {
        change: ChangeType,
        channels: Vec<ChannelDescriptor>,
    },
}

struct InFlight {
    sent_at: Instant,
    deadline: Instant,
    kind: InFlightKind,
}

enum Queued {
    Change {
        request: Request,
        guard: Option<SendGuard>,
        reply: oneshot::Sender<Result<Response, LinkError>>,
    },
    Pass {
        request: Request,
        reply: oneshot::Sender<Result<Response, LinkError>>,
    },
}

/// The state of one connection, from handshake to loss.
struct Session {
    framed: Framing,
    window: usize,
    generation: u64,
    next_id: u32,
    next_call: u64,
    in_flight: HashMap<u32, InFlight>,
    names_in_flight: HashSet<String>,
    read_calls: HashMap<u64, ReadCall>,
    /// Names waiting for a READ not yet sent, in the order first asked.
    read_order: VecDeque<String>,
    read_waiters: HashMap<String, Vec<Waiter>>,
    changes: VecDeque<Queued>,
    /// Channels whose next READ is held back to gather a burst: (first held, send after).
    held: HashMap<String, (Instant, Instant)>,
    /// Channels whose READ was answered less than `coalesce_quiet` ago: when, and to whom.
    answered: HashMap<String, (Instant, Vec<Caller>)>,
    ping_outstanding: bool,
    list_refresh_running: bool,
    reads_turn: bool,
    codec_errors_seen: u64,
}

impl LinkTask {
    pub fn new(settings: LinkSettings) -> (LinkTask, LinkHandle) {
        let (commands_tx, commands) = mpsc::channel(settings.queue_depth.max(1));
        let (info_tx, info_rx) = watch::channel(Arc::new(StationInfo {
            last_error: Some("connecting".into()),
            ..StationInfo::default()
        }));
        let (events, _) = broadcast::channel(256);
        let cache = Arc::new(ValueCache::new());
        let stats = Arc::new(LinkStats::default());
        let handle = LinkHandle {
            commands: commands_tx,
            info: info_rx,
            events: events.clone(),
            cache: cache.clone(),
            stats: stats.clone(),
            request_timeout: settings.request_timeout,
        };
        let task = LinkTask {
            settings,
            commands,
            info: info_tx,
            events,
            cache,
            stats,
        };
        (task, handle)
    }

    /// Runs until `shutdown` is cancelled: connect, serve, and on loss reconnect.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = self.settings.reconnect_min;
        let mut generation = 0u64;
        loop {
            let attempt = {
                let connecting = connect(&self.settings);
                tokio::pin!(connecting);
                loop {
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => return,
                        result = &mut connecting => break result,
                        Some(command) = self.commands.recv() => {
                            let why = self.info.borrow().last_error.clone().unwrap_or_else(|| "connecting".into());
                            fail_command(command, LinkError::Disconnected(why));
                        }
                    }
                }
            };
            let why = match attempt {
                Ok(connected) => {
                    backoff = self.settings.reconnect_min;
                    generation += 1;
                    if generation > 1 {
                        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    match self.serve(connected, generation, &shutdown).await {
                        SessionEnd::Shutdown => return,
                        SessionEnd::Lost(why) => why,
                    }
                }
                Err(why) => why,
            };
            self.publish_disconnected(&why, generation);
            let pause = tokio::time::sleep(backoff);
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    _ = &mut pause => break,
                    Some(command) = self.commands.recv() => fail_command(command, LinkError::Disconnected(why.clone())),
                }
            }
            backoff = (backoff * 2).min(self.settings.reconnect_max);
        }
    }

    fn publish_disconnected(&self, why: &str, generation: u64) {
        let was_connected = self.info.borrow().connected;
        let previous = self.info.borrow().clone();
        if previous.last_error.as_deref() == Some(why) && !previous.connected {
            return;
        }
        warn!(station = %self.settings.url, "station link down: {why}");
        self.info.send_replace(Arc::new(StationInfo {
            connected: false,
            generation,
            last_error: Some(why.to_owned()),
            hello: previous.hello.clone(),
            modules: previous.modules.clone(),
            channels: previous.channels.clone(),
        }));
        if was_connected {
            let _ = self.events.send(LinkEvent::Connection {
                connected: false,
                generation,
                last_error: Some(why.to_owned()),
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
        } = connected;
        let previous = self.info.borrow().channels.clone();
        let changed = !previous.channels.is_empty() && previous.channels != channels;
        info!(
            station = %self.settings.url, name = %hello.station, firmware = %hello.firmware,
            window = hello.window, channels = channels.len(), generation, "station link up"
        );
        let window = usize::from(hello.window).clamp(1, MAX_WINDOW);
        self.info.send_replace(Arc::new(StationInfo {
            connected: true,
            generation,
            last_error: None,
            hello: Some(hello),
            modules,
            channels: Arc::new(ChannelTable::new(channels)),
        }));
        let _ = self.events.send(LinkEvent::Connection {
            connected: true,
            generation,
            last_error: None,
        });
        if changed {
            let _ = self.events.send(LinkEvent::Configuration {
                change: ChangeType::Changed,
                generation,
            });
        }
        let mut session = Session {
            framed,
            window,
            generation,
            next_id: 1,
            next_call: 1,
            in_flight: HashMap::new(),
            names_in_flight: HashSet::new(),
            read_calls: HashMap::new(),
            read_order: VecDeque::new(),
            read_waiters: HashMap::new(),
            changes: VecDeque::new(),
            held: HashMap::new(),
            answered: HashMap::new(),
            ping_outstanding: false,
            list_refresh_running: false,
            reads_turn: true,
            codec_errors_seen: 0,
        };
        let end = self.session_loop(&mut session, shutdown).await;
        let why = match &end {
            SessionEnd::Lost(why) => why.clone(),
            SessionEnd::Shutdown => "the gateway is shutting down".to_owned(),
        };
        session.fail_everything(&why);
        while let Ok(command) = self.commands.try_recv() {
            fail_command(command, LinkError::Disconnected(why.clone()));
        }
        end
    }

    async fn session_loop(&mut self, s: &mut Session, shutdown: &CancellationToken) -> SessionEnd {
        loop {
            if let Err(why) = self.dispatch(s).await {
                return SessionEnd::Lost(why);
            }
            let next_deadline = s.in_flight.values().map(|f| f.deadline).min();
            // Wake to send a gathered READ when its hold ends: only for channels not on the wire
            // (their answer wakes the task) and only while the window has room (a freed slot
            // does). A hold that has already ended wakes the task at once.
            let room = s
                .in_flight
                .values()
                .filter(|f| !matches!(f.kind, InFlightKind::Ping))
                .count()
                < s.window;
            let next_release = s
                .held
                .iter()
                .filter(|(name, _)| room && !s.names_in_flight.contains(*name))
                .map(|(_, (_, until))| *until)
                .min();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return SessionEnd::Shutdown,
                frame = s.framed.next() => match frame {
                    Some(Ok(frame)) => {
                        if let Err(why) = self.on_frame(s, frame).await {
                            return SessionEnd::Lost(why);
                        }
                        // Take every answer already buffered, and every queued command, before
                        // sending anything: one write and one flush for all of them.
                        while let Some(next) = s.framed.next().now_or_never() {
                            match next {
                                Some(Ok(frame)) => {
                                    if let Err(why) = self.on_frame(s, frame).await {
                                        return SessionEnd::Lost(why);
                                    }
                                }
                                Some(Err(error)) => {
                                    return SessionEnd::Lost(format!("read from the station failed: {error}"));
                                }
                                None => return SessionEnd::Lost("the station closed the connection".into()),
                            }
                        }
                        self.count_codec_errors(s);
                        while let Ok(command) = self.commands.try_recv() {
                            s.enqueue(command, &self.settings);
                        }
                    }
                    Some(Err(error)) => return SessionEnd::Lost(format!("read from the station failed: {error}")),
                    None => {
                        self.count_codec_errors(s);
                        return SessionEnd::Lost("the station closed the connection".into());
                    }
                },
                command = self.commands.recv() => {
                    let Some(command) = command else { return SessionEnd::Shutdown };
                    s.enqueue(command, &self.settings);
                    while let Ok(command) = self.commands.try_recv() {
                        s.enqueue(command, &self.settings);
                    }
                }
                _ = sleep_until_opt(next_release), if next_release.is_some() => {}
                _ = sleep_until_opt(next_deadline), if next_deadline.is_some() => {
                    if let Err(why) = self.on_timeouts(s).await {
                        return SessionEnd::Lost(why);
                    }
                }
            }
        }
    }

    fn count_codec_errors(&self, s: &mut Session) {
        let stats = s.framed.codec().stats();
        let total = stats.crc_errors + stats.header_errors;
        if total > s.codec_errors_seen {
            self.stats
                .crc_errors
                .fetch_add(total - s.codec_errors_seen, Ordering::Relaxed);
            s.codec_errors_seen = total;
        }
    }

    /// Puts queued work on the wire while the station's window has room.
    async fn dispatch(&mut self, s: &mut Session) -> Result<(), String> {
        let mut sent_any = false;
        loop {
            let busy = s
                .in_flight
                .values()
                .filter(|f| !matches!(f.kind, InFlightKind::Ping))
                .count();
            if busy >= s.window {
                break;
            }
            // Reads and changes take turns, so neither can starve the other.
            let mut sent = false;
            for reads in [s.reads_turn, !s.reads_turn] {
                sent = if reads {
                    self.send_read_batch(s)?
                } else {
                    self.send_change(s)?
                };
                if sent {
                    break;
                }
            }
            s.reads_turn = !s.reads_turn;
            if !sent {
                break;
            }
            sent_any = true;
        }
        // Frames queued outside dispatch (the LIST a configuration NOTIFY starts) go out too.
        if sent_any || !s.framed.write_buffer().is_empty() {
            s.flush().await?;
        }
        Ok(())
    }

    /// Sends one READ of the waiting names that are not already on the wire.
    fn send_read_batch(&mut self, s: &mut Session) -> Result<bool, String> {
        let mut names = Vec::new();
        let mut waiters = Vec::new();
        let mut budget = READ_PAYLOAD_BUDGET;
        let mut kept = VecDeque::with_capacity(s.read_order.len());
        let now = Instant::now();
        while let Some(name) = s.read_order.pop_front() {
            let live: Vec<Waiter> = s
                .read_waiters
                .remove(&name)
                .unwrap_or_default()
                .into_iter()
                .filter(|(call, _)| s.read_calls.get(call).is_some_and(|c| !c.reply.is_closed()))
                .collect();
            if live.is_empty() {
                continue;
            }
            let cost = name.len() + 2;
            if cost > READ_PAYLOAD_BUDGET {
                s.deliver(
                    &live,
                    Err(StationError::new(
                        station_protocol::ErrorCode::BadValue,
                        format!(
                            "a channel name of {} bytes does not fit in a frame",
                            name.len()
                        ),
                    )),
                );
                continue;
            }
            let gathering = s.held.get(&name).is_some_and(|(_, until)| *until > now);
            if s.names_in_flight.contains(&name)
                || gathering
                || names.len() >= self.settings.max_names_per_read
                || cost > budget
            {
                s.read_waiters.insert(name.clone(), live);
                kept.push_back(name);
                continue;
            }
            budget -= cost;
            s.held.remove(&name);
            names.push(name);
            waiters.push(live);
        }
        s.read_order = kept;
        let Session {
            held, read_waiters, ..
        } = s;
        held.retain(|name, (_, until)| *until > now || read_waiters.contains_key(name));
        if names.is_empty() {
            return Ok(false);
        }
        let id = s.take_id();
        let frame = Request::Read {
            names: names.clone(),
        }
        .to_frame(id)
        .map_err(|error| format!("cannot build a READ frame: {error}"))?;
        s.start_send(frame)?;
        self.stats.frames_sent.fetch_add(1, Ordering::Relaxed);
        self.stats.read_frames.fetch_add(1, Ordering::Relaxed);
        self.stats
            .names_read
            .fetch_add(names.len() as u64, Ordering::Relaxed);
        for name in &names {
            s.names_in_flight.insert(name.clone());
        }
        s.track(
            id,
            self.settings.request_timeout,
            InFlightKind::Read { names, waiters },
        );
        Ok(true)
    }

    /// Sends the oldest queued change or passed-through request.
    fn send_change(&mut self, s: &mut Session) -> Result<bool, String> {
        while let Some(queued) = s.changes.pop_front() {
            let (request, kind) = match queued {
                Queued::Change {
                    request,
                    guard,
                    reply,
                } => {
                    if reply.is_closed() {
                        // The caller gave up (timed out) before it was sent: never send it now.
                        continue;
                    }
                    if let Some(guard) = guard
                        && let Err(why) = guard()
                    {
                        self.stats.refused_by_guard.fetch_add(1, Ordering::Relaxed);
                        let _ = reply.send(Err(LinkError::Refused(why)));
                        continue;
                    }
                    let transact_name = match &request {
                        Request::Transact { name, .. } => Some(name.clone()),
                        _ => None,
                    };
                    (
                        request,
                        InFlightKind::Change {
                            reply,
                            transact_name,
                        },
                    )
                }
                Queued::Pass { request, reply } => {
                    if reply.is_closed() {
                        continue;
                    }
                    (request, InFlightKind::Pass { reply })
                }
            };
            let id = s.take_id();
            let frame = match request.to_frame(id) {
                Ok(frame) => frame,
                Err(error) => {
                    kind.fail(LinkError::TooLarge(error.to_string()));
                    continue;
                }
            };
            // Only the station's own channels get a cache slot: names a legacy client makes up
            // must not grow the cache (the station refuses them anyway).
            let now = std::time::Instant::now();
            let channels = self.info.borrow().channels.clone();
            let invalidate = |name: &str| {
                if channels.get(name).is_some() {
                    self.cache.invalidate(name, now);
                }
            };
            match &request {
                Request::Write { items } => items.iter().for_each(|(name, _)| invalidate(name)),
                Request::Transact { name, .. } => invalidate(name),
                _ => {}
            }
            s.start_send(frame)?;
            self.stats.frames_sent.fetch_add(1, Ordering::Relaxed);
            s.track(id, self.settings.request_timeout, kind);
            return Ok(true);
        }
        Ok(false)
    }

    async fn on_frame(&mut self, s: &mut Session, frame: RawFrame) -> Result<(), String> {
        let response = Response::from_frame(&frame);
        if frame.request_id == 0 {
            match response {
                Ok(Response::Notify(notify)) => self.on_notify(s, notify),
                Ok(other) => debug!("ignoring {:?} with request id 0", other.opcode()),
                Err(error) => warn!("ignoring an unreadable notification: {error}"),
            }
            return Ok(());
        }
        let Some(in_flight) = s.in_flight.remove(&frame.request_id) else {
            debug!(
                request_id = frame.request_id,
                "dropping a late or unknown reply"
            );
            return Ok(());
        };
        self.stats.latency.observe(in_flight.sent_at.elapsed());
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                let why = format!("its answer could not be read: {error}");
                if let InFlightKind::Read { names, .. } = &in_flight.kind {
                    names.iter().for_each(|n| {
                        s.names_in_flight.remove(n);
                    });
                }
                match in_flight.kind {
                    InFlightKind::Read { waiters, .. } => {
                        for group in waiters {
                            s.fail_calls(&group, LinkError::Protocol(why.clone()));
                        }
                    }
                    InFlightKind::Change { reply, .. } => {
                        let _ = reply.send(Err(LinkError::OutcomeUnknown(why)));
                    }
                    other => other.fail(LinkError::Protocol(why)),
                }
                return Ok(());
            }
        };
        let read_at = in_flight.sent_at.into_std();
        match in_flight.kind {
            InFlightKind::Read { names, waiters } => {
                for name in &names {
                    s.names_in_flight.remove(name);
                }
                s.note_answered(&names, &waiters, self.settings.coalesce_quiet);
                match response {
                    Response::Read(results) if results.len() == names.len() => {
                        for ((name, group), result) in names.iter().zip(&waiters).zip(results) {
                            if let Ok(value) = &result {
                                self.cache
                                    .insert(name, value.clone(), read_at, s.generation);
                            }
                            s.deliver(group, result);
                        }
                    }
                    Response::Error(error) => {
                        for group in &waiters {
                            s.deliver(group, Err(error.clone()));
                        }
                    }
                    other => {
                        let why = format!(
                            "a READ of {} names was answered with {:?}",
                            names.len(),
                            other.opcode()
                        );
                        for group in &waiters {
                            s.fail_calls(group, LinkError::Protocol(why.clone()));
                        }
                    }
                }
            }
            InFlightKind::Change {
                reply,
                transact_name,
            } => {
                if let (Some(name), Response::Transact(value)) = (transact_name, &response) {
                    self.cache
                        .insert(&name, value.clone(), read_at, s.generation);
                }
                let _ = reply.send(Ok(response));
            }
            InFlightKind::Pass { reply } => {
                let _ = reply.send(Ok(response));
            }
            InFlightKind::Ping => s.ping_outstanding = false,
            InFlightKind::ListPage {
                change,
                mut channels,
            } => match response {
                Response::List {
                    total,
                    channels: page,
                    ..
                } => {
                    let empty_page = page.is_empty();
                    channels.extend(page);
                    if channels.len() < total as usize && !empty_page {
                        let offset = channels.len() as u32;
                        let id = s.take_id();
                        let frame = Request::List {
                            offset,
                            limit: LIST_PAGE,
                        }
                        .to_frame(id)
                        .map_err(|error| error.to_string())?;
                        s.start_send(frame)?;
                        s.flush().await?;
                        s.track(
                            id,
                            self.settings.request_timeout,
                            InFlightKind::ListPage { change, channels },
                        );
                    } else {
                        s.list_refresh_running = false;
                        self.publish_channels(channels, change, s.generation);
                    }
                }
                other => {
                    s.list_refresh_running = false;
                    warn!(
                        "the station answered LIST with {:?}; keeping the old channel list",
                        other.opcode()
                    );
                }
            },
        }
        Ok(())
    }

    fn on_notify(&mut self, s: &mut Session, notify: Notify) {
        info!("station notification: {notify:?}");
        if let Notify::ConfigurationChanged { change, .. } = &notify
            && !s.list_refresh_running
        {
            s.list_refresh_running = true;
            let id = s.take_id();
            match (Request::List {
                offset: 0,
                limit: LIST_PAGE,
            })
            .to_frame(id)
            {
                Ok(frame) => {
                    if s.start_send(frame).is_ok() {
                        s.track(
                            id,
                            self.settings.request_timeout,
                            InFlightKind::ListPage {
                                change: *change,
                                channels: Vec::new(),
                            },
                        );
                    }
                }
                Err(_) => s.list_refresh_running = false,
            }
        }
        let _ = self.events.send(LinkEvent::Notify(notify));
    }

    fn publish_channels(
        &self,
        channels: Vec<ChannelDescriptor>,
        change: ChangeType,
        generation: u64,
    ) {
        let previous = self.info.borrow().clone();
        info!(
            channels = channels.len(),
            "station channel list changed ({})",
            change.label()
        );
        self.info.send_replace(Arc::new(StationInfo {
            connected: previous.connected,
            generation: previous.generation,
            last_error: previous.last_error.clone(),
            hello: previous.hello.clone(),
            modules: previous.modules.clone(),
            channels: Arc::new(ChannelTable::new(channels)),
        }));
        let _ = self
            .events
            .send(LinkEvent::Configuration { change, generation });
    }

    /// Answers requests whose time is up and checks, with a PING, that the station still
    /// answers at all; a PING that times out ends the session.
    async fn on_timeouts(&mut self, s: &mut Session) -> Result<(), String> {
        self.count_codec_errors(s);
        let now = Instant::now();
        let expired: Vec<u32> = s
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        let mut resync = false;
        for id in expired {
            let Some(in_flight) = s.in_flight.remove(&id) else {
                continue;
            };
            self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
            let timeout = self.settings.request_timeout;
            match in_flight.kind {
                InFlightKind::Ping => {
                    return Err(format!(
                        "the station stopped answering (no reply to PING within {} ms)",
                        timeout.as_millis()
                    ));
                }
                InFlightKind::Read { names, waiters } => {
                    for name in &names {
                        s.names_in_flight.remove(name);
                    }
                    for group in &waiters {
                        s.fail_calls(group, LinkError::Timeout(timeout));
                    }
                }
                InFlightKind::Change { reply, .. } => {
                    let _ = reply.send(Err(LinkError::WriteTimeout(timeout)));
                }
                InFlightKind::Pass { reply } => {
                    let _ = reply.send(Err(LinkError::Timeout(timeout)));
                }
                InFlightKind::ListPage { .. } => {
                    s.list_refresh_running = false;
                    warn!("the station did not answer LIST in time; keeping the old channel list");
                }
            }
            resync = true;
        }
        if resync && !s.ping_outstanding {
            s.ping_outstanding = true;
            let id = s.take_id();
            let frame = Request::Ping {
                nonce: u64::from(id),
            }
            .to_frame(id)
            .map_err(|e| e.to_string())?;
            s.start_send(frame)?;
            s.flush().await?;
            s.track(id, self.settings.request_timeout, InFlightKind::Ping);
        }
        Ok(())
    }
}

impl InFlightKind {
    fn fail(self, error: LinkError) {
        match self {
            InFlightKind::Change { reply, .. } | InFlightKind::Pass { reply } => {
                let _ = reply.send(Err(error));
            }
            _ => {}
        }
    }
}

impl Session {
    fn take_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        id
    }

    fn start_send(&mut self, frame: RawFrame) -> Result<(), String> {
        self.framed
            .start_send_unpin(frame)
            .map_err(|error| format!("write to the station failed: {error}"))
    }

    async fn flush(&mut self) -> Result<(), String> {
        SinkExt::<RawFrame>::flush(&mut self.framed)
            .await
            .map_err(|error| format!("write to the station failed: {error}"))
    }

    fn track(&mut self, id: u32, timeout: Duration, kind: InFlightKind) {
        let sent_at = Instant::now();
        self.in_flight.insert(
            id,
            InFlight {
                sent_at,
                deadline: sent_at + timeout,
                kind,
            },
        );
    }

    fn enqueue(&mut self, command: Command, settings: &LinkSettings) {
        match command {
            Command::Read {
                names,
                caller,
                reply,
            } => {
                if names.is_empty() {
                    let _ = reply.send(Ok(Vec::new()));
                    return;
                }
                let call = self.next_call;
                self.next_call += 1;
                let now = Instant::now();
                for (index, name) in names.iter().enumerate() {
                    // A reader that finds its channel on the wire (or already held), or answered
                    // a moment ago to other clients, is part of a burst: hold the next READ of
                    // it until the burst is over, within limits. (A client reading in a loop
                    // comes back just after its own answer: that is no burst.)
                    let just_answered_to_others = || {
                        caller.is_some_and(|caller| {
                            self.answered.get(name).is_some_and(|(at, callers)| {
                                now.saturating_duration_since(*at) < settings.coalesce_quiet
                                    && !callers.contains(&caller)
                            })
                        })
                    };
                    if !settings.coalesce_max.is_zero()
                        && (self.names_in_flight.contains(name)
                            || self.held.contains_key(name)
                            || just_answered_to_others())
                    {
                        let first = self.held.get(name).map_or(now, |(first, _)| *first);
                        let until =
                            (now + settings.coalesce_quiet).min(first + settings.coalesce_max);
                        self.held.insert(name.clone(), (first, until));
                    }
                    let waiting = self.read_waiters.entry(name.clone()).or_default();
                    if waiting.is_empty() {
                        self.read_order.push_back(name.clone());
                    }
                    waiting.push((call, index));
                }
                self.read_calls.insert(
                    call,
                    ReadCall {
                        results: vec![None; names.len()],
                        remaining: names.len(),
                        caller,
                        reply,
                    },
                );
            }
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
        }
    }

    /// Remembers, for a moment, that a READ of `names` was answered and to which callers.
    fn note_answered(&mut self, names: &[String], waiters: &[Vec<Waiter>], quiet: Duration) {
        if quiet.is_zero() {
            return;
        }
        let now = Instant::now();
        self.answered
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < quiet);
        for (name, group) in names.iter().zip(waiters) {
            let callers: Vec<Caller> = group
                .iter()
                .filter_map(|(call, _)| self.read_calls.get(call).and_then(|c| c.caller))
                .collect();
            self.answered.insert(name.clone(), (now, callers));
        }
    }

    /// Gives one name's result to every call waiting for it; answers calls that are complete.
    fn deliver(&mut self, waiters: &[Waiter], result: ItemResult<Value>) {
        for &(call_id, index) in waiters {
            let Some(call) = self.read_calls.get_mut(&call_id) else {
                continue;
            };
            if call.results[index].is_none() {
                call.results[index] = Some(result.clone());
                call.remaining -= 1;
            }
            if call.remaining == 0
                && let Some(call) = self.read_calls.remove(&call_id)
            {
                let results = call
                    .results
                    .into_iter()
                    .map(|r| r.expect("every result is filled"))
                    .collect();
                let _ = call.reply.send(Ok(results));
            }
        }
    }

    fn fail_calls(&mut self, waiters: &[Waiter], error: LinkError) {
        for &(call_id, _) in waiters {
            if let Some(call) = self.read_calls.remove(&call_id) {
                let _ = call.reply.send(Err(error.clone()));
            }
        }
    }

    /// Answers everything in flight and queued when the session ends.
    fn fail_everything(&mut self, why: &str) {
        for (_, in_flight) in self.in_flight.drain() {
            match in_flight.kind {
                InFlightKind::Change { reply, .. } => {
                    let _ = reply.send(Err(LinkError::OutcomeUnknown(why.to_owned())));
                }
                other => other.fail(LinkError::Disconnected(why.to_owned())),
            }
        }
        for (_, call) in self.read_calls.drain() {
            let _ = call
                .reply
                .send(Err(LinkError::Disconnected(why.to_owned())));
        }
        for queued in self.changes.drain(..) {
            match queued {
                Queued::Change { reply, .. } | Queued::Pass { reply, .. } => {
                    let _ = reply.send(Err(LinkError::Disconnected(why.to_owned())));
                }
            }
        }
        self.read_order.clear();
        self.read_waiters.clear();
        self.held.clear();
        self.answered.clear();
        self.names_in_flight.clear();
    }
}

fn fail_command(command: Command, error: LinkError) {
    match command {
        Command::Read { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        Command::Change { reply, .. } | Command::Pass { reply, .. } => {
            let _ = reply.send(Err(error));
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A connection that has finished its handshake.
struct Connected {
    framed: Framing,
    hello: HelloReply,
    modules: Vec<ModuleInfo>,
    channels: Vec<ChannelDescriptor>,
}

/// Opens the stream and runs HELLO, SYSTEM and LIST (every page).
async fn connect(settings: &LinkSettings) -> Result<Connected, String> {
    let stream = transport::open(&settings.url, settings.connect_timeout).await?;
    let mut framed = Framed::new(stream, StationCodec::new());
    let mut next_id = 1u32;
    let mut exchange = async |request: Request| -> Result<Response, String> {
        let id = next_id;
        next_id += 1;
        let frame = request.to_frame(id).map_err(|error| error.to_string())?;
        framed
            .send(frame)
            .await
            .map_err(|error| format!("write to the station failed: {error}"))?;
        let wait = async {
            loop {
                match framed.next().await {
                    Some(Ok(frame)) if frame.request_id == id => {
                        return Response::from_frame(&frame).map_err(|error| {
                            format!(
                                "the station's answer to {:?} is unreadable: {error}",
                                request.opcode()
                            )
                        });
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(error)) => {
                        return Err(format!("read from the station failed: {error}"));
                    }
                    None => {
                        return Err("the station closed the connection during the handshake".into());
                    }
                }
            }
        };
        tokio::time::timeout(settings.request_timeout, wait)
            .await
            .map_err(|_| {
                format!(
                    "the station did not answer {:?} within {} ms",
                    request.opcode(),
                    settings.request_timeout.as_millis()
                )
            })?
    };
    let hello = match exchange(Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        client: settings.client_name.clone(),
    }))
    .await?
    {
        Response::Hello(hello) => hello,
        Response::Error(error) => {
            return Err(format!("the station refused HELLO: {}", error.message));
        }
        other => {
            return Err(format!(
                "the station answered HELLO with {:?}",
                other.opcode()
            ));
        }
    };
    if hello.version != PROTOCOL_VERSION {
        return Err(format!(
            "the station speaks protocol version {}, the gateway {}",
            hello.version, PROTOCOL_VERSION
        ));
    }
    let modules = match exchange(Request::System).await? {
        Response::System(modules) => modules,
        Response::Error(error) => {
            return Err(format!("the station refused SYSTEM: {}", error.message));
        }
        other => {
            return Err(format!(
                "the station answered SYSTEM with {:?}",
                other.opcode()
            ));
        }
    };
    let mut channels = Vec::new();
    loop {
        match exchange(Request::List {
            offset: channels.len() as u32,
            limit: LIST_PAGE,
        })
        .await?
        {
            Response::List {
                total,
                channels: page,
                ..
            } => {
                let empty = page.is_empty();
                channels.extend(page);
                if channels.len() >= total as usize || empty {
                    break;
                }
            }
            Response::Error(error) => {
                return Err(format!("the station refused LIST: {}", error.message));
            }
            other => {
                return Err(format!(
                    "the station answered LIST with {:?}",
                    other.opcode()
                ));
            }
        }
    }
    Ok(Connected {
        framed,
        hello,
        modules,
        channels,
    })
}
