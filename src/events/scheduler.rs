//! The one subscription scheduler: a task that wakes when a subscription is due, takes what it
//! can from the value cache, reads the rest from the hardware in one `LinkHandle::read`, and
//! queues a `values` event per due subscription without ever waiting for a reader.
//!
//! Subscriptions tick on a grid shared by all of them (multiples of their interval from
//! [`Events::epoch`]), so those with the same interval tick together and share one read. A
//! channel is read from the hardware only when the cache holds no value younger than
//! [`FRESH_FRACTION`] of the shortest interval any subscription asks of it; so each channel
//! is read at most about once per that interval, however many subscriptions name it, and a
//! value read by anyone else in the meantime is reused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value as Json, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Events;
use super::filter::{Observed, SubscriptionFilter};
use super::sse::{Push, StreamSink};
use crate::numeric::NUMERIC_RESULT_FLAG;
use crate::station::{ConsumingRule, Freshness, ItemError, ReadPolicy, UnknownRule};
use station_protocol::Value;

/// A cached value this fraction of the channel's interval old (or younger) is reused. Less
/// than 1 so that timer jitter cannot make a value read at the previous tick look fresh,
/// which would halve the read rate and double the ages.
pub const FRESH_FRACTION: (u32, u32) = (3, 4);

/// The scheduler wakes at least this often to end expired subscriptions and stuck streams.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What one tick owes one subscription.
struct Due {
    id: Arc<str>,
    stream: Arc<StreamSink>,
    channels: Arc<[String]>,
    /// The channels' numbers (`ChannelIds`), in the same order: their outcomes' places.
    ids: Arc<[u32]>,
    /// The grid point it was due at: a filter's intervals are counted between these, so a
    /// late tick does not move a heartbeat.
    at: Instant,
    filter: Option<Arc<Mutex<SubscriptionFilter>>>,
}

/// One channel a tick reads, once however many due subscriptions name it.
struct Wanted {
    id: u32,
    name: String,
    /// The oldest cached value that serves: a fraction of the shortest interval any
    /// subscription asks of the channel.
    max_age: Duration,
}

/// One channel's outcome in a tick.
enum Outcome {
    Value {
        value: Value,
        text: String,
        age_ms: f64,
    },
    Error(String),
}

/// A tick's outcomes by channel number; `None` for a channel not read.
type Outcomes = Vec<Option<Outcome>>;

/// What a channel not read in a tick is said to be.
const NOT_READ: &str = "not read: the gateway is shutting down";

impl Outcome {
    fn of(outcomes: &[Option<Outcome>], id: u32) -> Option<&Outcome> {
        outcomes.get(id as usize).and_then(Option::as_ref)
    }

    fn observed(outcome: Option<&Outcome>) -> Observed<'_> {
        match outcome {
            Some(Outcome::Value { value, .. }) => Observed::Value(value),
            Some(Outcome::Error(why)) => Observed::Error(why),
            None => Observed::Error(NOT_READ),
        }
    }
}

