//! The shared recorder: every channel's ring (`ChannelRing`), fed by the value cache's
//! observer hook on every value the link reads and by the history task's status samples;
//! each kept sample also handed to the archive's bounded queue, never waiting for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use station_protocol::Value;
use tokio::sync::mpsc;

#[cfg(doc)]
use super::ring::BYTES_PER_SAMPLE;
use super::ring::{ChannelRing, Sample, SampleValue};

/// One sample on its way to the archive.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchivedSample {
    pub channel: Arc<str>,
    pub sample: Sample,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct HistoryCounters {
    /// Samples kept in memory.
    pub recorded: AtomicU64,
    /// Samples the archive confirmed written.
    pub archived: AtomicU64,
    /// Samples written to the local spool while the archive was unreachable.
    pub spooled: AtomicU64,
    /// Samples that found the archive's queue full: lost to the archive (must stay 0).
    pub dropped: AtomicU64,
    /// Samples of channels past `max_channels`, not kept.
    pub over_limit: AtomicU64,
    /// The time (ms since the epoch) of the newest sample handed to the archive; 0 before.
    pub queued_up_to_ms: AtomicU64,
    /// The time (ms since the epoch) of the newest sample the archive confirmed; 0 before.
    pub archived_up_to_ms: AtomicU64,
}

/// Instants (what the link measures) as wall-clock milliseconds, from one anchor taken at
/// start: later wall-clock steps do not reorder samples.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    instant: Instant,
    unix_ms: u64,
}

impl WallClock {
    pub fn now() -> WallClock {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        WallClock {
            instant: Instant::now(),
            unix_ms,
        }
    }

    pub fn unix_ms(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.instant) {
            Some(after) => self.unix_ms + after.as_millis() as u64,
            None => self
                .unix_ms
                .saturating_sub(self.instant.duration_since(at).as_millis() as u64),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.unix_ms(Instant::now())
    }
}

struct Channel {
    name: Arc<str>,
    ring: ChannelRing,
}

/// Every channel's recent samples.
pub struct History {
    channels: DashMap<String, Channel>,
    limits: Limits,
    clock: WallClock,
    archive: Option<mpsc::Sender<ArchivedSample>>,
    pub counters: HistoryCounters,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("channels", &self.channels.len())
            .field("limits", &self.limits)
            .finish()
    }
}

/// What memory may hold: the bound is `max_channels × samples_per_channel ×`
/// [`BYTES_PER_SAMPLE`] (plus each channel's name and texts).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub samples_per_channel: usize,
    pub max_channels: usize,
    /// A sample of the same status as a channel's newest is kept only this long after it.
    pub min_spacing_ms: u64,
}

impl History {
    /// Rings within `limits` and, with an archive, its queue.
    pub fn new(
        limits: Limits,
        clock: WallClock,
        archive: Option<mpsc::Sender<ArchivedSample>>,
    ) -> History {
        History {
            channels: DashMap::new(),
            limits,
            clock,
            archive,
            counters: HistoryCounters::default(),
        }
    }

    pub fn clock(&self) -> WallClock {
        self.clock
    }

    /// A value read by a READ sent at `read_at`.
    pub fn record_value(&self, name: &str, value: &Value, read_at: Instant) {
        self.record(name, self.clock.unix_ms(read_at), sample_value(value));
    }

