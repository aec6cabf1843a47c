//! The event stream (`GET api/events`) and value subscriptions: the registry of open streams
//! and their subscriptions ([`Events`]), shared by the HTTP handlers, the [`scheduler`] that
//! reads for every subscription, and the [`relay`] that fans link and lease events out.
//!
//! Every event reaches a stream through its queue ([`sse::StreamSink`]), offered without ever
//! waiting for a reader: a subscription's values merge into its values still waiting (the
//! latest value wins), other events are never dropped. A stream outlives its connection for
//! `events.resume_grace_ms`, so a reader that reconnects with `Last-Event-ID` resumes it: the
//! events it missed, or a `gap` and a snapshot when they are no longer all kept or the gateway
//! restarted (`resume.rs`). See `docs/events.md`.

pub mod event_id;
pub mod filter;
pub mod filter_index;
pub mod queue;
pub mod relay;
pub mod replay;
pub mod resume;
pub mod scheduler;
pub mod sse;
mod subscriptions;
pub mod values;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::access_rules::Who;
use crate::config::EventsConfig;
use crate::lease::LeaseView;
use crate::station::Station;
use event_id::{BadEventId, EventId, STREAM_SLOTS};
use filter::{ChannelFilter, Deadband, FilterOptions, ResolveError};
use filter_index::{FilterIndex, Slot};
use resume::{GapReason, Reading};
use sse::{Frame, Push, SharedEvent, StreamShape, StreamSink};

/// The shortest and longest `IntervalMs` a subscription may ask for.
pub const MIN_INTERVAL_MS: u64 = 100;
pub const MAX_INTERVAL_MS: u64 = 60_000;

/// The longest `MinIntervalMs` or `MaxIntervalMs` a subscription may ask for.
pub const MAX_FILTER_INTERVAL_MS: u64 = 3_600_000;

/// A stream whose reader takes nothing this long while events wait is closed (it is stuck).
pub const STUCK_LIMIT: Duration = Duration::from_secs(30);

/// Why an event-stream or subscription request was refused; `crate::error` gives each its status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventsError {
    #[error(
        "the gateway already serves {0} event streams (events.max_streams); close one or try again later"
    )]
    TooManyStreams(usize),
    #[error(
        "no such event stream: {0}; it has closed or never existed: open api/events and use the streamId of its hello"
    )]
    NoSuchStream(String),
    #[error(
        "no such subscription: {0}; it has ended (deleted, not renewed in time, or its stream closed)"
    )]
    NoSuchSubscription(String),
    #[error(
        "IntervalMs must be {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS} ms, a whole number; got {0}"
    )]
    IntervalOutOfRange(u64),
    /// `IntervalMs` is not a whole number of milliseconds (the JSON as sent).
    #[error(
        "IntervalMs must be {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS} ms, a whole number; got {0}"
    )]
    IntervalNotWhole(String),
    #[error("Channels must name at least one channel")]
    NoChannels,
    #[error(
        "a subscription may name at most {max} channels (events.max_channels_per_subscription); got {count}: split it"
    )]
    TooManyChannels { count: usize, max: usize },
    #[error(
        "stream {stream} already has {max} subscriptions (events.max_subscriptions_per_stream); delete one or open another stream"
    )]
    TooManySubscriptions { stream: String, max: usize },
    #[error("no such channel: {0}; subscriptions take the names of api/resources/names")]
    UnknownChannel(String),
    #[error("station disconnected: {0}; the channel list is not known yet")]
    StationNotReached(String),
    /// A filter option out of its bounds; the message names the field.
    #[error("{0}")]
    BadFilter(String),
    #[error(
        "Deadband.Percent needs the range of {0}, and none is known: give it in [events] ranges of the gateway's config, or use Deadband.Absolute"
    )]
    NoRange(String),
    #[error("the gateway is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    BadLastEventId(#[from] BadEventId),
}

/// What a subscription is created or renewed with.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubscriptionRequest {
    pub channels: Vec<String>,
    pub interval_ms: u64,
    /// `Deadband`, `MinIntervalMs`, `MaxIntervalMs` for every channel; none by default.
    pub options: FilterOptions,
    /// `ChannelOptions`: a channel's own, replacing `options` field by field.
    pub channel_options: Vec<(String, FilterOptions)>,
}

/// A checked request: its channels, and their filters unless none is asked.
struct Checked {
    channels: Arc<[String]>,
    filters: Option<Vec<ChannelFilter>>,
}

/// A live subscription as its owner sees it: `{id, expiresInMs}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionGrant {
    pub id: String,
    pub expires_in: Duration,
}

impl SubscriptionGrant {
    pub fn to_json(&self) -> serde_json::Value {
        json!({ "id": self.id, "expiresInMs": self.expires_in.as_millis() as u64 })
    }
}

