//! A stream's queue of events not yet taken by its reader, where the latest value wins: a
//! subscription's values offered while its earlier values still wait are merged into them
//! (each channel's newest replaces the one before) and the merged event moves to the back, so
//! a reader that falls behind holds at most one values event per subscription, whatever the
//! time it is behind, and what it reads next is the newest of every channel. Other events
//! (`lease`, `connection`, `configuration`, `numeric-result`, ...) are never merged or
//! dropped: past `event_limit` of them the queue refuses the next ([`Overflow`]) and the stream
//! is closed with a last event saying so. It also keeps how long something has waited without
//! the reader taking anything, for closing a reader that is stuck. Pure: every time is passed
//! in.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Values that a newer offer for the same subscription merges into.
pub trait Merge {
    /// Takes `newer`'s channels over this one's (each channel's newest wins).
    fn merge(&mut self, newer: Self);
}

/// One queued item: an event delivered as it is, or a subscription's values.
#[derive(Debug, PartialEq)]
pub enum Queued<E, V> {
    Event(E),
    Values { subscription: Arc<str>, values: V },
}

/// What became of values offered to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// Queued at the back.
    Queued,
    /// Merged into the subscription's values that were still waiting (now at the back).
    Merged,
}

/// The queue already holds `event_limit` events that are never dropped: the reader cannot
/// keep up even with values merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

#[derive(Debug)]
pub struct StreamQueue<E, V> {
    items: VecDeque<Queued<E, V>>,
    /// How many of `items` are events (not values).
    events: usize,
    event_limit: usize,
    /// Since when something has waited without the reader taking anything.
    waiting_since: Option<Instant>,
    /// Values merged so far (each one an intermediate value the reader never needed).
    merged: u64,
}

impl<E, V: Merge> StreamQueue<E, V> {
    pub fn new(event_limit: usize) -> StreamQueue<E, V> {
        StreamQueue {
            items: VecDeque::new(),
            events: 0,
            event_limit: event_limit.max(1),
            waiting_since: None,
            merged: 0,
        }
    }

    /// Queues an event at the back, unless `event_limit` events wait already.
    pub fn push_event(&mut self, event: E, now: Instant) -> Result<(), Overflow> {
        if self.events >= self.event_limit {
            return Err(Overflow);
        }
        self.events += 1;
        self.items.push_back(Queued::Event(event));
        self.waiting_since.get_or_insert(now);
        Ok(())
    }

    /// Queues an event whatever the limit: the few a stream's own state asks for (its `gap`
    /// and snapshot after a reconnect, its last event before it closes), after a `clear`.
    pub fn push_event_anyway(&mut self, event: E, now: Instant) {
        self.events += 1;
        self.items.push_back(Queued::Event(event));
        self.waiting_since.get_or_insert(now);
    }

    /// Offers `subscription`'s values: merged into its values still waiting, if any.
    pub fn push_values(&mut self, subscription: &Arc<str>, values: V, now: Instant) -> Offered {
        self.waiting_since.get_or_insert(now);
        let waiting = self.items.iter().position(|item| match item {
            Queued::Values {
                subscription: queued,
                ..
            } => Arc::ptr_eq(queued, subscription) || queued == subscription,
            Queued::Event(_) => false,
        });
        let Some(at) = waiting else {
            self.items.push_back(Queued::Values {
                subscription: subscription.clone(),
                values,
            });
            return Offered::Queued;
        };
        let mut item = self.items.remove(at).expect("found just now");
        if let Queued::Values { values: older, .. } = &mut item {
            older.merge(values);
        }
        self.items.push_back(item);
        self.merged += 1;
        Offered::Merged
    }

    /// The next item for the reader: its taking anything counts as progress.
    pub fn pop(&mut self, now: Instant) -> Option<Queued<E, V>> {
        let item = self.items.pop_front()?;
        if matches!(item, Queued::Event(_)) {
            self.events -= 1;
        }
        self.waiting_since = (!self.items.is_empty()).then_some(now);
        Some(item)
    }

    /// How long something has waited without the reader taking anything; `None` when nothing
    /// waits.
    pub fn waiting_for(&self, now: Instant) -> Option<Duration> {
        self.waiting_since
            .map(|since| now.saturating_duration_since(since))
    }

