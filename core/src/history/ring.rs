//! One channel's recent samples in a fixed-capacity ring: time as a `u32` millisecond offset,
//! the value as an `f64` (texts by their index in a small dictionary), the status in a byte —
//! 13 bytes a sample, stored as three parallel arrays so no padding is paid.

/// What one sample says: a value, or why there was none.
#[derive(Debug, Clone, PartialEq)]
pub enum SampleValue {
    /// A number (floats; integers and booleans as numbers too).
    Number(f64),
    /// A text (enum option, string, bytes as hex).
    Text(String),
    /// The station answered the read with an error.
    ReadError,
    /// The station could not be reached (the link was down).
    NotReached,
    /// The gateway stopped: nothing was recorded until it ran again.
    GatewayStopped,
}

impl SampleValue {
    /// Whether the channel had a value (a number or a text).
    pub fn is_ok(&self) -> bool {
        matches!(self, SampleValue::Number(_) | SampleValue::Text(_))
    }

    /// The status as the archive and the query name it.
    pub fn status(&self) -> Status {
        match self {
            SampleValue::Number(_) | SampleValue::Text(_) => Status::Ok,
            SampleValue::ReadError => Status::ReadError,
            SampleValue::NotReached => Status::NotReached,
            SampleValue::GatewayStopped => Status::GatewayStopped,
        }
    }
}

/// A sample's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    ReadError,
    NotReached,
    GatewayStopped,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::ReadError => "read error",
            Status::NotReached => "station not reached",
            Status::GatewayStopped => "gateway stopped",
        }
    }

    pub fn from_name(name: &str) -> Option<Status> {
        [
            Status::Ok,
            Status::ReadError,
            Status::NotReached,
            Status::GatewayStopped,
        ]
        .into_iter()
        .find(|status| status.name() == name)
    }
}

/// One sample at a wall-clock time (ms since the Unix epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub t_ms: u64,
    pub value: SampleValue,
}

const NUMBER: u8 = 0;
const TEXT: u8 = 1;
const READ_ERROR: u8 = 2;
const NOT_REACHED: u8 = 3;
const GATEWAY_STOPPED: u8 = 4;

/// The most distinct texts a channel's ring remembers; later new texts read back as
/// [`OVERFLOW_TEXT`] (a text channel has a handful of enum options, not thousands).
pub const MAX_TEXTS: usize = 256;
pub const OVERFLOW_TEXT: &str = "(text not kept: more than 256 distinct texts in memory)";

/// The bytes one stored sample takes (the three arrays' elements).
pub const BYTES_PER_SAMPLE: usize = size_of::<u32>() + size_of::<f64>() + size_of::<u8>();

/// One channel's ring.
#[derive(Debug)]
pub struct ChannelRing {
    capacity: usize,
    /// The time offsets are from here.
    base_ms: u64,
    offsets: Vec<u32>,
    values: Vec<f64>,
    kinds: Vec<u8>,
    /// The position of the oldest sample once the ring is full (0 until then).
    head: usize,
    texts: Vec<String>,
}