/// One subscription, owned by the registry; the scheduler reads a snapshot of it per tick.
#[derive(Debug)]
pub(crate) struct Subscription {
    pub id: Arc<str>,
    pub stream: Arc<StreamSink>,
    pub channels: Arc<[String]>,
    /// Each channel's number in [`ChannelIds`], in the same order.
    pub ids: Arc<[u32]>,
    pub interval: Duration,
    pub expires_at: Instant,
    /// When it is next due, while it is scheduled on its own (`Registry::own_ticks`).
    pub next_due: Instant,
    /// Its filters and its place in its interval's [`Beat`]; `None`: everything passes.
    pub filtered: Option<Filtered>,
}

/// A filtered subscription's filters (one per channel) and its slot in its beat's index.
#[derive(Debug)]
pub(crate) struct Filtered {
    pub filters: Vec<ChannelFilter>,
    pub slot: Slot,
}

/// The filtered subscriptions of one interval: when they are next due, and their index.
#[derive(Debug, Default)]
pub(crate) struct Beat {
    /// The grid point its joined subscriptions are next due at; `None` before any joined.
    pub next: Option<Instant>,
    pub index: FilterIndex<Member>,
}

/// What a beat keeps of each filtered subscription to send its events.
#[derive(Debug)]
pub(crate) struct Member {
    pub id: Arc<str>,
    pub stream: Arc<StreamSink>,
    pub channels: Arc<[String]>,
    /// The channels' numbers (`ChannelIds`), in the same order: their outcomes' places.
    pub ids: Arc<[u32]>,
}

#[derive(Debug)]
struct StreamEntry {
    sink: Arc<StreamSink>,
    subscriptions: HashSet<Arc<str>>,
    /// Who opened it, when access rules are in force: an event about a channel (a
    /// `numeric-result`) reaches it only if the rules let them read that channel.
    reader: Option<Who>,
    /// The API key's or Basic user's name it was opened with (`None` with access control
    /// off): only the same may resume it, so that nobody takes over another's stream.
    opener: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    streams: HashMap<Arc<str>, StreamEntry>,
    /// Each stream's slot in its events' ids, to its `streamId`.
    slots: HashMap<u32, Arc<str>>,
    /// The slot the next stream is offered (then the next free one after it).
    next_slot: u32,
    /// Each channel's last reading by the scheduler, by channel number: for snapshots.
    pub latest: Vec<Option<Reading>>,
    pub subscriptions: HashMap<Arc<str>, Subscription>,
    /// The subscriptions the scheduler times one by one: every unfiltered one, and a filtered
    /// one until its first values went out (then its beat times it).
    pub own_ticks: HashSet<Arc<str>>,
    /// The filtered subscriptions of each interval, indexed by channel.
    pub beats: HashMap<Duration, Beat>,
    pub channel_ids: ChannelIds,
    /// The shortest interval any live subscription asks of each channel, by channel number
    /// (`Duration::MAX` for none); `None` after any change of the subscriptions' channels or
    /// intervals, until the scheduler computes it again (so a tick does not walk every
    /// subscription's channels).
    shortest: Option<Arc<Vec<Duration>>>,
}

/// A number for every channel name any subscription has named, so that a tick finds a
/// channel's outcome by index rather than by hashing its name for every subscription. It
/// only grows, and only by names the channel list knew (others are refused first).
#[derive(Debug, Default)]
pub(crate) struct ChannelIds {
    names: Vec<String>,
    numbers: HashMap<String, u32>,
}

impl ChannelIds {
    /// The numbers of `names`, giving new names the next ones.
    fn numbers_of(&mut self, names: &[String]) -> Arc<[u32]> {
        names
            .iter()
            .map(|name| match self.numbers.get(name) {
                Some(&number) => number,
                None => {
                    let number = self.names.len() as u32;
                    self.names.push(name.clone());
                    self.numbers.insert(name.clone(), number);
                    number
                }
            })
            .collect()
    }

