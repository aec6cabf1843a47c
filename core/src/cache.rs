//! The value cache: the last value the hardware gave for each channel, when, and under which
//! link generation. Every hardware read feeds it; every write invalidates its channel when it
//! is sent, and its read-back once confirmed (`station::change::confirmed_writes`) refills it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use station_protocol::Value;

/// One channel's last known value.
#[derive(Debug, Clone)]
pub struct CachedValue {
    pub value: Value,
    /// When the READ that produced it was sent: ages are never understated.
    pub read_at: Instant,
    pub generation: u64,
}

impl CachedValue {
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.read_at)
    }
}

#[derive(Debug)]
struct Slot {
    value: Option<CachedValue>,
    /// A write was sent at this time: reads sent before it must not refill the slot.
    invalidated_at: Option<Instant>,
}

/// Told of every value the link reads and every read the station refused, as the link task
/// learns of them: it must return at once (the value history's recorder, `history/`).
pub trait ValueObserver: Send + Sync + std::fmt::Debug {
    fn read(&self, name: &str, value: &Value, read_at: Instant);
    fn read_failed(&self, name: &str, read_at: Instant);
}

/// name → last value. Shared by the link task (writer) and every reader.
#[derive(Debug, Default)]
pub struct ValueCache {
    slots: DashMap<String, Slot, foldhash::fast::RandomState>,
    observer: OnceLock<Arc<dyn ValueObserver>>,
    /// Answers of [`ValueCache::get_fresh`]: fresh enough, or not (for metrics).
    hits: AtomicU64,
    misses: AtomicU64,
}

impl ValueCache {
    pub fn new() -> ValueCache {
        ValueCache::default()
    }

    /// From now on tells `observer` of every value read and every read refused (once).
    pub fn observe(&self, observer: Arc<dyn ValueObserver>) {
        let _ = self.observer.set(observer);
    }

    /// The station refused to read `name` (a READ sent at `read_at`): only the observer cares.
    pub fn read_failed(&self, name: &str, read_at: Instant) {
        if let Some(observer) = self.observer.get() {
            observer.read_failed(name, read_at);
        }
    }

    /// Records a value read by a READ sent at `read_at`, unless a write to the channel was
    /// sent after that READ.
    pub fn insert(&self, name: &str, value: Value, read_at: Instant, generation: u64) {
        if let Some(observer) = self.observer.get() {
            observer.read(name, &value, read_at);
        }
        let fresh = CachedValue {
            value,
            read_at,
            generation,
        };
        match self.slots.get_mut(name) {
            Some(mut slot) => {
                if slot.invalidated_at.is_some_and(|at| read_at < at) {
                    return;
                }
                if slot.value.as_ref().is_some_and(|old| old.read_at > read_at) {
                    return;
                }
                slot.value = Some(fresh);
            }
            None => {
                self.slots.insert(
                    name.to_owned(),
                    Slot {
                        value: Some(fresh),
                        invalidated_at: None,
                    },
                );
            }
        }
    }

    /// Forgets a channel's value because a write to it was sent at `at`.
    pub fn invalidate(&self, name: &str, at: Instant) {
        let mut slot = self.slots.entry(name.to_owned()).or_insert(Slot {
            value: None,
            invalidated_at: None,
        });
        slot.value = None;
        slot.invalidated_at = Some(at);
    }

    pub fn get(&self, name: &str) -> Option<CachedValue> {
        self.slots.get(name).and_then(|slot| slot.value.clone())
    }

    /// The value when it was read under `generation` no longer than `max_age` ago.
    pub fn get_fresh(
        &self,
        name: &str,
        max_age: Duration,
        generation: u64,
        now: Instant,
    ) -> Option<CachedValue> {
        let fresh = self
            .get(name)
            .filter(|cached| cached.generation == generation && cached.age(now) <= max_age);
        let counter = if fresh.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        fresh
    }

