//! A `values` event's content: each channel's outcome in a tick (a value with its age, or why
//! there is none), one tick's values shared by every subscription that sends the same
//! channels ([`TickValues`], serialized once), and the values of a subscription merged for a
//! reader that fell behind ([`Values::Merged`], serialized when the reader takes them, with
//! each value's age at that moment). Pure: every time is passed in.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value as Json, json};
use station_protocol::Value;
use tokio::time::Instant;

use super::queue::Merge;

/// What a channel not read in a tick is said to be.
pub const NOT_READ: &str = "not read: the gateway is shutting down";

/// One channel's outcome in a tick.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Value {
        value: Value,
        text: String,
        /// Its age when the tick had it, in ms (0.1 ms precision).
        age_ms: f64,
    },
    Error(String),
}

/// One channel's outcome as a stream carries it: its name (as subscribed), the outcome, and
/// when the tick had it (its age grows from there).
#[derive(Debug, Clone)]
pub struct Latest {
    pub name: Arc<str>,
    pub outcome: Arc<Outcome>,
    pub at: Instant,
}

/// One tick's values of some channels, shared by every subscription whose event carries
/// exactly these channels in that tick.
#[derive(Debug)]
pub struct TickValues {
    /// When the tick had the outcomes.
    pub at: Instant,
    pub channels: Box<[(Arc<str>, Arc<Outcome>)]>,
    /// `"values":…,"ageMs":…,"errors":…}` and the event's end, written once for every stream.
    pub tail: Bytes,
}

impl TickValues {
    pub fn new(at: Instant, channels: Box<[(Arc<str>, Arc<Outcome>)]>) -> TickValues {
        let body = values_body(
            channels
                .iter()
                .map(|(name, outcome)| (&**name, &**outcome, 0.0)),
        );
        TickValues {
            at,
            channels,
            tail: event_tail(body),
        }
    }
}

/// A subscription's values waiting in a stream's queue.
#[derive(Debug, Clone)]
pub enum Values {
    /// As one tick made them.
    Tick(Arc<TickValues>),
    /// Several ticks' merged: each channel's latest.
    Merged(Vec<Latest>),
}

impl Values {
    /// Each channel's latest, in order.
    fn into_latest(self) -> Vec<Latest> {
        match self {
            Values::Merged(latest) => latest,
            Values::Tick(tick) => tick
                .channels
                .iter()
                .map(|(name, outcome)| Latest {
                    name: name.clone(),
                    outcome: outcome.clone(),
                    at: tick.at,
                })
                .collect(),
        }
    }

    /// The event's data after its subscription (`"values":…}`) and its end, as the reader
    /// takes it at `now`: a tick's shared text as it is, merged values with their ages now.
    pub fn tail_at(&self, now: Instant) -> Bytes {
        match self {
            Values::Tick(tick) => tick.tail.clone(),
            Values::Merged(latest) => {
                event_tail(values_body(latest.iter().map(|latest| {
                    (&*latest.name, &*latest.outcome, ms_between(latest.at, now))
                })))
            }
        }
    }
}

impl Merge for Values {
    fn merge(&mut self, newer: Values) {
        let mut merged = std::mem::replace(self, Values::Merged(Vec::new())).into_latest();
        for latest in newer.into_latest() {
            match merged
                .iter_mut()
                .find(|older| Arc::ptr_eq(&older.name, &latest.name) || older.name == latest.name)
            {
                Some(older) => *older = latest,
                None => merged.push(latest),
            }
        }
        *self = Values::Merged(merged);
    }
}

/// Milliseconds from `from` to `to` (0 when `to` is earlier), at 0.1 ms precision.
pub fn ms_between(from: Instant, to: Instant) -> f64 {
    (to.saturating_duration_since(from).as_secs_f64() * 10_000.0).round() / 10.0
}

/// The start of a `values` event's data, up to what [`values_body`] writes: its subscription.
pub fn values_event_head(subscription: &str) -> String {
    let id = Json::String(subscription.to_owned());
    format!("{{\"subscription\":{id},")
}

/// The text that ends an event after its own part: `body` and the event's end.
pub fn event_tail(body: String) -> Bytes {
    let mut tail = body.into_bytes();
    tail.extend_from_slice(b"\n\n");
    Bytes::from(tail)
}