    /// The name numbered `number`.
    pub(crate) fn name(&self, number: u32) -> &str {
        self.names.get(number as usize).map_or("", String::as_str)
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

impl Registry {
    /// The shortest interval asked of each channel, by number, computed once per change.
    pub(crate) fn shortest(&mut self) -> Arc<Vec<Duration>> {
        let subscriptions = &self.subscriptions;
        let count = self.channel_ids.len();
        self.shortest
            .get_or_insert_with(|| {
                let mut shortest = vec![Duration::MAX; count];
                for subscription in subscriptions.values() {
                    for &number in subscription.ids.iter() {
                        if let Some(interval) = shortest.get_mut(number as usize) {
                            *interval = (*interval).min(subscription.interval);
                        }
                    }
                }
                Arc::new(shortest)
            })
            .clone()
    }

    /// Files a filtered subscription in its interval's beat; it waits for its first values.
    fn place(&mut self, subscription: &Subscription, filters: Vec<ChannelFilter>) -> Filtered {
        let beat = self.beats.entry(subscription.interval).or_default();
        let member = Member {
            id: subscription.id.clone(),
            stream: subscription.stream.clone(),
            channels: subscription.channels.clone(),
            ids: subscription.ids.clone(),
        };
        let slot = beat.index.add(member, &subscription.ids, &filters);
        Filtered { filters, slot }
    }

    /// Takes a filtered subscription out of its beat (and the beat away when it was the last).
    fn unplace(&mut self, interval: Duration, filtered: &Filtered) {
        if let Some(beat) = self.beats.get_mut(&interval) {
            beat.index.remove(filtered.slot);
            if beat.index.is_empty() {
                self.beats.remove(&interval);
            }
        }
    }

    /// Takes a stream and its subscriptions out; its sink is the caller's to end.
    fn remove_stream(&mut self, id: &str) -> Option<StreamEntry> {
        let entry = self.streams.remove(id)?;
        self.slots.remove(&entry.sink.slot());
        for subscription in &entry.subscriptions {
            self.remove_subscription(subscription);
        }
        Some(entry)
    }

    /// A slot no open stream has, from `next_slot` on (1 to 99 999; 0 is the lab stream's).
    fn free_slot(&mut self) -> Option<u32> {
        let slots = STREAM_SLOTS - 1;
        (0..slots)
            .map(|n| (self.next_slot.wrapping_add(n) % slots) + 1)
            .find(|slot| !self.slots.contains_key(slot))
            .inspect(|slot| self.next_slot = *slot % slots)
    }

    fn remove_subscription(&mut self, id: &str) -> Option<Subscription> {
        self.shortest = None;
        let subscription = self.subscriptions.remove(id)?;
        self.own_ticks.remove(id);
        if let Some(filtered) = &subscription.filtered {
            self.unplace(subscription.interval, filtered);
        }
        if let Some(entry) = self.streams.get_mut(&*subscription.stream.id) {
            entry.subscriptions.remove(id);
        }
        Some(subscription)
    }
}

/// The control lease as a snapshot shows it, asked when one is made.
pub type LeaseViewSource = Box<dyn Fn() -> LeaseView + Send + Sync>;

/// The open event streams and their subscriptions.
pub struct Events {
    limits: EventsConfig,
    /// `[events] ranges`, for percent deadbands.
    ranges: filter::Ranges,
    subscription_ttl: Duration,
    /// How long a stream whose reader went away is kept for it to resume.
    resume_grace: Duration,
    station: Station,
    lease: LeaseViewSource,
    shutdown: CancellationToken,
    registry: Mutex<Registry>,
    /// Wakes the scheduler when subscriptions are added, changed or removed.
    pub(crate) changed: Notify,
    /// The origin of the scheduler's time grid: subscriptions with the same interval tick
    /// together, so their reads share one READ.
    pub(crate) grid_origin: Instant,
    /// The epoch of this run's event ids (`event_id.rs`): another one after a restart.
    epoch: u16,
}

/// How a stream was opened: new, resumed, or new or resumed after a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStart {
    New,
    Resumed { replayed: usize },
    Gap(GapReason),
}

impl Events {
    pub fn new(
        limits: EventsConfig,
        station: Station,
        lease: LeaseViewSource,
        shutdown: CancellationToken,
    ) -> Arc<Events> {
        let subscription_ttl = Duration::from_millis(limits.subscription_ttl_ms);
        let resume_grace = Duration::from_millis(limits.resume_grace_ms);
        let ranges = filter::Ranges::new(&limits.ranges);
        let epoch = event_id::random_epoch();
        Arc::new(Events {
            limits,
            ranges,
            subscription_ttl,
            resume_grace,
            station,
            lease,
            shutdown,
            registry: Mutex::new(Registry {
                next_slot: rand::random::<u32>() % (STREAM_SLOTS - 1),
                ..Registry::default()
            }),
            changed: Notify::new(),
            grid_origin: Instant::now(),
            epoch,
        })
    }

    /// The epoch of this run's event ids.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    pub fn station(&self) -> &Station {
        &self.station
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic elsewhere while holding the lock leaves plain data behind: keep serving.
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Open streams now.
    pub fn stream_count(&self) -> usize {
        self.registry().streams.len()
    }

    /// Live subscriptions now.
    pub fn subscription_count(&self) -> usize {
        self.registry().subscriptions.len()
    }

