//! The event stream (`GET api/events`) and value subscriptions: the registry of open streams
//! and their subscriptions ([`Events`]), shared by the HTTP handlers, the [`scheduler`] that
//! reads for every subscription, and the [`relay`] that fans link and lease events out.
//!
//! Every event reaches a stream through its bounded queue ([`sse::StreamSink`]), filled with
//! `try_send` only: no producer ever waits for a reader. See `docs/events.md`.

pub mod filter;
pub mod filter_index;
pub mod relay;
pub mod scheduler;
pub mod sse;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::access_rules::Who;
use crate::config::EventsConfig;
use crate::station::Station;
use filter::{ChannelFilter, Deadband, FilterOptions, ResolveError};
use filter_index::{FilterIndex, Slot};
use sse::StreamSink;

/// The shortest and longest `IntervalMs` a subscription may ask for.
pub const MIN_INTERVAL_MS: u64 = 100;
pub const MAX_INTERVAL_MS: u64 = 60_000;

/// The longest `MinIntervalMs` or `MaxIntervalMs` a subscription may ask for.
pub const MAX_FILTER_INTERVAL_MS: u64 = 3_600_000;

/// A stream whose queue stays full this long is closed (its reader is stuck).
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
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    streams: HashMap<Arc<str>, StreamEntry>,
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

/// The open event streams and their subscriptions.
pub struct Events {
    limits: EventsConfig,
    /// `[events] ranges`, for percent deadbands.
    ranges: filter::Ranges,
    subscription_ttl: Duration,
    station: Station,
    shutdown: CancellationToken,
    registry: Mutex<Registry>,
    /// Wakes the scheduler when subscriptions are added, changed or removed.
    pub(crate) changed: Notify,
    /// The origin of the scheduler's time grid: subscriptions with the same interval tick
    /// together, so their reads share one READ.
    pub(crate) epoch: Instant,
}

impl Events {
    pub fn new(limits: EventsConfig, station: Station, shutdown: CancellationToken) -> Arc<Events> {
        let subscription_ttl = Duration::from_millis(limits.subscription_ttl_ms);
        let ranges = filter::Ranges::new(&limits.ranges);
        Arc::new(Events {
            limits,
            ranges,
            subscription_ttl,
            station,
            shutdown,
            registry: Mutex::new(Registry::default()),
            changed: Notify::new(),
            epoch: Instant::now(),
        })
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

    /// Registers a new stream opened by `reader` (`None`: no access rules in force) and
    /// queues its `hello`; the returned sink's receiver is the body.
    pub(crate) fn open_stream(
        self: &Arc<Events>,
        reader: Option<Who>,
    ) -> Result<sse::OpenedStream, EventsError> {
        if self.shutdown.is_cancelled() {
            return Err(EventsError::ShuttingDown);
        }
        let info = self.station.info();
        let mut registry = self.registry();
        if registry.streams.len() >= self.limits.max_streams {
            return Err(EventsError::TooManyStreams(registry.streams.len()));
        }
        let id: Arc<str> = random_id().into();
        let (sink, receiver) = StreamSink::new(id.clone(), self.limits.stream_queue);
        let hello = json!({
            "isConnected": info.connected,
            "generation": info.generation,
            "apiVersion": crate::api_version::API_VERSION,
            "streamId": &*id,
        });
        // The queue is new and at least one event long: hello always fits, as id 1.
        let _ = sink.push("hello", &hello.to_string());
        registry.streams.insert(
            id.clone(),
            StreamEntry {
                sink: sink.clone(),
                subscriptions: HashSet::new(),
                reader,
            },
        );
        drop(registry);
        Ok(sse::OpenedStream {
            sink,
            receiver,
            guard: sse::StreamGuard::new(Arc::downgrade(self), id),
        })
    }

    /// Ends a stream and, at once, every subscription it had.
    pub fn close_stream(&self, id: &str) {
        let mut registry = self.registry();
        let Some(entry) = registry.streams.remove(id) else {
            return;
        };
        for subscription in &entry.subscriptions {
            registry.remove_subscription(subscription);
        }
        drop(registry);
        entry.sink.close();
        self.changed.notify_one();
    }

    /// Every open stream, for fanning an event out.
    pub(crate) fn sinks(&self) -> Vec<Arc<StreamSink>> {
        self.registry()
            .streams
            .values()
            .map(|entry| entry.sink.clone())
            .collect()
    }

    /// Queues one event on every open stream.
    pub(crate) fn broadcast(&self, event: &str, data: &str) {
        for sink in self.sinks() {
            let _ = sink.push(event, data);
        }
    }

    /// Queues one event about `channels` (a `numeric-result`: its channel and its target) on
    /// every open stream whose reader the access rules in force let read each of them from the
    /// cache (`read_cache`, as a subscription to them asks); on every stream without rules.
    /// Decided when the event goes out, by the rules in force then; not counted as refusals
    /// (nobody asked).
    pub(crate) fn broadcast_about(&self, channels: &[&str], event: &str, data: &str) {
        let Some(rules) = self.station.access_rules().current() else {
            self.broadcast(event, data);
            return;
        };
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
            if may_read {
                let _ = sink.push(event, data);
            }
        }
    }

