//! The one subscription scheduler: a task that wakes when a subscription is due, takes what it
//! can from the value cache, reads the rest from the hardware in one `LinkHandle::read`, and
//! queues a `values` event per due subscription without ever waiting for a reader.
//!
//! Subscriptions tick on a grid shared by all of them (multiples of their interval from
//! [`Events::grid_origin`]), so those with the same interval tick together and share one read. A
//! channel is read from the hardware only when the cache holds no value younger than
//! [`FRESH_FRACTION`] of the shortest interval any subscription asks of it; so each channel
//! is read at most about once per that interval, however many subscriptions name it, and a
//! value read by anyone else in the meantime is reused.
//!
//! Unfiltered subscriptions are timed one by one and served first: their events need no
//! decision. Filtered ones are timed by their interval's [`Beat`](super::Beat) once their first values went
//! out; a beat's tick asks its [`FilterIndex`] which (subscription, channel) pairs pass, in
//! time proportional to them, and queues an event for each subscription with any.
//!
//! A tick's values of the same channels are made once ([`TickValues`]: the outcomes and their
//! text) and offered to every stream; a stream whose reader has yet to take the subscription's
//! last values merges them (the latest value wins, `queue.rs`). Each channel's outcome is also
//! kept as its latest reading, for the snapshot a reconnecting reader may get.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::filter::Observed;
use super::filter_index::{FilterIndex, Slot};
use super::resume::Reading;
use super::sse::{Push, StreamSink};
use super::values::{NOT_READ, Outcome, TickValues, Values};
use super::{Events, Member};
use crate::numeric::NUMERIC_RESULT_FLAG;
use crate::station::{ConsumingRule, Freshness, ItemError, ReadPolicy, UnknownRule};

/// A cached value this fraction of the channel's interval old (or younger) is reused. Less
/// than 1 so that timer jitter cannot make a value read at the previous tick look fresh,
/// which would halve the read rate and double the ages.
pub const FRESH_FRACTION: (u32, u32) = (3, 4);

/// The scheduler wakes at least this often to end expired subscriptions and stuck streams.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What one tick owes one unfiltered subscription.
struct Due {
    id: Arc<str>,
    stream: Arc<StreamSink>,
    channels: Arc<[String]>,
    /// The channels' numbers (`ChannelIds`), in the same order: their outcomes' places.
    ids: Arc<[u32]>,
}

/// A filtered subscription's first values, decided off the grid at `at`.
struct Starting {
    interval: Duration,
    slot: Slot,
    id: Arc<str>,
    at: Instant,
}

/// What one tick does.
#[derive(Default)]
struct Plan {
    plain: Vec<Due>,
    starting: Vec<Starting>,
    /// The beats due, each with the grid point it is due at: a filter's intervals are counted
    /// between these, so a late tick does not move a heartbeat.
    beats: Vec<(Duration, Instant)>,
    wanted: Vec<Wanted>,
    /// How many channel numbers there are.
    count: usize,
}

impl Plan {
    fn is_empty(&self) -> bool {
        self.plain.is_empty() && self.starting.is_empty() && self.beats.is_empty()
    }
}

/// One channel a tick reads, once however many due subscriptions name it.
struct Wanted {
    id: u32,
    name: String,
    /// The oldest cached value that serves: a fraction of the shortest interval any
    /// subscription asks of the channel.
    max_age: Duration,
}

/// A tick's outcomes by channel number; `None` for a channel not read.
type Outcomes = Vec<Option<Arc<Outcome>>>;

/// A channel's outcome in a tick, by its number.
fn outcome_of(outcomes: &[Option<Arc<Outcome>>], id: u32) -> Option<&Arc<Outcome>> {
    outcomes.get(id as usize).and_then(Option::as_ref)
}

/// What the filters compare: a channel's value, or why there is none.
fn observed(outcome: Option<&Arc<Outcome>>) -> Observed<'_> {
    match outcome.map(|outcome| &**outcome) {
        Some(Outcome::Value { value, .. }) => Observed::Value(value),
        Some(Outcome::Error(why)) => Observed::Error(why),
        None => Observed::Error(NOT_READ),
    }
}

/// One tick's outcomes, with what makes its shared values: when it had them, and the outcome a
/// channel not read is given (made once a tick, when needed).
struct Tick<'a> {
    at: Instant,
    outcomes: &'a [Option<Arc<Outcome>>],
    not_read: std::cell::OnceCell<Arc<Outcome>>,
}