    /// Opens a stream for `reader` (`None`: no access rules in force), whose credentials name
    /// `opener` (`None`: access control off): a new one that starts with `hello`, or, given
    /// the `Last-Event-ID` its reader saw last, the stream that event was of, resumed (`hello`,
    /// then every event it missed, then what comes). When that cannot be (another epoch: the
    /// gateway restarted; the stream ended; the replay buffer no longer reaches back; another
    /// opened it), the reader is told so by a `gap` event followed by a `snapshot`. The
    /// returned receiver is the body's.
    pub(crate) fn open_stream(
        self: &Arc<Events>,
        reader: Option<Who>,
        opener: Option<String>,
        last_seen: Option<EventId>,
    ) -> Result<(sse::OpenedStream, StreamStart), EventsError> {
        if self.shutdown.is_cancelled() {
            return Err(EventsError::ShuttingDown);
        }
        let info = self.station.info();
        let mut registry = self.registry();
        let gap = match last_seen {
            None => None,
            Some(seen) if seen.epoch != self.epoch => Some(GapReason::Restart),
            Some(seen) => match registry
                .slots
                .get(&seen.stream)
                .and_then(|id| registry.streams.get(id))
            {
                None => Some(GapReason::Ended),
                // Only who opened a stream may resume it: its subscriptions were checked
                // against their rights, and a resume takes the stream from its connection.
                Some(entry) if entry.opener != opener => Some(GapReason::Unknown),
                Some(entry) => {
                    let sink = entry.sink.clone();
                    let hello = Frame {
                        own: bytes::Bytes::from(format!(
                            "event: hello\nretry: {}\ndata: {}\n\n",
                            sse::RECONNECT_AFTER_MS,
                            resume::hello_data(info.connected, info.generation, &sink.id, true)
                        )),
                        tail: None,
                    };
                    let lost = |from: u64, to: u64| {
                        let (from, to) = (sink.event_id(from), sink.event_id(to));
                        let last = EventId::of_number(from.number() - 1);
                        [
                            SharedEvent::new(
                                "gap",
                                &resume::gap_data(GapReason::Buffer, last, Some(to)),
                            ),
                            SharedEvent::new("snapshot", &self.snapshot(&registry, &sink.id)),
                        ]
                    };
                    match sink.resume(seen.sequence, hello, lost) {
                        Ok((receiver, how)) => {
                            let start = match how {
                                sse::Resumed::Replayed { count } => {
                                    StreamStart::Resumed { replayed: count }
                                }
                                sse::Resumed::Lost { .. } => StreamStart::Gap(GapReason::Buffer),
                            };
                            let guard = sse::StreamGuard::new(Arc::downgrade(self), &receiver);
                            drop(registry);
                            return Ok((
                                sse::OpenedStream {
                                    sink,
                                    receiver,
                                    guard,
                                },
                                start,
                            ));
                        }
                        Err(sse::NotSent) => Some(GapReason::Unknown),
                    }
                }
            },
        };
        if registry.streams.len() >= self.limits.max_streams && !self.make_room(&mut registry) {
            return Err(EventsError::TooManyStreams(registry.streams.len()));
        }
        let Some(slot) = registry.free_slot() else {
            return Err(EventsError::TooManyStreams(registry.streams.len()));
        };
        let id: Arc<str> = random_id().into();
        let shape = StreamShape {
            epoch: self.epoch,
            slot,
            event_limit: self.limits.stream_queue,
            replay: self.limits.replay_events,
        };
        let (sink, receiver) = StreamSink::new(id.clone(), shape);
        let hello = resume::hello_data(info.connected, info.generation, &id, false);
        sink.push_shared(&SharedEvent::hello(&hello));
        registry.streams.insert(
            id.clone(),
            StreamEntry {
                sink: sink.clone(),
                subscriptions: HashSet::new(),
                reader,
                opener,
            },
        );
        registry.slots.insert(slot, id.clone());
        let start = match (gap, last_seen) {
            (Some(reason), Some(seen)) => {
                sink.push("gap", &resume::gap_data(reason, seen, None));
                sink.push("snapshot", &self.snapshot(&registry, &id));
                StreamStart::Gap(reason)
            }
            _ => StreamStart::New,
        };
        drop(registry);
        let guard = sse::StreamGuard::new(Arc::downgrade(self), &receiver);
        Ok((
            sse::OpenedStream {
                sink,
                receiver,
                guard,
            },
            start,
        ))
    }

    /// Ends the stream whose reader has been gone longest, for a new one at
    /// `events.max_streams`; `false` when every stream has its reader.
    fn make_room(&self, registry: &mut Registry) -> bool {
        let now = Instant::now();
        let longest = registry
            .streams
            .values()
            .filter_map(|entry| Some((entry.sink.detached_for(now)?, entry.sink.id.clone())))
            .max();
        let Some((_, id)) = longest else {
            return false;
        };
        if let Some(entry) = registry.remove_stream(&id) {
            entry.sink.close();
        }
        self.changed.notify_one();
        true
    }

    /// The `snapshot` of stream `id`'s subscriptions (each channel's last reading, its age now
    /// and quality), the control lease and the station link.
    fn snapshot(&self, registry: &Registry, id: &str) -> String {
        let info = self.station.info();
        let link = (info.connected, info.generation);
        let now = Instant::now();
        let mut subscriptions: Vec<&Subscription> = registry
            .streams
            .get(id)
            .map(|entry| {
                entry
                    .subscriptions
                    .iter()
                    .filter_map(|sub| registry.subscriptions.get(sub))
                    .collect()
            })
            .unwrap_or_default();
        subscriptions.sort_by(|a, b| a.id.cmp(&b.id));
        let parts = subscriptions
            .into_iter()
            .map(|subscription| {
                let channels = subscription
                    .channels
                    .iter()
                    .zip(subscription.ids.iter())
                    .map(|(name, &number)| {
                        let reading = registry
                            .latest
                            .get(number as usize)
                            .and_then(Option::as_ref);
                        (name.as_str(), reading)
                    });
                resume::subscription_snapshot(&subscription.id, channels, link, now)
            })
            .collect();
        resume::snapshot_data(
            parts,
            &(self.lease)(),
            info.connected,
            info.generation,
            info.last_error.as_deref(),
        )
    }