/// Everything of a `values` event but the subscription id: `"values":…,"ageMs":…,"errors":…}`,
/// from each channel's name, outcome, and the time that passed since the outcome (added to
/// its age).
pub fn values_body<'a>(channels: impl Iterator<Item = (&'a str, &'a Outcome, f64)>) -> String {
    let (values, ages, errors) = value_maps(channels);
    let whole = json!({ "values": values, "ageMs": ages, "errors": errors }).to_string();
    // `{"ageMs":…}` without its opening brace, to follow the subscription id.
    whole[1..].to_owned()
}

/// The `values`, `ageMs` and `errors` (null when empty) of a `values` event or a snapshot.
pub fn value_maps<'a>(
    channels: impl Iterator<Item = (&'a str, &'a Outcome, f64)>,
) -> (Json, Json, Json) {
    let mut values = Map::new();
    let mut ages = Map::new();
    let mut errors = Map::new();
    for (name, outcome, since_ms) in channels {
        match outcome {
            Outcome::Value { text, age_ms, .. } => {
                values.insert(name.to_owned(), Json::String(text.clone()));
                let age = ((age_ms + since_ms) * 10.0).round() / 10.0;
                ages.insert(name.to_owned(), json!(age));
            }
            Outcome::Error(why) => {
                errors.insert(name.to_owned(), Json::String(why.clone()));
            }
        }
    }
    let errors = if errors.is_empty() {
        Json::Null
    } else {
        Json::Object(errors)
    };
    (Json::Object(values), Json::Object(ages), errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn value(x: i64, age_ms: f64) -> Arc<Outcome> {
        Arc::new(Outcome::Value {
            value: Value::Integer(x),
            text: x.to_string(),
            age_ms,
        })
    }

    fn tick(at: Instant, channels: &[(&str, Arc<Outcome>)]) -> Values {
        Values::Tick(Arc::new(TickValues::new(
            at,
            channels
                .iter()
                .map(|(name, outcome)| (Arc::from(*name), outcome.clone()))
                .collect(),
        )))
    }

    fn data(tail: &Bytes) -> Json {
        let text = std::str::from_utf8(tail).unwrap();
        assert!(text.ends_with("}\n\n"), "{text}");
        serde_json::from_str(&format!("{{{}", text.trim_end())).unwrap()
    }

    #[test]
    fn a_ticks_values_go_out_as_written_once() {
        let t0 = Instant::now();
        let values = tick(
            t0,
            &[
                ("A", value(5, 1.5)),
                ("B", Arc::new(Outcome::Error("timed out".into()))),
            ],
        );
        let later = t0 + Duration::from_millis(40);
        assert_eq!(
            data(&values.tail_at(later)),
            json!({ "values": {"A": "5"}, "ageMs": {"A": 1.5}, "errors": {"B": "timed out"} })
        );
    }

    #[test]
    fn merged_values_keep_each_channels_newest_with_its_age_when_taken() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut waiting = tick(ms(0), &[("A", value(1, 2.0)), ("B", value(10, 3.0))]);
        // A deadband subscription's next event: only A moved.
        waiting.merge(tick(ms(100), &[("A", value(2, 2.5))]));
        waiting.merge(tick(
            ms(200),
            &[("C", Arc::new(Outcome::Error("gone".into())))],
        ));
        let taken = data(&waiting.tail_at(ms(1_000)));
        assert_eq!(taken["values"], json!({ "A": "2", "B": "10" }));
        // Ages at the moment the reader takes them: read age + time since the tick.
        assert_eq!(taken["ageMs"], json!({ "A": 902.5, "B": 1003.0 }));
        assert_eq!(taken["errors"], json!({ "C": "gone" }));
    }

    #[test]
    fn an_error_replaces_a_value_and_a_value_an_error() {
        let t0 = Instant::now();
        let mut waiting = tick(t0, &[("A", value(1, 0.0))]);
        waiting.merge(tick(
            t0,
            &[("A", Arc::new(Outcome::Error("link down".into())))],
        ));
        let taken = data(&waiting.tail_at(t0));
        assert_eq!(taken["values"], json!({}));
        assert_eq!(taken["errors"], json!({ "A": "link down" }));
        waiting.merge(tick(t0, &[("A", value(3, 0.0))]));
        let taken = data(&waiting.tail_at(t0));
        assert_eq!(taken["values"], json!({ "A": "3" }));
        assert!(taken["errors"].is_null());
    }

    #[test]
    fn the_head_names_the_subscription_as_json() {
        assert_eq!(values_event_head("s\"1"), "{\"subscription\":\"s\\\"1\",");
        assert_eq!(
            ms_between(Instant::now() + Duration::from_secs(1), Instant::now()),
            0.0
        );
    }
}