    /// Forgets everything queued (a snapshot or a last event replaces it).
    pub fn clear(&mut self) {
        self.items.clear();
        self.events = 0;
        self.waiting_since = None;
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Values merged so far.
    pub fn merged(&self) -> u64 {
        self.merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Channel → value: the newest of each channel wins.
    #[derive(Debug, Clone, PartialEq)]
    struct Values(BTreeMap<&'static str, i32>);

    impl Merge for Values {
        fn merge(&mut self, newer: Values) {
            self.0.extend(newer.0);
        }
    }

    fn values(pairs: &[(&'static str, i32)]) -> Values {
        Values(pairs.iter().copied().collect())
    }

    fn drain(queue: &mut StreamQueue<&'static str, Values>, now: Instant) -> Vec<String> {
        std::iter::from_fn(|| queue.pop(now))
            .map(|item| match item {
                Queued::Event(name) => name.to_owned(),
                Queued::Values {
                    subscription,
                    values,
                } => format!("{subscription}:{:?}", values.0),
            })
            .collect()
    }

    #[test]
    fn a_subscriptions_values_waiting_take_each_channels_newest_and_move_to_the_back() {
        let t0 = Instant::now();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut queue = StreamQueue::new(8);
        assert_eq!(
            queue.push_values(&a, values(&[("X", 1), ("Y", 1)]), t0),
            Offered::Queued
        );
        queue.push_event("lease", t0).unwrap();
        assert_eq!(
            queue.push_values(&b, values(&[("X", 10)]), t0),
            Offered::Queued
        );
        // A deadband subscription's next event carries only what moved: Y keeps its value.
        assert_eq!(
            queue.push_values(&a, values(&[("X", 2)]), t0),
            Offered::Merged
        );
        assert_eq!(
            queue.push_values(&a, values(&[("X", 3)]), t0),
            Offered::Merged
        );
        assert_eq!(
            queue.len(),
            3,
            "one values event a subscription, whatever the time"
        );
        assert_eq!(queue.merged(), 2);
        assert_eq!(
            drain(&mut queue, t0),
            [
                "lease".to_owned(),
                "b:{\"X\": 10}".to_owned(),
                "a:{\"X\": 3, \"Y\": 1}".to_owned()
            ]
        );
    }

    #[test]
    fn values_taken_by_the_reader_are_not_merged_into_again() {
        let t0 = Instant::now();
        let a: Arc<str> = "a".into();
        let mut queue = StreamQueue::new(8);
        queue.push_values(&a, values(&[("X", 1)]), t0);
        assert_eq!(drain(&mut queue, t0), ["a:{\"X\": 1}".to_owned()]);
        assert_eq!(
            queue.push_values(&a, values(&[("X", 2)]), t0),
            Offered::Queued
        );
    }

    #[test]
    fn events_are_never_dropped_and_past_the_limit_refused() {
        let t0 = Instant::now();
        let a: Arc<str> = "a".into();
        let mut queue = StreamQueue::new(2);
        queue.push_event("lease", t0).unwrap();
        queue.push_values(&a, values(&[("X", 1)]), t0);
        queue.push_event("connection", t0).unwrap();
        assert_eq!(queue.push_event("configuration", t0), Err(Overflow));
        // Values still merge: they never count against the limit.
        assert_eq!(
            queue.push_values(&a, values(&[("X", 2)]), t0),
            Offered::Merged
        );
        queue.pop(t0);
        queue.push_event("configuration", t0).unwrap();
        queue.clear();
        assert!(queue.is_empty());
        queue.push_event_anyway("gap", t0);
        queue.push_event_anyway("snapshot", t0);
        queue.push_event_anyway("closed", t0);
        assert_eq!(drain(&mut queue, t0), ["gap", "snapshot", "closed"]);
    }

    #[test]
    fn the_wait_runs_from_the_first_item_not_taken_and_restarts_at_each_take() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let a: Arc<str> = "a".into();
        let mut queue = StreamQueue::new(4);
        assert_eq!(queue.waiting_for(at(0)), None);
        queue.push_values(&a, values(&[("X", 1)]), at(100));
        queue.push_event("lease", at(200)).unwrap();
        // Merging (the reader is behind) does not reset the wait.
        queue.push_values(&a, values(&[("X", 2)]), at(300));
        assert_eq!(
            queue.waiting_for(at(1_100)),
            Some(Duration::from_millis(1_000))
        );
        queue.pop(at(2_000));
        assert_eq!(
            queue.waiting_for(at(2_500)),
            Some(Duration::from_millis(500))
        );
        queue.pop(at(3_000));
        assert_eq!(queue.waiting_for(at(9_000)), None, "nothing waits");
    }
}