    /// The body of stream `id` attached as `attachment` was dropped: its reader went away.
    /// Kept for the reader to resume within `events.resume_grace_ms` (ended at once when that
    /// is 0); nothing to do when another body has resumed it since.
    pub(crate) fn detached(&self, id: &str, attachment: u64) {
        let resumed_since = self
            .registry()
            .streams
            .get(id)
            .is_some_and(|entry| !entry.sink.is_attachment(attachment));
        if resumed_since {
            return;
        }
        if self.resume_grace.is_zero() || self.shutdown.is_cancelled() {
            self.close_stream(id);
        } else {
            // The sweep ends it after the grace.
            self.changed.notify_one();
        }
    }

    /// Ends a stream at once and every subscription it had.
    pub fn close_stream(&self, id: &str) {
        let removed = self.registry().remove_stream(id);
        if let Some(entry) = removed {
            entry.sink.close();
            self.changed.notify_one();
        }
    }

    /// Ends a stream and its subscriptions after a last `closed` event saying why.
    fn close_stream_saying(&self, id: &str, reason: &str, message: &str) {
        let removed = self.registry().remove_stream(id);
        if let Some(entry) = removed {
            entry.sink.close_saying(reason, message);
            self.changed.notify_one();
        }
    }

    /// Takes a stream out whose queue closed it (it fell too many events behind).
    fn remove_stream(&self, id: &str) {
        let removed = self.registry().remove_stream(id);
        if removed.is_some() {
            tracing::info!(stream = %id, "closed an event stream whose reader fell events.stream_queue events behind");
            self.changed.notify_one();
        }
    }

    /// Every open stream, for fanning an event out.
    pub(crate) fn sinks(&self) -> Vec<Arc<StreamSink>> {
        self.registry()
            .streams
            .values()
            .map(|entry| entry.sink.clone())
            .collect()
    }

    /// Queues one event on every open stream (its data shared by all of them).
    pub(crate) fn broadcast(&self, event: &'static str, data: &str) {
        let shared = SharedEvent::new(event, data);
        for sink in self.sinks() {
            if sink.push_shared(&shared) == Push::Overflow {
                self.remove_stream(&sink.id);
            }
        }
    }

    /// Queues one event about `channels` (a `numeric-result`: its channel and its target) on
    /// every open stream whose reader the access rules in force let read each of them from the
    /// cache (`read_cache`, as a subscription to them asks); on every stream without rules.
    /// Decided when the event goes out, by the rules in force then; not counted as refusals
    /// (nobody asked).
    pub(crate) fn broadcast_about(&self, channels: &[&str], event: &'static str, data: &str) {
        let Some(rules) = self.station.access_rules().current() else {
            self.broadcast(event, data);
            return;
        };
        let shared = SharedEvent::new(event, data);
        let readers: Vec<(Arc<StreamSink>, Option<Who>)> = self
            .registry()
            .streams
            .values()
            .map(|entry| (entry.sink.clone(), entry.reader.clone()))
            .collect();
        let info = self.station.info();
        let facts: Vec<_> = channels
            .iter()
            .map(|channel| crate::station::channel_facts(&info.channels, channel))
            .collect();
        for (sink, reader) in readers {
            // A stream opened without a reader while rules are in force gets nothing.
            let may_read = reader.is_some_and(|who| {
                let principal = rules.principal(&who.subject());
                facts.iter().all(|facts| {
                    rules
                        .decide(&principal, facts, crate::rules::Action::ReadCache, None)
                        .allowed
                })
            });
            if may_read && sink.push_shared(&shared) == Push::Overflow {
                self.remove_stream(&sink.id);
            }
        }
    }