    /// How many reads with a maximum age were served from the cache, and how many were not.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_sent_before_a_write_does_not_refill_the_slot() {
        let cache = ValueCache::new();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1);
        cache.invalidate("V", t1);
        cache.insert("V", Value::Float(1.0), t0, 1);
        assert!(cache.get("V").is_none());
        cache.insert("V", Value::Float(2.0), t1 + Duration::from_millis(1), 1);
        assert_eq!(cache.get("V").unwrap().value, Value::Float(2.0));
    }

    #[test]
    fn freshness_needs_the_generation_and_the_age() {
        let cache = ValueCache::new();
        let t0 = Instant::now();
        cache.insert("V", Value::Float(1.0), t0, 3);
        let later = t0 + Duration::from_millis(500);
        assert!(
            cache
                .get_fresh("V", Duration::from_millis(600), 3, later)
                .is_some()
        );
        assert!(
            cache
                .get_fresh("V", Duration::from_millis(400), 3, later)
                .is_none()
        );
        assert!(
            cache
                .get_fresh("V", Duration::from_millis(600), 4, later)
                .is_none()
        );
    }

    #[test]
    fn an_older_read_does_not_replace_a_newer_one() {
        let cache = ValueCache::new();
        let t0 = Instant::now();
        cache.insert("V", Value::Float(2.0), t0 + Duration::from_millis(5), 1);
        cache.insert("V", Value::Float(1.0), t0, 1);
        assert_eq!(cache.get("V").unwrap().value, Value::Float(2.0));
    }

    #[test]
    fn a_read_sent_at_the_very_instant_of_a_write_refills_the_slot() {
        let cache = ValueCache::new();
        let t0 = Instant::now();
        cache.invalidate("V", t0);
        cache.insert("V", Value::Float(1.0), t0, 1);
        assert_eq!(cache.get("V").unwrap().value, Value::Float(1.0));
    }

    #[test]
    fn a_read_sent_at_the_same_instant_as_the_cached_one_replaces_it() {
        let cache = ValueCache::new();
        let t0 = Instant::now();
        cache.insert("V", Value::Float(1.0), t0, 1);
        cache.insert("V", Value::Float(2.0), t0, 2);
        let cached = cache.get("V").unwrap();
        assert_eq!((cached.value, cached.generation), (Value::Float(2.0), 2));
    }

    #[test]
    fn a_value_exactly_as_old_as_allowed_is_fresh_and_its_age_is_measured_from_its_read() {
        let cache = ValueCache::new();
        let t0 = Instant::now();
        cache.insert("V", Value::Float(1.0), t0, 3);
        let later = t0 + Duration::from_millis(250);
        let fresh = cache
            .get_fresh("V", Duration::from_millis(250), 3, later)
            .unwrap();
        assert_eq!(fresh.age(later), Duration::from_millis(250));
        // A clock reading before the read gives age zero, never a panic.
        assert_eq!(fresh.age(t0 - Duration::from_millis(1)), Duration::ZERO);
    }

    #[test]
    fn hits_and_misses_count_each_answer_of_get_fresh() {
        let cache = ValueCache::new();
        let t0 = Instant::now();
        assert_eq!(cache.hits_and_misses(), (0, 0));
        cache.insert("V", Value::Float(1.0), t0, 1);
        let max_age = Duration::from_secs(1);
        for _ in 0..3 {
            assert!(cache.get_fresh("V", max_age, 1, t0).is_some());
        }
        assert!(cache.get_fresh("W", max_age, 1, t0).is_none());
        assert!(cache.get_fresh("V", max_age, 2, t0).is_none());
        assert_eq!(cache.hits_and_misses(), (3, 2));
        // A plain `get` is not a read with a maximum age: it counts as neither.
        assert!(cache.get("V").is_some());
        assert_eq!(cache.hits_and_misses(), (3, 2));
    }

    #[test]
    fn len_counts_channels_with_a_slot_including_invalidated_ones() {
        let cache = ValueCache::new();
        assert!(cache.is_empty());
        assert_eq!(cache.len(), 0);
        let t0 = Instant::now();
        cache.insert("V", Value::Float(1.0), t0, 1);
        cache.insert("V", Value::Float(2.0), t0, 1);
        assert!(!cache.is_empty());
        assert_eq!(cache.len(), 1);
        cache.invalidate("W", t0);
        cache.invalidate("V", t0);
        assert_eq!(cache.len(), 2);
        assert!(cache.get("V").is_none() && cache.get("W").is_none());
    }
}