    /// Checks a create or update request against the limits and the channel list.
    fn check(&self, request: &SubscriptionRequest) -> Result<Checked, EventsError> {
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&request.interval_ms) {
            return Err(EventsError::IntervalOutOfRange(request.interval_ms));
        }
        let mut channels: Vec<String> = Vec::with_capacity(request.channels.len());
        for name in &request.channels {
            if !channels.contains(name) {
                channels.push(name.clone());
            }
        }
        if channels.is_empty() {
            return Err(EventsError::NoChannels);
        }
        if channels.len() > self.limits.max_channels_per_subscription {
            return Err(EventsError::TooManyChannels {
                count: channels.len(),
                max: self.limits.max_channels_per_subscription,
            });
        }
        let info = self
            .station
            .reached()
            .map_err(|not_reached| EventsError::StationNotReached(not_reached.why))?;
        if let Some(unknown) = channels
            .iter()
            .find(|name| info.channels.get(name).is_none())
        {
            return Err(EventsError::UnknownChannel(unknown.clone()));
        }
        let filters = self.filters(request, &channels)?;
        Ok(Checked {
            channels: channels.into(),
            filters,
        })
    }

    /// Each channel's filter, or `None` when the request asks for none.
    fn filters(
        &self,
        request: &SubscriptionRequest,
        channels: &[String],
    ) -> Result<Option<Vec<ChannelFilter>>, EventsError> {
        check_options(&request.options, request.interval_ms, "")?;
        for (name, options) in &request.channel_options {
            if !channels.contains(name) {
                return Err(EventsError::BadFilter(format!(
                    "ChannelOptions names {name}, which is not among Channels"
                )));
            }
            check_options(
                options,
                request.interval_ms,
                &format!("ChannelOptions.{name}."),
            )?;
        }
        let asked = !request.options.is_empty()
            || request
                .channel_options
                .iter()
                .any(|(_, options)| !options.is_empty());
        if !asked {
            return Ok(None);
        }
        let filters = channels
            .iter()
            .map(|name| {
                let own = request
                    .channel_options
                    .iter()
                    .rev()
                    .find(|(named, _)| named == name)
                    .map(|(_, options)| *options)
                    .unwrap_or_default();
                let options = request.options.overlaid_by(&own);
                check_options(&options, request.interval_ms, &format!("{name}: "))?;
                ChannelFilter::resolve(&options, self.ranges.of(name))
                    .map_err(|ResolveError::NoRange| EventsError::NoRange(name.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(filters))
    }

    /// `POST api/subscriptions`.
    pub fn subscribe(
        &self,
        stream_id: &str,
        request: &SubscriptionRequest,
    ) -> Result<SubscriptionGrant, EventsError> {
        let Checked { channels, filters } = self.check(request)?;
        let now = Instant::now();
        let mut registry = self.registry();
        let entry = registry
            .streams
            .get(stream_id)
            .ok_or_else(|| EventsError::NoSuchStream(stream_id.to_owned()))?;
        if entry.subscriptions.len() >= self.limits.max_subscriptions_per_stream {
            return Err(EventsError::TooManySubscriptions {
                stream: stream_id.to_owned(),
                max: self.limits.max_subscriptions_per_stream,
            });
        }
        let sink = entry.sink.clone();
        let id: Arc<str> = random_id().into();
        let ids = registry.channel_ids.numbers_of(&channels);
        let mut subscription = Subscription {
            id: id.clone(),
            stream: sink,
            channels,
            ids,
            interval: Duration::from_millis(request.interval_ms),
            expires_at: now + self.subscription_ttl,
            // The first values go out at once; later ones on the interval's grid.
            next_due: now,
            filtered: None,
        };
        subscription.filtered = filters.map(|filters| registry.place(&subscription, filters));
        registry.subscriptions.insert(id.clone(), subscription);
        registry.own_ticks.insert(id.clone());
        registry.shortest = None;
        if let Some(entry) = registry.streams.get_mut(stream_id) {
            entry.subscriptions.insert(id.clone());
        }
        drop(registry);
        self.changed.notify_one();
        Ok(SubscriptionGrant {
            id: id.to_string(),
            expires_in: self.subscription_ttl,
        })
    }

    /// `PUT api/subscriptions/{id}`: replaces channels, interval and filter, and renews. A
    /// change of any of them starts the subscription afresh: values at once, all of them.
    pub fn update(
        &self,
        id: &str,
        request: &SubscriptionRequest,
    ) -> Result<SubscriptionGrant, EventsError> {
        let Checked { channels, filters } = self.check(request)?;
        let now = Instant::now();
        let mut registry = self.registry();
        registry.shortest = None;
        let ids = registry.channel_ids.numbers_of(&channels);
        let mut subscription = match registry.subscriptions.remove(id) {
            Some(live) if live.expires_at > now => live,
            expired => {
                // Not renewed in time: the sweep ends it where it is.
                if let Some(expired) = expired {
                    registry.subscriptions.insert(expired.id.clone(), expired);
                }
                return Err(EventsError::NoSuchSubscription(id.to_owned()));
            }
        };
        let interval = Duration::from_millis(request.interval_ms);
        let old_filters = subscription
            .filtered
            .as_ref()
            .map(|filtered| filtered.filters.clone());
        if interval != subscription.interval
            || channels != subscription.channels
            || old_filters != filters
        {
            if let Some(filtered) = subscription.filtered.take() {
                registry.unplace(subscription.interval, &filtered);
            }
            subscription.channels = channels;
            subscription.ids = ids;
            subscription.interval = interval;
            subscription.next_due = now;
            subscription.filtered = filters.map(|filters| registry.place(&subscription, filters));
            registry.own_ticks.insert(subscription.id.clone());
        }
        subscription.expires_at = now + self.subscription_ttl;
        registry
            .subscriptions
            .insert(subscription.id.clone(), subscription);
        drop(registry);
        self.changed.notify_one();
        Ok(SubscriptionGrant {
            id: id.to_owned(),
            expires_in: self.subscription_ttl,
        })
    }

    /// `DELETE api/subscriptions/{id}`.
    pub fn unsubscribe(&self, id: &str) -> Result<(), EventsError> {
        let removed = self.registry().remove_subscription(id);
        match removed {
            Some(_) => {
                self.changed.notify_one();
                Ok(())
            }
            None => Err(EventsError::NoSuchSubscription(id.to_owned())),
        }
    }

    /// Ends subscriptions not renewed in time, and closes streams stuck for [`STUCK_LIMIT`].
    /// Returns when this next needs doing.
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
        let stuck: Vec<Arc<str>> = registry
            .streams
            .values()
            .filter(|entry| {
                entry
                    .sink
                    .stuck_for(now)
                    .is_some_and(|stuck| stuck >= STUCK_LIMIT)
            })
            .map(|entry| entry.sink.id.clone())
            .collect();
        let next_expiry = registry
            .subscriptions
            .values()
            .map(|subscription| subscription.expires_at)
            .min();
        drop(registry);
        for id in &stuck {
            tracing::info!(stream = %id, "closing an event stream whose reader has not read for {} s", STUCK_LIMIT.as_secs());
            self.close_stream(id);
        }
        next_expiry
    }

    /// The live subscriptions' channels and intervals (for tests and diagnostics).
    pub fn subscription_of(&self, id: &str) -> Option<(Vec<String>, Duration)> {
        self.registry()
            .subscriptions
            .get(id)
            .map(|s| (s.channels.to_vec(), s.interval))
    }
}

/// Checks one set of filter options; `field` prefixes the names in the message.
fn check_options(
    options: &FilterOptions,
    interval_ms: u64,
    field: &str,
) -> Result<(), EventsError> {
    let bad = |message: String| Err(EventsError::BadFilter(format!("{field}{message}")));
    match options.deadband {
        Some(Deadband::Absolute(band)) if !(band.is_finite() && band >= 0.0) => {
            return bad(format!(
                "Deadband.Absolute must be a number of 0 or more; got {band}"
            ));
        }
        Some(Deadband::Percent(percent)) if !(0.0..=100.0).contains(&percent) => {
            return bad(format!("Deadband.Percent must be 0 to 100; got {percent}"));
        }
        _ => {}
    }
    let ms = |duration: Duration| duration.as_millis() as u64;
    if let Some(least) = options.min_interval.map(ms)
        && least > MAX_FILTER_INTERVAL_MS
    {
        return bad(format!(
            "MinIntervalMs must be 0 to {MAX_FILTER_INTERVAL_MS}; got {least}"
        ));
    }
    if let Some(heartbeat) = options.max_interval.map(ms) {
        if !(interval_ms..=MAX_FILTER_INTERVAL_MS).contains(&heartbeat) {
            return bad(format!(
                "MaxIntervalMs must be from IntervalMs ({interval_ms}) to {MAX_FILTER_INTERVAL_MS}; got {heartbeat}"
            ));
        }
        if let Some(least) = options.min_interval.map(ms)
            && least > heartbeat
        {
            return bad(format!(
                "MinIntervalMs ({least}) must not be above MaxIntervalMs ({heartbeat})"
            ));
        }
    }
    Ok(())
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
            CancellationToken::new(),
        )
    }

    #[tokio::test]
    async fn a_stream_full_for_the_stuck_limit_is_closed_and_a_drained_one_is_not() {
        let events = events(EventsConfig {
            stream_queue: 2,
            ..EventsConfig::default()
        });
        let stuck = events.open_stream(None).unwrap();
        let mut slow = events.open_stream(None).unwrap();
        for sink in [&stuck.sink, &slow.sink] {
            assert_eq!(sink.push("x", "{}"), sse::Push::Queued);
            assert_eq!(sink.push("x", "{}"), sse::Push::Dropped);
        }
        // The slow reader catches up: its queue has room again.
        slow.receiver.recv().await.unwrap();
        let now = Instant::now();
        events.sweep(now);
        assert_eq!(events.stream_count(), 2);
        events.sweep(now + STUCK_LIMIT + Duration::from_secs(1));
        assert_eq!(events.stream_count(), 1);
        assert!(stuck.sink.is_closed());
        assert!(!slow.sink.is_closed());
        assert_eq!(stuck.sink.push("x", "{}"), sse::Push::Closed);
    }

    #[tokio::test]
    async fn streams_past_the_limit_are_refused_and_a_dropped_body_frees_its_place() {
        let events = events(EventsConfig {
            max_streams: 1,
            ..EventsConfig::default()
        });
        let first = events.open_stream(None).unwrap();
        assert_eq!(
            events.open_stream(None).err(),
            Some(EventsError::TooManyStreams(1))
        );
        drop(first.into_body(CancellationToken::new()));
        assert_eq!(events.stream_count(), 0);
        assert!(events.open_stream(None).is_ok());
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