    /// Ends subscriptions not renewed in time, streams not resumed within the grace, and
    /// closes streams stuck for [`STUCK_LIMIT`] with a last event saying so. Returns when this
    /// next needs doing.
    pub(crate) fn sweep(&self, now: Instant) -> Option<Instant> {
        let mut registry = self.registry();
        let expired: Vec<Arc<str>> = registry
            .subscriptions
            .values()
            .filter(|subscription| subscription.expires_at <= now)
            .map(|subscription| subscription.id.clone())
            .collect();
        for id in &expired {
            registry.remove_subscription(id);
        }
        let mut stuck = Vec::new();
        let mut gone = Vec::new();
        let mut next_gone: Option<Instant> = None;
        for entry in registry.streams.values() {
            let sink = &entry.sink;
            if sink.is_closed() {
                gone.push(sink.id.clone());
            } else if let Some(away) = sink.detached_for(now) {
                if away >= self.resume_grace {
                    gone.push(sink.id.clone());
                } else {
                    let at = now + (self.resume_grace - away);
                    next_gone = Some(next_gone.map_or(at, |next| next.min(at)));
                }
            } else if sink
                .stuck_for(now)
                .is_some_and(|stuck| stuck >= STUCK_LIMIT)
            {
                stuck.push(sink.id.clone());
            }
        }
        for id in &gone {
            if let Some(entry) = registry.remove_stream(id) {
                entry.sink.close();
            }
        }
        let next_expiry = registry
            .subscriptions
            .values()
            .map(|subscription| subscription.expires_at)
            .min();
        drop(registry);
        for id in &stuck {
            tracing::info!(stream = %id, "closing an event stream whose reader has taken nothing for {} s", STUCK_LIMIT.as_secs());
            self.close_stream_saying(
                id,
                "stuck",
                &format!(
                    "the reader took no event for {} s: reconnect with Last-Event-ID for a gap and a snapshot",
                    STUCK_LIMIT.as_secs()
                ),
            );
        }
        match (next_expiry, next_gone) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// How many items wait in stream `id`'s queue now, and how many values were merged in it
    /// so far (for tests and diagnostics).
    pub fn stream_queue(&self, id: &str) -> Option<(usize, u64)> {
        let registry = self.registry();
        let sink = &registry.streams.get(id)?.sink;
        Some((sink.queued(), sink.merged()))
    }

    /// The live subscriptions' channels and intervals (for tests and diagnostics).
    pub fn subscription_of(&self, id: &str) -> Option<(Vec<String>, Duration)> {
        self.registry()
            .subscriptions
            .get(id)
            .map(|s| (s.channels.to_vec(), s.interval))
    }
}

/// A random 128-bit id in hex: stream and subscription ids cannot be guessed.
fn random_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::{LinkSettings, LinkTask, StationUrl};

    /// Events on a link that is never run: enough for streams, which need no station.
    fn events(limits: EventsConfig) -> Arc<Events> {
        let settings = LinkSettings {
            url: StationUrl::parse("tcp://127.0.0.1:1").unwrap(),
            request_timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_millis(100),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(100),
            max_names_per_read: 64,
            coalesce_quiet: Duration::ZERO,
            coalesce_max: Duration::ZERO,
            queue_depth: 4,
            client_name: "test".into(),
        };
        let (_task, link) = LinkTask::new(settings);
        Events::new(
            limits,
            Station::new(link, crate::audit::AuditLog::memory_only()),
            Box::new(LeaseView::nobody),
            CancellationToken::new(),
        )
    }

    fn open(events: &Arc<Events>, last_seen: Option<EventId>) -> (sse::OpenedStream, StreamStart) {
        events.open_stream(None, None, last_seen).unwrap()
    }