    /// A sample at `t_ms` (ms since the epoch), kept unless the ring's spacing rule leaves
    /// it out.
    pub fn record(&self, name: &str, t_ms: u64, value: SampleValue) {
        let kept = match self.channels.get_mut(name) {
            Some(mut channel) => channel
                .ring
                .offer(t_ms, &value, self.limits.min_spacing_ms)
                .then(|| channel.name.clone()),
            None if self.channels.len() >= self.limits.max_channels => {
                self.counters.over_limit.fetch_add(1, Ordering::Relaxed);
                None
            }
            None => {
                let mut ring = ChannelRing::new(self.limits.samples_per_channel);
                ring.offer(t_ms, &value, self.limits.min_spacing_ms);
                let name: Arc<str> = Arc::from(name);
                self.channels.insert(
                    name.to_string(),
                    Channel {
                        name: name.clone(),
                        ring,
                    },
                );
                Some(name)
            }
        };
        let Some(channel) = kept else { return };
        self.counters.recorded.fetch_add(1, Ordering::Relaxed);
        if let Some(archive) = &self.archive {
            let sample = Sample { t_ms, value };
            if archive
                .try_send(ArchivedSample { channel, sample })
                .is_err()
            {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A status sample (no value) at `t_ms` for every channel with samples.
    pub fn record_everywhere(&self, t_ms: u64, value: SampleValue) {
        let names: Vec<String> = self.channels.iter().map(|c| c.key().clone()).collect();
        for name in names {
            self.record(&name, t_ms, value.clone());
        }
    }

    /// The channel's samples in `[from_ms, to_ms)` with the one before (see
    /// [`ChannelRing::range`]), and the oldest time memory holds for it.
    pub fn range(&self, name: &str, from_ms: u64, to_ms: u64) -> Option<(Vec<Sample>, u64)> {
        let channel = self.channels.get(name)?;
        let oldest = channel.ring.oldest_ms()?;
        Some((channel.ring.range(from_ms, to_ms), oldest))
    }

    /// The bytes every ring holds.
    pub fn memory_bytes(&self) -> usize {
        self.channels
            .iter()
            .map(|channel| channel.ring.memory_bytes() + channel.key().capacity())
            .sum()
    }

    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }

    /// The counters for `/metrics`.
    pub fn counts(&self) -> crate::metrics::HistoryCounts {
        let counters = &self.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let lag_ms =
            get(&counters.queued_up_to_ms).saturating_sub(get(&counters.archived_up_to_ms));
        crate::metrics::HistoryCounts {
            recorded: get(&counters.recorded),
            archived: get(&counters.archived),
            spooled: get(&counters.spooled),
            dropped: get(&counters.dropped),
            over_limit: get(&counters.over_limit),
            channels: self.channels.len(),
            memory_bytes: self.memory_bytes(),
            archive: self.archive.is_some(),
            archive_lag: std::time::Duration::from_millis(lag_ms),
        }
    }
}

impl crate::cache::ValueObserver for History {
    fn read(&self, name: &str, value: &Value, read_at: Instant) {
        self.record_value(name, value, read_at);
    }

    fn read_failed(&self, name: &str, read_at: Instant) {
        self.record(name, self.clock.unix_ms(read_at), SampleValue::ReadError);
    }
}

/// A station value as a sample: numbers (integers and booleans too) as numbers, enum options
/// and strings as texts, bytes as hex text.
pub fn sample_value(value: &Value) -> SampleValue {
    match value {
        Value::Float(number) => SampleValue::Number(*number),
        Value::Integer(number) => SampleValue::Number(*number as f64),
        Value::Bool(flag) => SampleValue::Number(f64::from(u8::from(*flag))),
        Value::Enum(text) | Value::String(text) => SampleValue::Text(text.clone()),
        Value::Bytes(bytes) => {
            SampleValue::Text(bytes.iter().map(|b| format!("{b:02x}")).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::ring::BYTES_PER_SAMPLE;

    #[test]
    fn one_hour_at_10_hz_for_100_channels_fits_in_64_mb() {
        let hour_at_10_hz = 36_000;
        let limits = Limits {
            samples_per_channel: hour_at_10_hz,
            max_channels: 100,
            min_spacing_ms: 100,
        };
        let history = History::new(limits, WallClock::now(), None);
        let start = 1_764_583_200_000u64;
        for channel in 0..100 {
            let name = format!("0.4.ESH10000662.VMON{channel}");
            for i in 0..hour_at_10_hz as u64 + 10 {
                history.record(&name, start + i * 100, SampleValue::Number(i as f64));
            }
        }
        let bytes = history.memory_bytes();
        eprintln!(
            "100 channels × 1 h at 10 Hz: {bytes} bytes ({:.1} MB, {BYTES_PER_SAMPLE} bytes a sample)",
            bytes as f64 / 1e6
        );
        assert!(bytes <= 64 * 1024 * 1024, "{bytes} bytes");
        let (samples, oldest) = history.range("0.4.ESH10000662.VMON7", 0, u64::MAX).unwrap();
        assert_eq!(samples.len(), hour_at_10_hz);
        assert_eq!(oldest, start + 10 * 100, "the first ten were overwritten");
        assert_eq!(
            history.counters.recorded.load(Ordering::Relaxed),
            100 * (hour_at_10_hz as u64 + 10)
        );
    }

    #[test]
    fn a_full_archive_queue_counts_a_drop_and_never_waits() {
        let (queue, mut archive) = mpsc::channel(1);
        let history = History::new(limits(1), WallClock::now(), Some(queue));
        history.record("V", 1, SampleValue::Number(1.0));
        history.record("V", 2, SampleValue::Number(2.0));
        assert_eq!(history.counters.dropped.load(Ordering::Relaxed), 1);
        let first = archive.try_recv().unwrap();
        assert_eq!((&*first.channel, first.sample.t_ms), ("V", 1));
    }

    fn limits(max_channels: usize) -> Limits {
        Limits {
            samples_per_channel: 10,
            max_channels,
            min_spacing_ms: 0,
        }
    }

    #[test]
    fn channels_past_the_limit_are_not_kept() {
        let history = History::new(limits(2), WallClock::now(), None);
        for name in ["A", "B", "C", "A"] {
            history.record(name, 1, SampleValue::Number(1.0));
        }
        assert_eq!(history.channel_count(), 2);
        assert!(history.range("C", 0, 10).is_none());
        assert_eq!(history.counters.over_limit.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn values_become_numbers_or_texts() {
        assert_eq!(sample_value(&Value::Integer(3)), SampleValue::Number(3.0));
        assert_eq!(sample_value(&Value::Bool(true)), SampleValue::Number(1.0));
        assert_eq!(
            sample_value(&Value::Enum("Red".into())),
            SampleValue::Text("Red".into())
        );
        assert_eq!(
            sample_value(&Value::Bytes(bytes::Bytes::from_static(&[0xab, 1]))),
            SampleValue::Text("ab01".into())
        );
    }
}
