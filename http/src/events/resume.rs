//! What a reader that reconnects with `Last-Event-ID` is told when it cannot be given every
//! event it missed: one `gap` event (why, and the ids lost) and then a `snapshot` (the current
//! value, age and quality of every channel its stream subscribes to, the control lease and the
//! station link), so that it is right again at once and never shows an old value as current.
//! Also the `hello` that starts a stream, new or resumed. Pure: every time is passed in.

use std::sync::Arc;

use serde_json::{Value as Json, json};
use tokio::time::Instant;

use super::event_id::EventId;
use super::values::{Outcome, ms_between};
use crate::lease::LeaseView;

/// Why a reconnecting reader is not given every event it missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapReason {
    /// Its id is of another epoch: the gateway restarted (or another one took over) since.
    Restart,
    /// Its stream has ended: not resumed within `events.resume_grace_ms`, closed as stuck or
    /// behind, or made room for a new stream at `events.max_streams`.
    Ended,
    /// Its stream lives, but the replay buffer (`events.replay_events`) no longer reaches back
    /// to the event after its id.
    Buffer,
    /// Its id is not of an event its stream sent (or the stream was opened by someone else).
    Unknown,
}

impl GapReason {
    pub fn label(self) -> &'static str {
        match self {
            GapReason::Restart => "restart",
            GapReason::Ended => "ended",
            GapReason::Buffer => "buffer",
            GapReason::Unknown => "unknown",
        }
    }

    fn message(self) -> &'static str {
        match self {
            GapReason::Restart => {
                "the gateway restarted since that event: its events and subscriptions before the restart are gone; this is a new stream (subscribe again), the snapshot is the state now"
            }
            GapReason::Ended => {
                "that event's stream has ended (not resumed within events.resume_grace_ms, or closed): this is a new stream (subscribe again), the snapshot is the state now"
            }
            GapReason::Buffer => {
                "the events after that one are no longer kept (events.replay_events): the snapshot replaces them; the stream and its subscriptions go on"
            }
            GapReason::Unknown => {
                "that id is not of an event this stream sent: this is a new stream (subscribe again), the snapshot is the state now"
            }
        }
    }

    /// Whether the reader's stream and its subscriptions go on.
    pub fn keeps_subscriptions(self) -> bool {
        self == GapReason::Buffer
    }
}

/// The `gap` event's data: why, the id the reader sent, and the ids lost (`from` the one after
/// it; `to` and `lost` only when known: the stream lives). Ids are strings: they are above
/// what a JavaScript number holds exactly.
pub fn gap_data(reason: GapReason, last_seen: EventId, lost_to: Option<EventId>) -> String {
    let from = EventId::of_number(last_seen.number().saturating_add(1));
    let lost = lost_to.map(|to| to.number().saturating_sub(last_seen.number()));
    json!({
        "reason": reason.label(),
        "message": reason.message(),
        "lastEventId": last_seen.to_string(),
        "from": from.to_string(),
        "to": lost_to.map(|to| to.to_string()),
        "lost": lost,
        "subscriptions": if reason.keeps_subscriptions() { "kept" } else { "ended" },
    })
    .to_string()
}

/// A channel's last outcome as the scheduler had it: for snapshots.
#[derive(Debug, Clone)]
pub struct Reading {
    pub outcome: Arc<Outcome>,
    /// When the tick had it.
    pub at: Instant,
    /// The link generation it was read under.
    pub generation: u64,
}

/// How far a snapshot's value can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quality {
    /// Read under the link's current connection, which is up: the value is the station's
    /// (as of its age).
    Good,
    /// Read before the link went down or reconnected: the station's value may differ now.
    Stale,
    /// No value: its read failed, or nothing was read yet (`errors` says which).
    Bad,
}

impl Quality {
    pub fn of(reading: Option<&Reading>, connected: bool, generation: u64) -> Quality {
        match reading {
            Some(reading) if matches!(*reading.outcome, Outcome::Value { .. }) => {
                if connected && reading.generation == generation {
                    Quality::Good
                } else {
                    Quality::Stale
                }
            }
            _ => Quality::Bad,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Quality::Good => "good",
            Quality::Stale => "stale",
            Quality::Bad => "bad",
        }
    }
}

/// What a channel with no reading yet is said to be.
pub const NOT_READ_YET: &str =
    "not read yet: the subscription's first values are on their way as a values event";