    /// Every event queued on `receiver` now: (id, name, data).
    fn drain(
        receiver: &mut sse::StreamReceiver,
    ) -> Vec<(Option<EventId>, String, serde_json::Value)> {
        std::iter::from_fn(|| receiver.try_recv())
            .map(|frame| {
                let text = String::from_utf8(frame.to_vec()).unwrap();
                let field = |name: &str| {
                    text.lines()
                        .find_map(|line| line.strip_prefix(name))
                        .map(str::to_owned)
                };
                (
                    field("id: ").map(|id| EventId::parse(&id).unwrap()),
                    field("event: ").unwrap(),
                    serde_json::from_str(&field("data: ").unwrap()).unwrap(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn a_reader_that_takes_nothing_for_the_stuck_limit_is_closed_saying_so() {
        let events = events(EventsConfig::default());
        let (mut stuck, _) = open(&events, None);
        let (mut slow, _) = open(&events, None);
        let now = Instant::now();
        events.sweep(now);
        assert_eq!(events.stream_count(), 2);
        // Both had their hello and a lease event waiting; the slow reader took them, late.
        events.broadcast("lease", "{}");
        drain(&mut slow.receiver);
        events.sweep(now + STUCK_LIMIT + Duration::from_secs(1));
        assert_eq!(events.stream_count(), 1, "the stuck one is closed");
        assert!(stuck.sink.is_closed());
        assert!(!slow.sink.is_closed());
        let last = drain(&mut stuck.receiver);
        assert_eq!(last.len(), 1, "{last:?}");
        assert_eq!(last[0].1, "closed");
        assert_eq!(last[0].2["reason"], "stuck");
        assert_eq!(stuck.sink.push("x", "{}"), Push::Closed);
    }

    #[tokio::test]
    async fn a_stream_whose_reader_went_away_is_kept_for_the_grace_then_ended() {
        let events = events(EventsConfig {
            resume_grace_ms: 5_000,
            ..EventsConfig::default()
        });
        let (opened, _) = open(&events, None);
        let sink = opened.sink.clone();
        drop(opened.into_body(CancellationToken::new()));
        assert_eq!(events.stream_count(), 1, "kept for its reader to resume");
        let now = Instant::now();
        let next = events
            .sweep(now)
            .expect("the grace's end is when to sweep next");
        assert!(next <= now + Duration::from_secs(5), "{:?}", next - now);
        assert_eq!(events.stream_count(), 1);
        events.sweep(now + Duration::from_secs(6));
        assert_eq!(events.stream_count(), 0);
        assert!(sink.is_closed());
    }

    #[tokio::test]
    async fn with_no_grace_a_stream_ends_with_its_body() {
        let events = events(EventsConfig {
            resume_grace_ms: 0,
            ..EventsConfig::default()
        });
        let (opened, _) = open(&events, None);
        drop(opened.into_body(CancellationToken::new()));
        assert_eq!(events.stream_count(), 0);
    }

    /// A connection the gateway has not seen die yet: the reader resumes on a new one, and the
    /// old body, dropped later, leaves the resumed stream alone (even with no grace).
    #[tokio::test]
    async fn the_old_body_of_a_stream_resumed_elsewhere_leaves_it_alone_when_dropped() {
        let events = events(EventsConfig {
            resume_grace_ms: 0,
            ..EventsConfig::default()
        });
        let (mut old, _) = open(&events, None);
        let hello = drain(&mut old.receiver)[0].0.unwrap();
        let old_body = old.into_body(CancellationToken::new());
        let (mut resumed, start) = open(&events, Some(hello));
        assert_eq!(start, StreamStart::Resumed { replayed: 0 });
        drop(old_body);
        assert_eq!(events.stream_count(), 1);
        events.broadcast("lease", "{}");
        let got = drain(&mut resumed.receiver);
        assert_eq!(got.last().unwrap().1, "lease", "{got:?}");
    }

    #[tokio::test]
    async fn a_reader_resuming_with_its_last_event_id_gets_the_rest_of_its_stream() {
        let events = events(EventsConfig::default());
        let (mut opened, start) = open(&events, None);
        assert_eq!(start, StreamStart::New);
        let hello = drain(&mut opened.receiver);
        let (Some(hello_id), name, data) = &hello[0] else {
            panic!("{hello:?}")
        };
        assert_eq!(name, "hello");
        assert_eq!(data["resumed"], false);
        assert_eq!(hello_id.epoch, events.epoch());
        assert_eq!(hello_id.sequence, 1);
        events.broadcast("lease", "{\"n\":1}");
        let lease = drain(&mut opened.receiver);
        let id_of_lease = lease[0].0.unwrap();
        // The reader saw hello only: the lease event was lost on its way.
        drop(opened.into_body(CancellationToken::new()));
        events.broadcast("lease", "{\"n\":2}");
        let (mut resumed, start) = open(&events, Some(*hello_id));
        assert_eq!(start, StreamStart::Resumed { replayed: 1 });
        let got = drain(&mut resumed.receiver);
        let names: Vec<&str> = got.iter().map(|(_, name, _)| name.as_str()).collect();
        assert_eq!(names, ["hello", "lease", "lease"]);
        assert_eq!(got[0].0, None, "a resumed stream's hello has no id");
        assert_eq!(got[0].2["resumed"], true);
        assert_eq!(got[0].2["streamId"], data["streamId"]);
        assert_eq!(got[1].0, Some(id_of_lease), "sent again with its id");
        assert_eq!(got[2].0.unwrap().number(), id_of_lease.number() + 1);
        assert_eq!(got[2].2["n"], 2);
        assert_eq!(events.stream_count(), 1);
    }

    #[tokio::test]
    async fn an_id_of_another_epoch_or_an_ended_stream_opens_a_new_stream_after_a_gap_and_a_snapshot()
     {
        let events = events(EventsConfig::default());
        let other_epoch = if events.epoch() == 1000 { 1001 } else { 1000 };
        for (seen, reason) in [
            (EventId::new(other_epoch, 5, 17), "restart"),
            (EventId::new(events.epoch(), 5, 17), "ended"),
        ] {
            let (mut opened, start) = open(&events, Some(seen));
            assert_eq!(
                start,
                StreamStart::Gap(if reason == "restart" {
                    GapReason::Restart
                } else {
                    GapReason::Ended
                })
            );
            let got = drain(&mut opened.receiver);
            let names: Vec<&str> = got.iter().map(|(_, name, _)| name.as_str()).collect();
            assert_eq!(names, ["hello", "gap", "snapshot"], "{reason}");
            assert_eq!(got[0].2["resumed"], false);
            let gap = &got[1].2;
            assert_eq!(gap["reason"], reason);
            assert_eq!(gap["lastEventId"], seen.to_string());
            assert_eq!(gap["from"], EventId::new(seen.epoch, 5, 18).to_string());
            assert!(gap["to"].is_null() && gap["lost"].is_null(), "{gap}");
            assert_eq!(gap["subscriptions"], "ended");
            let snapshot = &got[2].2;
            assert_eq!(snapshot["subscriptions"], serde_json::json!([]));
            assert_eq!(snapshot["lease"]["held"], false);
            assert_eq!(snapshot["connection"]["isConnected"], false);
            // Ids go on by one after the hello: no gap a client would take for dropped events.
            let ids: Vec<u64> = got.iter().map(|(id, _, _)| id.unwrap().number()).collect();
            assert_eq!(ids[1], ids[0] + 1);
            assert_eq!(ids[2], ids[0] + 2);
        }
    }

    #[tokio::test]
    async fn a_reader_behind_the_replay_buffer_gets_a_gap_with_the_ids_lost_and_a_snapshot() {
        let events = events(EventsConfig {
            replay_events: 2,
            ..EventsConfig::default()
        });
        let (mut opened, _) = open(&events, None);
        let hello_id = drain(&mut opened.receiver)[0].0.unwrap();
        for _ in 0..4 {
            events.broadcast("lease", "{}");
        }
        let sent = drain(&mut opened.receiver);
        drop(opened.into_body(CancellationToken::new()));
        let (mut resumed, start) = open(&events, Some(hello_id));
        assert_eq!(start, StreamStart::Gap(GapReason::Buffer));
        let got = drain(&mut resumed.receiver);
        let names: Vec<&str> = got.iter().map(|(_, name, _)| name.as_str()).collect();
        assert_eq!(names, ["hello", "gap", "snapshot"]);
        let gap = &got[1].2;
        assert_eq!(gap["reason"], "buffer");
        assert_eq!(gap["from"], sent[0].0.unwrap().to_string());
        assert_eq!(gap["to"], sent[3].0.unwrap().to_string());
        assert_eq!(gap["lost"], 4);
        assert_eq!(gap["subscriptions"], "kept");
        assert_eq!(got[1].0.unwrap().number(), sent[3].0.unwrap().number() + 1);
    }

    #[tokio::test]
    async fn an_id_this_stream_never_sent_opens_a_new_stream() {
        let events = events(EventsConfig::default());
        let (mut opened, _) = open(&events, None);
        let hello_id = drain(&mut opened.receiver)[0].0.unwrap();
        let ahead = EventId::new(hello_id.epoch, hello_id.stream, hello_id.sequence + 5);
        let (mut other, start) = open(&events, Some(ahead));
        assert_eq!(start, StreamStart::Gap(GapReason::Unknown));
        assert_eq!(drain(&mut other.receiver)[1].2["reason"], "unknown");
        assert_eq!(events.stream_count(), 2);
    }

    /// With access control on, a stream is resumed only with the credentials it was opened
    /// with: someone else's `Last-Event-ID` gets a new stream, the stream stays its opener's.
    #[tokio::test]
    async fn only_the_key_that_opened_a_stream_resumes_it() {
        let events = events(EventsConfig::default());
        let (mut opened, _) = events
            .open_stream(None, Some("bench-3".into()), None)
            .unwrap();
        let hello = drain(&mut opened.receiver)[0].0.unwrap();
        let (mut other, start) = events
            .open_stream(None, Some("bench-4".into()), Some(hello))
            .unwrap();
        assert_eq!(start, StreamStart::Gap(GapReason::Unknown));
        assert_eq!(drain(&mut other.receiver)[1].2["reason"], "unknown");
        assert!(!opened.sink.is_closed());
        let (_, start) = events
            .open_stream(None, Some("bench-3".into()), Some(hello))
            .unwrap();
        assert_eq!(start, StreamStart::Resumed { replayed: 0 });
    }

    #[tokio::test]
    async fn at_the_stream_limit_the_stream_gone_longest_makes_room() {
        let events = events(EventsConfig {
            max_streams: 2,
            ..EventsConfig::default()
        });
        let (first, _) = open(&events, None);
        let (second, _) = open(&events, None);
        let (first_sink, second_sink) = (first.sink.clone(), second.sink.clone());
        assert_eq!(
            events.open_stream(None, None, None).err(),
            Some(EventsError::TooManyStreams(2)),
            "every stream has its reader"
        );
        drop(first.into_body(CancellationToken::new()));
        assert!(events.open_stream(None, None, None).is_ok());
        assert!(first_sink.is_closed());
        assert!(!second_sink.is_closed());
    }

    #[tokio::test]
    async fn subscribing_needs_a_known_channel_list_and_a_live_stream() {
        let events = events(EventsConfig::default());
        let request = SubscriptionRequest {
            channels: vec!["A".into()],
            interval_ms: 100,
            ..SubscriptionRequest::default()
        };
        assert!(matches!(
            events.subscribe("nope", &request),
            Err(EventsError::StationNotReached(_))
        ));
        let request = SubscriptionRequest {
            channels: vec!["A".into()],
            interval_ms: 99,
            ..SubscriptionRequest::default()
        };
        assert_eq!(
            events.subscribe("nope", &request),
            Err(EventsError::IntervalOutOfRange(99))
        );
        let request = SubscriptionRequest {
            channels: vec![],
            interval_ms: 100,
            ..SubscriptionRequest::default()
        };
        assert_eq!(
            events.subscribe("nope", &request),
            Err(EventsError::NoChannels)
        );
        assert_eq!(
            events.unsubscribe("nope"),
            Err(EventsError::NoSuchSubscription("nope".into()))
        );
    }
}