impl<'a> Tick<'a> {
    fn new(at: Instant, outcomes: &'a [Option<Arc<Outcome>>]) -> Tick<'a> {
        Tick {
            at,
            outcomes,
            not_read: std::cell::OnceCell::new(),
        }
    }

    /// The values of the channels `(name, number)`: an event's content, made once for every
    /// stream that sends exactly these channels this tick.
    fn values<'n>(&self, channels: impl Iterator<Item = (&'n String, u32)>) -> Arc<TickValues> {
        let channels = channels
            .map(|(name, id)| {
                let outcome = match outcome_of(self.outcomes, id) {
                    Some(outcome) => outcome.clone(),
                    None => self
                        .not_read
                        .get_or_init(|| Arc::new(Outcome::Error(NOT_READ.into())))
                        .clone(),
                };
                (Arc::from(name.as_str()), outcome)
            })
            .collect();
        Arc::new(TickValues::new(self.at, channels))
    }
}

/// Runs until `shutdown`.
pub async fn run(events: Arc<Events>, shutdown: CancellationToken) {
    // Ending expired subscriptions walks all of them: done when one may have expired, when
    // the subscriptions changed, and every SWEEP_EVERY for stuck streams; not on every tick.
    let mut sweep_at = Instant::now();
    let mut changed = true;
    loop {
        let now = Instant::now();
        if changed || now >= sweep_at {
            let next_expiry = events.sweep(now);
            sweep_at = next_expiry.map_or(now + SWEEP_EVERY, |at| at.min(now + SWEEP_EVERY));
        }
        let next_due = tick(&events, &shutdown).await;
        let wake = next_due.map_or(sweep_at, |at| at.min(sweep_at));
        changed = false;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = events.changed.notified() => changed = true,
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Serves every due subscription; returns when the next one is due.
async fn tick(events: &Events, shutdown: &CancellationToken) -> Option<Instant> {
    let now = Instant::now();
    let plan = plan(events, now);
    if !plan.is_empty() {
        let outcomes = read_channels(events, &plan.wanted, plan.count, shutdown).await;
        let tick = Tick::new(Instant::now(), &outcomes);
        keep_latest(events, &plan.wanted, &tick);
        send_plain(&plan.plain, &tick);
        let filtered_due = !(plan.starting.is_empty() && plan.beats.is_empty());
        if !plan.plain.is_empty() && filtered_due {
            // Let the streams just woken write their events before the filtered ones are
            // decided and serialized on this thread.
            tokio::task::yield_now().await;
        }
        let mut registry = events.registry();
        let mut positions = Vec::new();
        for starting in &plan.starting {
            let Some(beat) = registry.beats.get_mut(&starting.interval) else {
                continue;
            };
            // Ended or changed during the read: its slot may be another's now.
            if beat
                .index
                .meta(starting.slot)
                .is_none_or(|member| member.id != starting.id)
            {
                continue;
            }
            let observe = |id: u32| observed(outcome_of(&outcomes, id));
            beat.index
                .evaluate_member(starting.slot, starting.at, observe, &mut positions);
            send_passed(
                &mut beat.index,
                starting.slot,
                &positions,
                &tick,
                starting.at,
            );
        }
        let mut passed = Vec::new();
        for (interval, at) in &plan.beats {
            if let Some(beat) = registry.beats.get_mut(interval) {
                serve_beat(&mut beat.index, *at, &tick, &mut passed);
            }
        }
    }
    let registry = events.registry();
    let own = registry
        .own_ticks
        .iter()
        .filter_map(|id| registry.subscriptions.get(id))
        .map(|subscription| subscription.next_due);
    let beats = registry.beats.values().filter_map(|beat| beat.next);
    own.chain(beats).min()
}

/// Keeps each channel read this tick as its latest reading, for snapshots.
fn keep_latest(events: &Events, wanted: &[Wanted], tick: &Tick<'_>) {
    let generation = events.station().info().generation;
    let mut registry = events.registry();
    let latest = &mut registry.latest;
    for channel in wanted {
        let Some(outcome) = outcome_of(tick.outcomes, channel.id) else {
            continue;
        };
        let at = channel.id as usize;
        if latest.len() <= at {
            latest.resize(at + 1, None);
        }
        latest[at] = Some(Reading {
            outcome: outcome.clone(),
            at: tick.at,
            generation,
        });
    }
}

/// Offers every due unfiltered subscription its values. Subscriptions to the same channels
/// share one [`TickValues`] (outcomes and text); only the subscription id differs.
fn send_plain(due: &[Due], tick: &Tick<'_>) {
    let mut shared: HashMap<&[u32], Values> = HashMap::new();
    for subscription in due {
        let values = shared.entry(&subscription.ids[..]).or_insert_with(|| {
            Values::Tick(
                tick.values(
                    subscription
                        .channels
                        .iter()
                        .zip(subscription.ids.iter().copied()),
                ),
            )
        });
        let _ = subscription
            .stream
            .push_values(&subscription.id, values.clone());
    }
}

/// A beat's tick at grid point `at`: asks the index what passes and offers each
/// subscription's values as soon as its channels are known.
fn serve_beat(
    index: &mut FilterIndex<Member>,
    at: Instant,
    tick: &Tick<'_>,
    passed: &mut Vec<(Slot, u32)>,
) {
    let observe = |id: u32| observed(outcome_of(tick.outcomes, id));
    index.evaluate(at, observe, passed);
    let mut positions = Vec::new();
    // Subscriptions through which the same channels passed share one serialization (a text
    // that changed passes for every subscriber of it in the same tick).
    let mut shared: HashMap<Vec<u32>, Values> = HashMap::new();
    let mut key = Vec::new();
    for member in passed.chunk_by(|a, b| a.0 == b.0) {
        positions.clear();
        positions.extend(member.iter().map(|&(_, position)| position));
        let slot = member[0].0;
        let Some(meta) = index.meta(slot) else {
            continue;
        };
        key.clear();
        key.extend(
            positions
                .iter()
                .map(|&position| meta.ids[position as usize]),
        );
        if !shared.contains_key(&key) {
            let values = Values::Tick(tick.values(passed_channels(meta, &positions)));
            shared.insert(key.clone(), values);
        }
        let pushed = meta.stream.push_values(&meta.id, shared[&key].clone());
        if counts_as_sent(pushed) {
            index.sent(slot, &positions, observe, at);
        }
    }
}

/// Values offered that the reader will get: queued, or merged into its waiting values (it
/// gets the newest then), so the filter compares the next ones with them.
fn counts_as_sent(pushed: Push) -> bool {
    matches!(pushed, Push::Queued | Push::Merged)
}

/// The names and numbers of a filtered subscription's channels at `positions`.
fn passed_channels<'a>(
    member: &'a Member,
    positions: &'a [u32],
) -> impl Iterator<Item = (&'a String, u32)> + 'a {
    positions.iter().map(|&position| {
        let position = position as usize;
        (&member.channels[position], member.ids[position])
    })
}

/// Offers a filtered subscription's values of the channels at `positions`, or nothing when
/// there are none. What the reader will get is what the filter compares with next; values
/// offered to a stream that has closed leave it as it was.
fn send_passed(
    index: &mut FilterIndex<Member>,
    slot: Slot,
    positions: &[u32],
    tick: &Tick<'_>,
    at: Instant,
) {
    let Some(member) = index.meta(slot) else {
        return;
    };
    if positions.is_empty() {
        return;
    }
    let values = Values::Tick(tick.values(passed_channels(member, positions)));
    let pushed = member.stream.push_values(&member.id, values);
    if counts_as_sent(pushed) {
        let observe = |id: u32| observed(outcome_of(tick.outcomes, id));
        index.sent(slot, positions, observe, at);
    }
}

/// The next grid point of `interval` for a subscription served at `now`: after the first
/// values (sent at once, off the grid) or a late tick, at least half an interval away.
fn next_point(epoch: Instant, interval: Duration, now: Instant) -> Instant {
    let mut next = next_on_grid(epoch, interval, now);
    if next.duration_since(now) < interval / 2 {
        next += interval;
    }
    next
}

/// Picks the due subscriptions and beats and moves each to its next grid point; a filtered
/// subscription whose first values are due joins its beat from the point it would tick at
/// next. Also gives every channel they name, once, with the cache age it accepts.
fn plan(events: &Events, now: Instant) -> Plan {
    let mut registry = events.registry();
    let registry = &mut *registry;
    let mut plan = Plan::default();
    // The next grid point of each interval in use, worked out once per interval per tick.
    let mut grid: Vec<(Duration, Instant)> = Vec::new();
    let mut next_of = |interval: Duration| match grid.iter().find(|(of, _)| *of == interval) {
        Some((_, point)) => *point,
        None => {
            let point = next_point(events.grid_origin, interval, now);
            grid.push((interval, point));
            point
        }
    };
    let mut named: Vec<u32> = Vec::new();
    let mut joined = Vec::new();
    for id in &registry.own_ticks {
        let Some(subscription) = registry.subscriptions.get_mut(id) else {
            continue;
        };
        if subscription.next_due > now {
            continue;
        }
        let at = subscription.next_due;
        let next = next_of(subscription.interval);
        named.extend(subscription.ids.iter());
        match &subscription.filtered {
            None => {
                subscription.next_due = next;
                plan.plain.push(Due {
                    id: subscription.id.clone(),
                    stream: subscription.stream.clone(),
                    channels: subscription.channels.clone(),
                    ids: subscription.ids.clone(),
                });
            }
            Some(filtered) => {
                plan.starting.push(Starting {
                    interval: subscription.interval,
                    slot: filtered.slot,
                    id: subscription.id.clone(),
                    at,
                });
                if let Some(beat) = registry.beats.get_mut(&subscription.interval) {
                    beat.index.join(filtered.slot, next);
                    beat.next = Some(beat.next.map_or(next, |point| point.min(next)));
                }
                joined.push(id.clone());
            }
        }
    }
    for id in &joined {
        registry.own_ticks.remove(id);
    }
    let mut channels = Vec::new();
    for (&interval, beat) in registry.beats.iter_mut() {
        let Some(at) = beat.next.filter(|at| *at <= now) else {
            continue;
        };
        beat.next = Some(next_of(interval));
        beat.index.channels_due(at, &mut channels);
        named.extend(&channels);
        plan.beats.push((interval, at));
    }
    if plan.is_empty() {
        return plan;
    }
    let shortest = registry.shortest();
    let count = registry.channel_ids.len();
    let mut taken = vec![false; count];
    for id in named {
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
            plan.wanted.push(Wanted {
                id,
                name: registry.channel_ids.name(id).to_owned(),
                max_age: interval * FRESH_FRACTION.0 / FRESH_FRACTION.1,
            });
        }
    }
    plan.count = count;
    plan
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
    // `errors`.
    let table = events.station().info().channels.clone();
    let (numeric, wanted): (Vec<&Wanted>, Vec<&Wanted>) = wanted.iter().partition(|channel| {
        table
            .get(&channel.name)
            .is_some_and(|descriptor| descriptor.type_flags & NUMERIC_RESULT_FLAG != 0)
    });
    for channel in numeric {
        if let Some(slot) = outcomes.get_mut(channel.id as usize) {
            *slot = Some(Arc::new(Outcome::Error(numeric_result_error(
                &channel.name,
            ))));
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
            *slot = Some(Arc::new(outcome));
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value as Json, json};
    use station_protocol::Value;

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

    fn float(x: f64) -> Option<Arc<Outcome>> {
        Some(Arc::new(Outcome::Value {
            value: Value::Float(x),
            text: x.to_string(),
            age_ms: 0.5,
        }))
    }

    fn error(why: &str) -> Option<Arc<Outcome>> {
        Some(Arc::new(Outcome::Error(why.into())))
    }

    fn sink() -> (Arc<StreamSink>, super::super::sse::StreamReceiver) {
        let shape = super::super::sse::StreamShape {
            epoch: 4000,
            slot: 1,
            event_limit: 8,
            replay: 8,
        };
        StreamSink::new("stream".into(), shape)
    }

    /// A beat with one filtered subscription over channels A and B (numbers 0 and 1), joined
    /// from `at`.
    fn filtered_beat(
        stream: Arc<StreamSink>,
        band: f64,
        at: Instant,
    ) -> (FilterIndex<Member>, Slot) {
        use crate::events::filter::ChannelFilter;
        let filter = ChannelFilter {
            deadband: Some(band),
            ..ChannelFilter::default()
        };
        let mut index = FilterIndex::default();
        let member = Member {
            id: "s1".into(),
            stream,
            channels: vec!["A".to_owned(), "B".to_owned()].into(),
            ids: vec![0, 1].into(),
        };
        let slot = index.add(member, &[0, 1], &[filter, filter]);
        index.join(slot, at);
        (index, slot)
    }

    fn send(index: &mut FilterIndex<Member>, at: Instant, outcomes: &[Option<Arc<Outcome>>]) {
        serve_beat(index, at, &Tick::new(at, outcomes), &mut Vec::new());
    }

    /// The data of the next queued event, if any.
    fn next_data(receiver: &mut super::super::sse::StreamReceiver) -> Option<Json> {
        let frame = receiver.try_recv()?;
        let text = String::from_utf8(frame.to_vec()).unwrap();
        let data = text
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap();
        Some(serde_json::from_str(data).unwrap())
    }

    #[tokio::test]
    async fn subscriptions_to_the_same_channels_share_one_ticks_values_and_name_failures() {
        let (first, mut first_receiver) = sink();
        let (second, mut second_receiver) = sink();
        let due = |id: &str, stream: &Arc<StreamSink>| Due {
            id: id.into(),
            stream: stream.clone(),
            channels: vec!["A".to_owned(), "B".to_owned()].into(),
            ids: vec![0, 1].into(),
        };
        // B not read: the gateway is shutting down.
        let outcomes = vec![float(5.0), None];
        send_plain(
            &[due("s1", &first), due("s2", &second)],
            &Tick::new(Instant::now(), &outcomes),
        );
        let one = next_data(&mut first_receiver).unwrap();
        let two = next_data(&mut second_receiver).unwrap();
        assert_eq!(one["subscription"], "s1");
        assert_eq!(two["subscription"], "s2");
        assert_eq!(one["values"], json!({ "A": "5" }));
        assert_eq!(one["ageMs"], json!({ "A": 0.5 }));
        assert_eq!(one["errors"], json!({ "B": NOT_READ }));
        assert_eq!(one["values"], two["values"]);
    }

    #[tokio::test]
    async fn a_filtered_event_carries_only_what_passed_and_none_when_nothing_did() {
        let (sink, mut receiver) = sink();
        let t0 = Instant::now();
        let tick = |k: u32| t0 + Duration::from_millis(100) * k;
        let (mut index, _) = filtered_beat(sink, 1.0, t0);
        let mut outcomes = vec![float(1.0), float(5.0)];
        send(&mut index, tick(0), &outcomes);
        let first = next_data(&mut receiver).expect("the first values go out");
        assert_eq!(first["values"], json!({ "A": "1", "B": "5" }));

        outcomes[0] = float(1.5);
        outcomes[1] = float(6.5);
        send(&mut index, tick(1), &outcomes);
        let second = next_data(&mut receiver).expect("B moved by more than the band");
        assert_eq!(second["values"], json!({ "B": "6.5" }));
        assert_eq!(second["ageMs"], json!({ "B": 0.5 }));
        assert!(second["errors"].is_null());

        // A moved 0.5 from what was sent (1), B not at all: no event.
        send(&mut index, tick(2), &outcomes);
        assert!(next_data(&mut receiver).is_none());

        // A read error passes whatever the band; a channel not read counts as one.
        outcomes[0] = error("timed out");
        outcomes[1] = None;
        send(&mut index, tick(3), &outcomes);
        let third = next_data(&mut receiver).unwrap();
        assert_eq!(third["values"], json!({}));
        assert_eq!(third["errors"], json!({ "A": "timed out", "B": NOT_READ }));
    }

    /// A reader behind: what passes the deadband merges into its values still waiting, so
    /// the last change of a channel is never lost (nothing may come after it until the value
    /// moves again), and it counts as sent, since the reader will get it.
    #[tokio::test]
    async fn a_change_offered_to_a_reader_behind_merges_and_its_last_change_is_never_lost() {
        let (sink, mut receiver) = sink();
        let t0 = Instant::now();
        let tick = |k: u32| t0 + Duration::from_millis(100) * k;
        let (mut index, _) = filtered_beat(sink.clone(), 1.0, t0);
        send(&mut index, tick(0), &[float(1.0), float(2.0)]);
        send(&mut index, tick(1), &[float(1.2), float(4.0)]);
        send(&mut index, tick(2), &[float(3.0), float(4.1)]);
        // The reader takes its values now: one event, each channel's newest that passed.
        let data = next_data(&mut receiver).expect("the merged values");
        assert_eq!(data["values"], json!({ "A": "3", "B": "4" }));
        assert!(next_data(&mut receiver).is_none(), "one event, not three");
        assert!(sink.merged() >= 2);
        // What the reader got is what the filter compares with: B at 4.1 is within the band.
        send(&mut index, tick(3), &[float(3.0), float(4.1)]);
        assert!(next_data(&mut receiver).is_none());
    }

    #[tokio::test]
    async fn a_subscription_is_not_served_by_its_beat_before_the_point_it_joined_from() {
        let (sink, mut receiver) = sink();
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(200);
        let (mut index, slot) = filtered_beat(sink, 1.0, later);
        let outcomes = vec![float(1.0), float(2.0)];
        send(&mut index, t0 + Duration::from_millis(100), &outcomes);
        assert!(next_data(&mut receiver).is_none(), "not due yet");
        // Its first values, off the grid, decided one by one.
        let mut positions = Vec::new();
        let observe = |id: u32| observed(outcome_of(&outcomes, id));
        index.evaluate_member(slot, t0, observe, &mut positions);
        assert_eq!(positions, [0, 1]);
        send(&mut index, later, &outcomes);
        assert!(next_data(&mut receiver).is_some(), "due from its point on");
    }
}