/// Runs until `shutdown`.
pub async fn run(events: Arc<Events>, shutdown: CancellationToken) {
    loop {
        let now = Instant::now();
        let next_expiry = events.sweep(now);
        let next_due = tick(&events, &shutdown).await;
        let mut wake = Instant::now() + SWEEP_EVERY;
        for at in [next_expiry, next_due].into_iter().flatten() {
            wake = wake.min(at);
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = events.changed.notified() => {}
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Serves every due subscription; returns when the next one is due.
async fn tick(events: &Events, shutdown: &CancellationToken) -> Option<Instant> {
    let now = Instant::now();
    let (due, wanted, count) = plan(events, now);
    if !due.is_empty() {
        let outcomes = read_channels(events, &wanted, count, shutdown).await;
        // Subscriptions to the same channels share one serialization of their values; only
        // the subscription id differs between their events.
        let mut bodies: HashMap<&[u32], String> = HashMap::new();
        let mut scratch = Scratch::default();
        for subscription in &due {
            match &subscription.filter {
                None => {
                    let body = bodies.entry(&subscription.ids[..]).or_insert_with(|| {
                        values_body(
                            subscription
                                .channels
                                .iter()
                                .zip(subscription.ids.iter())
                                .map(|(name, &id)| (name, Outcome::of(&outcomes, id))),
                        )
                    });
                    let data = values_event_with(&subscription.id, body);
                    let _ = subscription.stream.push("values", &data);
                }
                Some(filter) => {
                    let mut filter = filter.lock().unwrap_or_else(|poison| poison.into_inner());
                    send_filtered(subscription, &mut filter, &outcomes, &mut scratch);
                }
            }
        }
    }
    events
        .registry()
        .subscriptions
        .values()
        .map(|subscription| subscription.next_due)
        .min()
}

/// Picks the due subscriptions and moves each to its next grid point; also gives every
/// channel they name, once, with the cache age it accepts, and how many channel numbers
/// there are.
fn plan(events: &Events, now: Instant) -> (Vec<Due>, Vec<Wanted>, usize) {
    let mut registry = events.registry();
    let mut due = Vec::new();
    // The next grid point of each interval in use, worked out once per interval per tick.
    let mut grid: Vec<(Duration, Instant)> = Vec::new();
    for subscription in registry.subscriptions.values_mut() {
        if subscription.next_due <= now {
            let at = subscription.next_due;
            let interval = subscription.interval;
            let mut next = match grid.iter().find(|(of, _)| *of == interval) {
                Some((_, point)) => *point,
                None => {
                    let point = next_on_grid(events.epoch, interval, now);
                    grid.push((interval, point));
                    point
                }
            };
            // After the first values (sent at once, off the grid) or a late tick, keep at
            // least half an interval between two events of one subscription.
            if next.duration_since(now) < subscription.interval / 2 {
                next += subscription.interval;
            }
            subscription.next_due = next;
            due.push(Due {
                id: subscription.id.clone(),
                stream: subscription.stream.clone(),
                channels: subscription.channels.clone(),
                ids: subscription.ids.clone(),
                at,
                filter: subscription.filter.clone(),
            });
        }
    }
    if due.is_empty() {
        return (due, Vec::new(), 0);
    }
    let shortest = registry.shortest();
    let count = registry.channel_ids.len();
    let mut taken = vec![false; count];
    let mut wanted = Vec::new();
    for subscription in &due {
        for &id in subscription.ids.iter() {
            let Some(seen) = taken.get_mut(id as usize) else {
                continue;
            };
            if !*seen {
                *seen = true;
                let interval = shortest
                    .get(id as usize)
                    .copied()
                    .filter(|interval| *interval != Duration::MAX)
                    .unwrap_or(Duration::from_millis(super::MIN_INTERVAL_MS));
                wanted.push(Wanted {
                    id,
                    name: registry.channel_ids.name(id).to_owned(),
                    max_age: interval * FRESH_FRACTION.0 / FRESH_FRACTION.1,
                });
            }
        }
    }
    (due, wanted, count)
}

/// The first point of `interval`'s grid from `epoch` strictly after `now`.
pub fn next_on_grid(epoch: Instant, interval: Duration, now: Instant) -> Instant {
    let since = now.saturating_duration_since(epoch).as_nanos();
    let step = interval.as_nanos().max(1);
    let steps = since / step + 1;
    epoch + Duration::from_nanos(u64::try_from(steps * step).unwrap_or(u64::MAX))
}

/// The outcome of every channel the due subscriptions name, by channel number, through the
/// station service: from the cache when fresh enough (a fraction of the shortest interval
/// any subscription asks of the channel), else from one hardware read of all the misses.
/// Channels whose read consumes data are never read, and names not in the channel list are
/// not asked for.
async fn read_channels(
    events: &Events,
    wanted: &[Wanted],
    count: usize,
    shutdown: &CancellationToken,
) -> Outcomes {
    let mut outcomes: Outcomes = (0..count).map(|_| None).collect();
    // A NumericResult channel's results come from an acquisition, never as a value: always in
    // `errors`, as the clients document.
    let table = events.station().info().channels.clone();
    let (numeric, wanted): (Vec<&Wanted>, Vec<&Wanted>) = wanted.iter().partition(|channel| {
        table
            .get(&channel.name)
            .is_some_and(|descriptor| descriptor.type_flags & NUMERIC_RESULT_FLAG != 0)
    });
    for channel in numeric {
        if let Some(slot) = outcomes.get_mut(channel.id as usize) {
            *slot = Some(Outcome::Error(numeric_result_error(&channel.name)));
        }
    }
    if wanted.is_empty() {
        return outcomes;
    }
    let names: Vec<String> = wanted.iter().map(|channel| channel.name.clone()).collect();
    let max_ages: HashMap<&str, Duration> = wanted
        .iter()
        .map(|channel| (channel.name.as_str(), channel.max_age))
        .collect();
    let max_age = |name: &str| {
        max_ages.get(name).copied().unwrap_or(
            Duration::from_millis(super::MIN_INTERVAL_MS) * FRESH_FRACTION.0 / FRESH_FRACTION.1,
        )
    };
    let policy = ReadPolicy {
        freshness: Freshness::PerChannel(&max_age),
        consuming: ConsumingRule::Refuse,
        unknown: UnknownRule::Refuse,
        caller: None,
        cancel: Some(shutdown),
        // Subscriptions never read channels whose read consumes data (`Refuse`), whoever holds
        // the lease: nothing of theirs needs a lease check.
        guard: None,
        // The access rules were checked when each subscription was made.
        who: None,
    };
    let Ok(readings) = events.station().read(&names, policy).await else {
        // Only a cache-only read or one needing the control role is refused as a whole, and
        // this policy asks for neither.
        return outcomes;
    };
    for (channel, reading) in wanted.iter().zip(readings) {
        let name = &channel.name;
        let outcome = match reading {
            Ok(reading) => Outcome::Value {
                text: reading.value.render(),
                age_ms: reading.age_ms(),
                value: reading.value,
            },
            Err(ItemError::Station(error)) => Outcome::Error(error.message),
            Err(ItemError::Link(error)) => Outcome::Error(error.to_string()),
            Err(ItemError::UnknownChannel) => Outcome::Error(format!("no such channel: {name}")),
            Err(ItemError::Consuming) => Outcome::Error(format!(
                "reading {name} consumes data; subscriptions never read it"
            )),
            // Not read: the gateway is shutting down (the event says so).
            Err(ItemError::Cancelled) => continue,
        };
        if let Some(slot) = outcomes.get_mut(channel.id as usize) {
            *slot = Some(outcome);
        }
    }
    outcomes
}

/// Why a subscription never serves a NumericResult channel.
fn numeric_result_error(name: &str) -> String {
    format!(
        "{name} is a NumericResult channel: its results come from an acquisition (api/numeric-results), never as a value"
    )
}

/// The `values` event's data for one subscription whose channels are numbered in order.
#[cfg(test)]
fn values_event(id: &str, channels: &[String], outcomes: &[Option<Outcome>]) -> String {
    let pairs = channels
        .iter()
        .enumerate()
        .map(|(number, name)| (name, Outcome::of(outcomes, number as u32)));
    values_event_with(id, &values_body(pairs))
}

/// The list one filtered subscription's decision needs, kept from one subscription to the
/// next within a tick so that thousands of them do not each allocate their own.
#[derive(Default)]
struct Scratch {
    passed: Vec<usize>,
}

/// Queues a filtered subscription's `values` event with the channels that passed its filter,
/// or nothing when none did. What went out is what the filter compares with next: a dropped
/// event (the reader is behind) leaves it as it was, so its changes go out on a later tick.
fn send_filtered(
    due: &Due,
    filter: &mut SubscriptionFilter,
    outcomes: &[Option<Outcome>],
    scratch: &mut Scratch,
) {
    let observed = |index: usize| Outcome::observed(Outcome::of(outcomes, due.ids[index]));
    let passed = &mut scratch.passed;
    passed.clear();
    passed
        .extend((0..due.ids.len()).filter(|&index| filter.passes(index, observed(index), due.at)));
    if passed.is_empty() {
        return;
    }
    let body = values_body(
        passed
            .iter()
            .map(|&index| (&due.channels[index], Outcome::of(outcomes, due.ids[index]))),
    );
    if due
        .stream
        .push("values", &values_event_with(&due.id, &body))
        == Push::Queued
    {
        for &index in passed.iter() {
            filter.sent(index, observed(index), due.at);
        }
    }
}

/// A `values` event's data from its subscription id and [`values_body`].
fn values_event_with(id: &str, body: &str) -> String {
    let id = Json::String(id.to_owned());
    format!("{{\"subscription\":{id},{body}")
}

/// Everything of a `values` event but the subscription id: `"values":…,"ageMs":…,"errors":…}`,
/// from each channel's name and outcome (`None`: not read).
fn values_body<'a>(channels: impl Iterator<Item = (&'a String, Option<&'a Outcome>)>) -> String {
    let mut values = Map::new();
    let mut ages = Map::new();
    let mut errors = Map::new();
    for (name, outcome) in channels {
        match outcome {
            Some(Outcome::Value { text, age_ms, .. }) => {
                values.insert(name.clone(), Json::String(text.clone()));
                ages.insert(name.clone(), json!(age_ms));
            }
            Some(Outcome::Error(why)) => {
                errors.insert(name.clone(), Json::String(why.clone()));
            }
            None => {
                errors.insert(name.clone(), Json::String(NOT_READ.into()));
            }
        }
    }
    let errors = if errors.is_empty() {
        Json::Null
    } else {
        Json::Object(errors)
    };
    let whole = json!({ "values": values, "ageMs": ages, "errors": errors }).to_string();
    // `{"ageMs":…}` without its opening brace, to follow the subscription id.
    whole[1..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_points_are_multiples_of_the_interval_strictly_after_now() {
        let epoch = Instant::now();
        let interval = Duration::from_millis(100);
        assert_eq!(next_on_grid(epoch, interval, epoch), epoch + interval);
        assert_eq!(
            next_on_grid(epoch, interval, epoch + Duration::from_millis(99)),
            epoch + interval
        );
        assert_eq!(
            next_on_grid(epoch, interval, epoch + interval),
            epoch + interval * 2
        );
        assert_eq!(
            next_on_grid(
                epoch,
                Duration::from_millis(250),
                epoch + Duration::from_millis(1010)
            ),
            epoch + Duration::from_millis(1250)
        );
    }

    #[test]
    fn a_values_event_names_failures_and_says_null_without_them() {
        let outcomes = vec![
            Some(Outcome::Value {
                value: Value::Integer(5),
                text: "5".into(),
                age_ms: 1.5,
            }),
            Some(Outcome::Error("timed out".into())),
        ];
        let data: Json =
            serde_json::from_str(&values_event("s1", &["A".into(), "B".into()], &outcomes))
                .unwrap();
        assert_eq!(data["subscription"], "s1");
        assert_eq!(data["values"], json!({ "A": "5" }));
        assert_eq!(data["ageMs"], json!({ "A": 1.5 }));
        assert_eq!(data["errors"], json!({ "B": "timed out" }));
        let data: Json =
            serde_json::from_str(&values_event("s1", &["A".into()], &outcomes)).unwrap();
        assert!(data["errors"].is_null());
    }

    fn float(x: f64) -> Outcome {
        Outcome::Value {
            value: Value::Float(x),
            text: x.to_string(),
            age_ms: 0.5,
        }
    }

    fn filtered_due(stream: Arc<StreamSink>, band: f64, at: Instant) -> Due {
        use crate::events::filter::ChannelFilter;
        let filter = ChannelFilter {
            deadband: Some(band),
            ..ChannelFilter::default()
        };
        Due {
            id: "s1".into(),
            stream,
            channels: vec!["A".to_owned(), "B".to_owned()].into(),
            ids: vec![0, 1].into(),
            at,
            filter: Some(Arc::new(Mutex::new(SubscriptionFilter::new(vec![
                filter, filter,
            ])))),
        }
    }

    fn send(due: &Due, outcomes: &[Option<Outcome>]) {
        let mut filter = due.filter.as_ref().unwrap().lock().unwrap();
        send_filtered(due, &mut filter, outcomes, &mut Scratch::default());
    }

    /// The data of the next queued event, if any.
    fn next_data(receiver: &mut tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Option<Json> {
        let frame = receiver.try_recv().ok()?;
        let text = String::from_utf8(frame.to_vec()).unwrap();
        let data = text
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap();
        Some(serde_json::from_str(data).unwrap())
    }

    #[tokio::test]
    async fn a_filtered_event_carries_only_what_passed_and_none_when_nothing_did() {
        let (sink, mut receiver) = StreamSink::new("stream".into(), 8);
        let due = filtered_due(sink, 1.0, Instant::now());
        let mut outcomes = vec![Some(float(1.0)), Some(float(5.0))];
        send(&due, &outcomes);
        let first = next_data(&mut receiver).expect("the first values go out");
        assert_eq!(first["values"], json!({ "A": "1", "B": "5" }));

        outcomes[0] = Some(float(1.5));
        outcomes[1] = Some(float(6.5));
        send(&due, &outcomes);
        let second = next_data(&mut receiver).expect("B moved by more than the band");
        assert_eq!(second["values"], json!({ "B": "6.5" }));
        assert_eq!(second["ageMs"], json!({ "B": 0.5 }));
        assert!(second["errors"].is_null());

        // A moved 0.5 from what was sent (1), B not at all: no event.
        send(&due, &outcomes);
        assert!(next_data(&mut receiver).is_none());

        // A read error passes whatever the band; a channel not read counts as one.
        outcomes[0] = Some(Outcome::Error("timed out".into()));
        outcomes[1] = None;
        send(&due, &outcomes);
        let third = next_data(&mut receiver).unwrap();
        assert_eq!(third["values"], json!({}));
        assert_eq!(third["errors"], json!({ "A": "timed out", "B": NOT_READ }));
    }

    #[tokio::test]
    async fn an_event_dropped_for_a_slow_reader_is_not_counted_as_sent() {
        let (sink, mut receiver) = StreamSink::new("stream".into(), 1);
        let due = filtered_due(sink.clone(), 1.0, Instant::now());
        let outcomes = vec![Some(float(1.0)), Some(float(2.0))];
        assert_eq!(sink.push("filler", "{}"), Push::Queued);
        send(&due, &outcomes); // dropped: the queue is full
        assert!(next_data(&mut receiver).is_some(), "the filler");
        send(&due, &outcomes);
        let data = next_data(&mut receiver).expect("sent again: the drop did not count");
        assert_eq!(data["values"], json!({ "A": "1", "B": "2" }));
    }
}