impl ChannelRing {
    /// A ring keeping at most `capacity` samples (at least 1); memory is taken as it fills.
    pub fn new(capacity: usize) -> ChannelRing {
        ChannelRing {
            capacity: capacity.max(1),
            base_ms: 0,
            offsets: Vec::new(),
            values: Vec::new(),
            kinds: Vec::new(),
            head: 0,
            texts: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// The bytes this ring holds (its arrays' capacity and its texts).
    pub fn memory_bytes(&self) -> usize {
        self.offsets.capacity() * size_of::<u32>()
            + self.values.capacity() * size_of::<f64>()
            + self.kinds.capacity()
            + self
                .texts
                .iter()
                .map(|text| text.capacity() + size_of::<String>())
                .sum::<usize>()
    }

    fn physical(&self, logical: usize) -> usize {
        (self.head + logical) % self.offsets.len()
    }

    fn time_at(&self, logical: usize) -> u64 {
        self.base_ms + u64::from(self.offsets[self.physical(logical)])
    }

    /// The newest sample's time and whether it was ok.
    pub fn last(&self) -> Option<(u64, u8)> {
        let len = self.len();
        (len > 0).then(|| (self.time_at(len - 1), self.kinds[self.physical(len - 1)]))
    }

    /// The oldest sample's time.
    pub fn oldest_ms(&self) -> Option<u64> {
        (!self.is_empty()).then(|| self.time_at(0))
    }

    /// Keeps `value` at `t_ms` unless it adds nothing: a sample older than the newest is
    /// refused, and one of the same status as the newest less than `min_spacing_ms` after it.
    /// A change of status is always kept (a gap starts or ends exactly there). Returns whether
    /// it was kept.
    pub fn offer(&mut self, t_ms: u64, value: &SampleValue, min_spacing_ms: u64) -> bool {
        let kind = kind_of(value);
        if let Some((last_ms, last_kind)) = self.last() {
            let same_status = (last_kind <= TEXT && kind <= TEXT) || last_kind == kind;
            if t_ms < last_ms || (same_status && t_ms - last_ms < min_spacing_ms) {
                return false;
            }
        }
        self.push(t_ms, value);
        true
    }

    /// Appends a sample, overwriting the oldest when full. Times must not go backwards
    /// ([`offer`](Self::offer) checks).
    fn push(&mut self, t_ms: u64, value: &SampleValue) {
        if self.is_empty() {
            self.base_ms = t_ms;
        }
        if t_ms - self.base_ms > u64::from(u32::MAX) {
            self.rebase(t_ms);
        }
        let offset = (t_ms - self.base_ms) as u32;
        let (kind, number) = match value {
            SampleValue::Number(number) => (NUMBER, *number),
            SampleValue::Text(text) => (TEXT, self.text_index(text) as f64),
            SampleValue::ReadError => (READ_ERROR, 0.0),
            SampleValue::NotReached => (NOT_REACHED, 0.0),
            SampleValue::GatewayStopped => (GATEWAY_STOPPED, 0.0),
        };
        if self.offsets.len() < self.capacity {
            if self.offsets.len() == self.offsets.capacity() {
                // Grow by doubling, but never past the ring's capacity.
                let more = self
                    .offsets
                    .len()
                    .max(64)
                    .min(self.capacity - self.offsets.len());
                self.offsets.reserve_exact(more);
                self.values.reserve_exact(more);
                self.kinds.reserve_exact(more);
            }
            self.offsets.push(offset);
            self.values.push(number);
            self.kinds.push(kind);
        } else {
            let at = self.head;
            self.offsets[at] = offset;
            self.values[at] = number;
            self.kinds[at] = kind;
            self.head = (self.head + 1) % self.capacity;
        }
    }

    /// Moves the base to the oldest sample kept after the next push, or forgets everything
    /// when even that is more than a `u32` of milliseconds (49 days) before `t_ms`.
    fn rebase(&mut self, t_ms: u64) {
        let kept_from = usize::from(self.len() == self.capacity);
        let oldest = if self.len() > kept_from {
            self.time_at(kept_from)
        } else {
            t_ms
        };
        if t_ms - oldest > u64::from(u32::MAX) {
            self.offsets.clear();
            self.values.clear();
            self.kinds.clear();
            self.head = 0;
            self.base_ms = t_ms;
            return;
        }
        let shift = (oldest - self.base_ms) as u32;
        for offset in &mut self.offsets {
            // The sample about to be overwritten may be older than the new base.
            *offset = offset.saturating_sub(shift);
        }
        self.base_ms = oldest;
    }

    fn text_index(&mut self, text: &str) -> usize {
        if let Some(at) = self.texts.iter().position(|known| known == text) {
            return at;
        }
        if self.texts.len() < MAX_TEXTS {
            self.texts.push(text.to_owned());
            return self.texts.len() - 1;
        }
        MAX_TEXTS
    }

    fn sample_at(&self, logical: usize) -> Sample {
        let at = self.physical(logical);
        let value = match self.kinds[at] {
            NUMBER => SampleValue::Number(self.values[at]),
            TEXT => SampleValue::Text(
                self.texts
                    .get(self.values[at] as usize)
                    .map_or(OVERFLOW_TEXT, String::as_str)
                    .to_owned(),
            ),
            READ_ERROR => SampleValue::ReadError,
            NOT_REACHED => SampleValue::NotReached,
            _ => SampleValue::GatewayStopped,
        };
        Sample {
            t_ms: self.time_at(logical),
            value,
        }
    }

    /// The samples from `from_ms` (inclusive) to `to_ms` (exclusive), in time order, preceded
    /// by the last one before `from_ms` when there is one (it tells the state at `from_ms`).
    pub fn range(&self, from_ms: u64, to_ms: u64) -> Vec<Sample> {
        let len = self.len();
        let first = partition_point(len, |i| self.time_at(i) < from_ms);
        let end = partition_point(len, |i| self.time_at(i) < to_ms);
        let start = first.saturating_sub(1);
        (start..end.max(start)).map(|i| self.sample_at(i)).collect()
    }
}

fn kind_of(value: &SampleValue) -> u8 {
    match value {
        SampleValue::Number(_) => NUMBER,
        SampleValue::Text(_) => TEXT,
        SampleValue::ReadError => READ_ERROR,
        SampleValue::NotReached => NOT_REACHED,
        SampleValue::GatewayStopped => GATEWAY_STOPPED,
    }
}

/// The first of `0..len` for which `before` is false (`before` true then false over it).
fn partition_point(len: usize, before: impl Fn(usize) -> bool) -> usize {
    let (mut low, mut high) = (0, len);
    while low < high {
        let mid = low + (high - low) / 2;
        if before(mid) {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    low
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(ring: &ChannelRing, from: u64, to: u64) -> Vec<(u64, f64)> {
        ring.range(from, to)
            .into_iter()
            .map(|sample| match sample.value {
                SampleValue::Number(n) => (sample.t_ms, n),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_full_ring_keeps_the_newest_in_time_order() {
        let mut ring = ChannelRing::new(3);
        for t in 0..5u64 {
            assert!(ring.offer(1000 + t, &SampleValue::Number(t as f64), 0));
        }
        assert_eq!(
            numbers(&ring, 0, u64::MAX),
            [(1002, 2.0), (1003, 3.0), (1004, 4.0)]
        );
        assert_eq!(ring.oldest_ms(), Some(1002));
    }

    #[test]
    fn a_range_starts_with_the_sample_before_it() {
        let mut ring = ChannelRing::new(10);
        for t in [10, 20, 30, 40] {
            ring.offer(t, &SampleValue::Number(t as f64), 0);
        }
        assert_eq!(numbers(&ring, 25, 40), [(20, 20.0), (30, 30.0)]);
        assert_eq!(numbers(&ring, 0, 15), [(10, 10.0)]);
        assert_eq!(numbers(&ring, 50, 60), [(40, 40.0)]);
    }

    #[test]
    fn samples_closer_than_the_spacing_are_left_out_but_a_status_change_is_kept() {
        let mut ring = ChannelRing::new(10);
        assert!(ring.offer(0, &SampleValue::Number(1.0), 100));
        assert!(!ring.offer(50, &SampleValue::Number(2.0), 100));
        assert!(ring.offer(60, &SampleValue::NotReached, 100));
        assert!(!ring.offer(70, &SampleValue::NotReached, 100));
        assert!(ring.offer(80, &SampleValue::ReadError, 100));
        assert!(ring.offer(90, &SampleValue::Number(3.0), 100));
        assert!(
            !ring.offer(85, &SampleValue::Number(4.0), 0),
            "older than the newest"
        );
        assert_eq!(ring.len(), 4);
    }

    #[test]
    fn texts_come_back_from_the_dictionary() {
        let mut ring = ChannelRing::new(10);
        ring.offer(1, &SampleValue::Text("Red".into()), 0);
        ring.offer(2, &SampleValue::Text("Green".into()), 0);
        ring.offer(3, &SampleValue::Text("Red".into()), 0);
        let texts: Vec<_> = ring.range(0, 10).into_iter().map(|s| s.value).collect();
        assert_eq!(
            texts,
            ["Red", "Green", "Red"].map(|t| SampleValue::Text(t.into()))
        );
    }

    #[test]
    fn offsets_past_49_days_rebase_or_start_over() {
        let mut ring = ChannelRing::new(2);
        let day = 86_400_000u64;
        ring.offer(0, &SampleValue::Number(0.0), 0);
        ring.offer(40 * day, &SampleValue::Number(1.0), 0);
        // The first sample is overwritten; the base moves to the one kept.
        ring.offer(60 * day, &SampleValue::Number(2.0), 0);
        assert_eq!(
            numbers(&ring, 0, u64::MAX),
            [(40 * day, 1.0), (60 * day, 2.0)]
        );
        ring.offer(200 * day, &SampleValue::Number(3.0), 0);
        assert_eq!(numbers(&ring, 0, u64::MAX), [(200 * day, 3.0)]);
    }
}