/// One subscription's part of a snapshot: `values`, `ageMs` (the age now), `quality` and
/// `errors` of each of its channels (name as subscribed, and its last reading if any).
pub fn subscription_snapshot<'a>(
    subscription: &str,
    channels: impl Iterator<Item = (&'a str, Option<&'a Reading>)>,
    link: (bool, u64),
    now: Instant,
) -> Json {
    let (connected, generation) = link;
    let not_read = Outcome::Error(NOT_READ_YET.to_owned());
    let mut qualities = serde_json::Map::new();
    let mut outcomes: Vec<(&str, &Outcome, f64)> = Vec::new();
    for (name, reading) in channels {
        let quality = Quality::of(reading, connected, generation);
        qualities.insert(name.to_owned(), Json::String(quality.label().to_owned()));
        match reading {
            Some(reading) => outcomes.push((name, &reading.outcome, ms_between(reading.at, now))),
            None => outcomes.push((name, &not_read, 0.0)),
        }
    }
    let (values, ages, errors) = super::values::value_maps(outcomes.into_iter());
    json!({
        "subscription": subscription,
        "values": values,
        "ageMs": ages,
        "quality": qualities,
        "errors": errors,
    })
}

/// The `snapshot` event's data.
pub fn snapshot_data(
    subscriptions: Vec<Json>,
    lease: &LeaseView,
    connected: bool,
    generation: u64,
    last_error: Option<&str>,
) -> String {
    json!({
        "subscriptions": subscriptions,
        "lease": lease,
        "connection": {
            "isConnected": connected,
            "generation": generation,
            "lastError": last_error,
        },
    })
    .to_string()
}

/// The `hello` event's data; `resumed` when it starts again a stream the reader had.
pub fn hello_data(connected: bool, generation: u64, stream_id: &str, resumed: bool) -> String {
    json!({
        "isConnected": connected,
        "generation": generation,
        "apiVersion": crate::api_version::API_VERSION,
        "streamId": stream_id,
        "resumed": resumed,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use station_protocol::Value;
    use std::time::Duration;

    fn reading(x: i64, at: Instant, generation: u64) -> Reading {
        Reading {
            outcome: Arc::new(Outcome::Value {
                value: Value::Integer(x),
                text: x.to_string(),
                age_ms: 2.0,
            }),
            at,
            generation,
        }
    }

    #[test]
    fn a_gap_names_its_reason_and_the_ids_lost_as_strings() {
        let seen = EventId::new(4000, 3, 10);
        let data: Json = serde_json::from_str(&gap_data(
            GapReason::Buffer,
            seen,
            Some(EventId::new(4000, 3, 25)),
        ))
        .unwrap();
        assert_eq!(data["reason"], "buffer");
        assert_eq!(data["lastEventId"], "4000000030000000010");
        assert_eq!(data["from"], "4000000030000000011");
        assert_eq!(data["to"], "4000000030000000025");
        assert_eq!(data["lost"], 15);
        assert_eq!(data["subscriptions"], "kept");
        let data: Json = serde_json::from_str(&gap_data(GapReason::Restart, seen, None)).unwrap();
        assert_eq!(data["reason"], "restart");
        assert!(data["to"].is_null() && data["lost"].is_null(), "{data}");
        assert_eq!(data["subscriptions"], "ended");
        assert!(data["message"].as_str().unwrap().contains("restarted"));
    }

    #[test]
    fn a_snapshot_gives_each_channels_value_age_now_and_quality() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_millis(500);
        let fresh = reading(5, t0, 3);
        let old = reading(7, t0, 2);
        let failed = Reading {
            outcome: Arc::new(Outcome::Error("timed out".into())),
            at: t0,
            generation: 3,
        };
        let part = subscription_snapshot(
            "s1",
            [
                ("A", Some(&fresh)),
                ("B", Some(&old)),
                ("C", Some(&failed)),
                ("D", None),
            ]
            .into_iter(),
            (true, 3),
            now,
        );
        assert_eq!(part["subscription"], "s1");
        assert_eq!(part["values"], json!({ "A": "5", "B": "7" }));
        assert_eq!(part["ageMs"], json!({ "A": 502.0, "B": 502.0 }));
        assert_eq!(
            part["quality"],
            json!({ "A": "good", "B": "stale", "C": "bad", "D": "bad" })
        );
        assert_eq!(part["errors"]["C"], "timed out");
        assert_eq!(part["errors"]["D"], NOT_READ_YET);
        // With the link down, no value is good.
        let down = subscription_snapshot("s1", [("A", Some(&fresh))].into_iter(), (false, 3), now);
        assert_eq!(down["quality"]["A"], "stale");
    }

    #[test]
    fn the_snapshot_carries_the_lease_and_the_link_and_hello_says_resumed() {
        let data: Json = serde_json::from_str(&snapshot_data(
            vec![],
            &LeaseView::nobody(),
            false,
            4,
            Some("refused"),
        ))
        .unwrap();
        assert_eq!(data["lease"]["held"], false);
        assert_eq!(
            data["connection"],
            json!({ "isConnected": false, "generation": 4, "lastError": "refused" })
        );
        let hello: Json = serde_json::from_str(&hello_data(true, 4, "abc", true)).unwrap();
        assert_eq!(hello["streamId"], "abc");
        assert_eq!(hello["resumed"], true);
        assert!(hello["apiVersion"].is_u64());
    }
}
