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
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value as Json, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Events;
use super::sse::StreamSink;
use crate::station::{ConsumingRule, Freshness, ItemError, ReadPolicy, UnknownRule};

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
}

/// One channel's outcome in a tick.
enum Outcome {
    Value { text: String, age_ms: f64 },
    Error(String),
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
    let (due, shortest) = plan(events, now);
    if !due.is_empty() {
        let outcomes = read_channels(events, &due, &shortest, shutdown).await;
        // Subscriptions to the same channels share one serialization of their values; only
        // the subscription id differs between their events.
        let mut bodies: HashMap<&[String], String> = HashMap::new();
        for subscription in &due {
            let body = bodies
                .entry(&subscription.channels[..])
                .or_insert_with(|| values_body(&subscription.channels, &outcomes));
            let data = values_event_with(&subscription.id, body);
            let _ = subscription.stream.push("values", &data);
        }
    }
    events
        .registry()
        .subscriptions
        .values()
        .map(|subscription| subscription.next_due)
        .min()
}

/// Picks the due subscriptions and moves each to its next grid point; also gives the
/// shortest interval any live subscription asks of each channel they name.
fn plan(events: &Events, now: Instant) -> (Vec<Due>, HashMap<String, Duration>) {
    let mut registry = events.registry();
    let mut due = Vec::new();
    let mut shortest: HashMap<String, Duration> = HashMap::new();
    for subscription in registry.subscriptions.values_mut() {
        if subscription.next_due <= now {
            let mut next = next_on_grid(events.epoch, subscription.interval, now);
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
            });
        }
    }
    if due.is_empty() {
        return (due, shortest);
    }
    for subscription in registry.subscriptions.values() {
        for name in subscription.channels.iter() {
            // Look up before inserting: most names are already there, and need no clone.
            match shortest.get_mut(name.as_str()) {
                Some(interval) => *interval = (*interval).min(subscription.interval),
                None => {
                    shortest.insert(name.clone(), subscription.interval);
                }
            }
        }
    }
    (due, shortest)
}

/// The first point of `interval`'s grid from `epoch` strictly after `now`.
pub fn next_on_grid(epoch: Instant, interval: Duration, now: Instant) -> Instant {
    let since = now.saturating_duration_since(epoch).as_nanos();
    let step = interval.as_nanos().max(1);
    let steps = since / step + 1;
    epoch + Duration::from_nanos(u64::try_from(steps * step).unwrap_or(u64::MAX))
}

/// The outcome of every channel the due subscriptions name, through the station service: from
/// the cache when fresh enough (a fraction of the shortest interval any subscription asks of
/// the channel), else from one hardware read of all the misses. Channels whose read consumes
/// data are never read, and names not in the channel list are not asked for.
async fn read_channels(
    events: &Events,
    due: &[Due],
    shortest: &HashMap<String, Duration>,
    shutdown: &CancellationToken,
) -> HashMap<String, Outcome> {
    let mut names: Vec<String> = Vec::new();
    for subscription in due {
        for name in subscription.channels.iter() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    let max_age = |name: &str| {
        let interval = shortest
            .get(name)
            .copied()
            .unwrap_or(Duration::from_millis(super::MIN_INTERVAL_MS));
        interval * FRESH_FRACTION.0 / FRESH_FRACTION.1
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
        return HashMap::new();
    };
    let mut outcomes: HashMap<String, Outcome> = HashMap::with_capacity(names.len());
    for (name, reading) in names.into_iter().zip(readings) {
        let outcome = match reading {
            Ok(reading) => Outcome::Value {
                text: reading.value.render(),
                age_ms: reading.age_ms(),
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
        outcomes.insert(name, outcome);
    }
    outcomes
}

/// The `values` event's data for one subscription.
#[cfg(test)]
fn values_event(id: &str, channels: &[String], outcomes: &HashMap<String, Outcome>) -> String {
    values_event_with(id, &values_body(channels, outcomes))
}

/// A `values` event's data from its subscription id and [`values_body`].
fn values_event_with(id: &str, body: &str) -> String {
    let id = Json::String(id.to_owned());
    format!("{{\"subscription\":{id},{body}")
}

/// Everything of a `values` event but the subscription id: `"values":…,"ageMs":…,"errors":…}`.
fn values_body(channels: &[String], outcomes: &HashMap<String, Outcome>) -> String {
    let mut values = Map::new();
    let mut ages = Map::new();
    let mut errors = Map::new();
    for name in channels {
        match outcomes.get(name) {
            Some(Outcome::Value { text, age_ms }) => {
                values.insert(name.clone(), Json::String(text.clone()));
                ages.insert(name.clone(), json!(age_ms));
            }
            Some(Outcome::Error(why)) => {
                errors.insert(name.clone(), Json::String(why.clone()));
            }
            None => {
                errors.insert(
                    name.clone(),
                    Json::String("not read: the gateway is shutting down".into()),
                );
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
        let mut outcomes = HashMap::new();
        outcomes.insert(
            "A".to_owned(),
            Outcome::Value {
                text: "5".into(),
                age_ms: 1.5,
            },
        );
        outcomes.insert("B".to_owned(), Outcome::Error("timed out".into()));
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
}
