//! A time range of samples reduced to what a query asks: `points` buckets of one function
//! (`raw`, `mean`, `min`, `max`, `first`, `last`, `minmax`) and the gaps — where the channel
//! had no value, and why. Buckets of a minute or more are whole minutes (`Buckets`), so the
//! archive's per-minute summaries (`MinuteSummary`) can stand in for their samples. Pure: the
//! samples, the summaries and the range are passed in.

use super::ring::{Sample, SampleValue, Status};

/// How a bucket's samples become its point(s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    /// Every sample as it is, no buckets.
    Raw,
    Mean,
    Min,
    Max,
    First,
    Last,
    /// Two points per bucket, its minimum and its maximum in time order (the envelope a line
    /// chart needs to show every spike).
    MinMax,
}

impl Reduce {
    pub const ALL: [Reduce; 7] = [
        Reduce::Raw,
        Reduce::Mean,
        Reduce::Min,
        Reduce::Max,
        Reduce::First,
        Reduce::Last,
        Reduce::MinMax,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reduce::Raw => "raw",
            Reduce::Mean => "mean",
            Reduce::Min => "min",
            Reduce::Max => "max",
            Reduce::First => "first",
            Reduce::Last => "last",
            Reduce::MinMax => "minmax",
        }
    }

    pub fn parse(name: &str) -> Option<Reduce> {
        Reduce::ALL.into_iter().find(|reduce| reduce.name() == name)
    }
}

/// A point's value: a number, or a text (texts are kept by `raw`, `first` and `last`).
#[derive(Debug, Clone, PartialEq)]
pub enum PointValue {
    Number(f64),
    Text(String),
}

/// One point of the answer: its time, the bucket's value by the function, the bucket's
/// numeric minimum and maximum, and how many samples with a value it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub t_ms: u64,
    pub value: PointValue,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub count: usize,
}

/// A stretch with no value, from its first sample without one to the next with one (or the
/// end of the range), clipped to the range.
#[derive(Debug, Clone, PartialEq)]
pub struct Gap {
    pub from_ms: u64,
    pub to_ms: u64,
    pub why: Status,
}

/// The answer: the range it covers (see [`Buckets`]), its points and its gaps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    pub from_ms: u64,
    pub to_ms: u64,
    pub points: Vec<Point>,
    pub gaps: Vec<Gap>,
}

pub const MINUTE_MS: u64 = 60_000;

/// The buckets a query is reduced in: `[from_ms, to_ms)` cut every `width_ms` from `from_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    pub from_ms: u64,
    pub to_ms: u64,
    pub width_ms: u64,
    /// Every bucket is a run of whole minutes: the archive's per-minute summaries may answer
    /// it.
    pub by_minute: bool,
}

impl Buckets {
    /// `points` buckets over `[from_ms, to_ms)` for `how`, of equal width (the last may be
    /// shorter). When each would span a minute or more, the range is widened to whole minutes
    /// (`from` down, `to` up) and the width rounded up to whole minutes, so that each minute
    /// falls in exactly one bucket — never more than `points` buckets still. `raw` has no
    /// buckets: its range stays as asked.
    pub fn new(from_ms: u64, to_ms: u64, points: usize, how: Reduce) -> Buckets {
        let to_ms = to_ms.max(from_ms);
        let width_ms = bucket_width(from_ms, to_ms, points);
        if how == Reduce::Raw || width_ms < MINUTE_MS {
            return Buckets {
                from_ms,
                to_ms,
                width_ms,
                by_minute: false,
            };
        }
        let from_ms = from_ms - from_ms % MINUTE_MS;
        let to_ms = to_ms.div_ceil(MINUTE_MS).saturating_mul(MINUTE_MS);
        Buckets {
            from_ms,
            to_ms,
            width_ms: bucket_width(from_ms, to_ms, points)
                .div_ceil(MINUTE_MS)
                .saturating_mul(MINUTE_MS),
            by_minute: true,
        }
    }

    /// How many buckets there are.
    pub fn count(&self) -> u64 {
        (self.to_ms - self.from_ms).div_ceil(self.width_ms)
    }
}

/// One whole minute of a channel's samples, summed up by the archive, every one of them with
/// a value (a minute with a sample without one, or with a number that is not finite, is read
/// as its samples instead): what a bucket needs of them.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteSummary {
    /// The minute's start (ms since the epoch, a whole minute).
    pub minute_ms: u64,
    /// Its samples (each with a value).
    pub count: usize,
    /// Of them numbers, and their sum.
    pub numbers: usize,
    pub sum: f64,
    /// The smallest and the largest number with its time (the earliest of equals).
    pub min: Option<(u64, f64)>,
    pub max: Option<(u64, f64)>,
    pub first: Sample,
    pub last: Sample,
}

/// `samples` (in time order; any before `from_ms` only tell the state at `from_ms`) reduced
/// over `[from_ms, to_ms)` in `points` buckets (see [`Buckets::new`]). Buckets without a value
/// give no point: nothing is interpolated.
pub fn reduce(samples: &[Sample], from_ms: u64, to_ms: u64, points: usize, how: Reduce) -> Series {
    reduce_in(
        &Buckets::new(from_ms, to_ms, points, how),
        samples,
        &[],
        how,
    )
}

/// A sample or a whole minute summed up, in time order.
enum Piece<'a> {
    One(&'a Sample),
    Minute(&'a MinuteSummary),
}

/// `samples` and `minutes` (each in time order, no sample inside a summed-up minute) as one
/// series in time order.
fn pieces<'a>(samples: &'a [Sample], minutes: &'a [MinuteSummary]) -> Vec<Piece<'a>> {
    let mut out = Vec::with_capacity(samples.len() + minutes.len());
    let (mut samples, mut minutes) = (samples.iter().peekable(), minutes.iter().peekable());
    loop {
        let piece = match (samples.peek(), minutes.peek()) {
            (Some(sample), Some(minute)) if sample.t_ms < minute.minute_ms => {
                samples.next().map(Piece::One)
            }
            (_, Some(_)) => minutes.next().map(Piece::Minute),
            (Some(_), None) => samples.next().map(Piece::One),
            (None, None) => None,
        };
        match piece {
            Some(piece) => out.push(piece),
            None => return out,
        }
    }
}

/// Reduces `samples` and `minutes` (whole minutes summed up, used only when
/// `buckets.by_minute`; each in time order, no sample inside a summed-up minute) in
/// `buckets`: the same answer as reducing every sample of those minutes (the mean's sum is
/// formed in another order, equal to within floating-point rounding).
pub fn reduce_in(
    buckets: &Buckets,
    samples: &[Sample],
    minutes: &[MinuteSummary],
    how: Reduce,
) -> Series {
    let (from_ms, to_ms, width) = (buckets.from_ms, buckets.to_ms, buckets.width_ms);
    let minutes = if buckets.by_minute { minutes } else { &[] };
    let pieces = pieces(samples, minutes);
    let gaps = gaps_in(
        pieces.iter().flat_map(|piece| match piece {
            Piece::One(sample) => [Some(*sample), None],
            Piece::Minute(minute) => [Some(&minute.first), Some(&minute.last)],
        }),
        from_ms,
        to_ms,
    );
    let in_range = pieces.iter().filter(|piece| match piece {
        Piece::One(sample) => sample.t_ms >= from_ms && sample.t_ms < to_ms && sample.value.is_ok(),
        Piece::Minute(minute) => minute.minute_ms >= from_ms && minute.minute_ms < to_ms,
    });
    if how == Reduce::Raw {
        let points = in_range
            .filter_map(|piece| match piece {
                Piece::One(sample) => Some(*sample),
                Piece::Minute(_) => None,
            })
            .map(|sample| {
                let number = number_of(&sample.value);
                Point {
                    t_ms: sample.t_ms,
                    value: point_value(&sample.value),
                    min: number,
                    max: number,
                    count: 1,
                }
            })
            .collect();
        return Series {
            from_ms,
            to_ms,
            points,
            gaps,
        };
    }
    let mut out = Vec::new();
    let mut bucket: Option<Bucket<'_>> = None;
    for piece in in_range {
        let t_ms = match piece {
            Piece::One(sample) => sample.t_ms,
            Piece::Minute(minute) => minute.minute_ms,
        };
        let index = (t_ms - from_ms) / width;
        if bucket.as_ref().is_some_and(|open| open.index != index) {
            out.extend(
                bucket
                    .take()
                    .into_iter()
                    .flat_map(|done| done.points(how, from_ms, width)),
            );
        }
        let open = bucket.get_or_insert_with(|| Bucket::new(index));
        match piece {
            Piece::One(sample) => open.add(sample),
            Piece::Minute(minute) => open.add_minute(minute),
        }
    }
    out.extend(
        bucket
            .into_iter()
            .flat_map(|done| done.points(how, from_ms, width)),
    );
    Series {
        from_ms,
        to_ms,
        points: out,
        gaps,
    }
}

/// The width of each of `points` buckets over `[from_ms, to_ms)`, in whole milliseconds
/// (rounded up, so there are never more than `points`), at least 1.
pub fn bucket_width(from_ms: u64, to_ms: u64, points: usize) -> u64 {
    (to_ms - from_ms).div_ceil(points.max(1) as u64).max(1)
}

fn number_of(value: &SampleValue) -> Option<f64> {
    match value {
        SampleValue::Number(number) => Some(*number),
        _ => None,
    }
}

fn point_value(value: &SampleValue) -> PointValue {
    match value {
        SampleValue::Number(number) => PointValue::Number(*number),
        SampleValue::Text(text) => PointValue::Text(text.clone()),
        // Only samples with a value reach a point.
        SampleValue::ReadError | SampleValue::NotReached | SampleValue::GatewayStopped => {
            PointValue::Text(String::new())
        }
    }
}

/// The samples with a value in one bucket, summed up as they come.
struct Bucket<'a> {
    index: u64,
    count: usize,
    first: Option<&'a Sample>,
    last: Option<&'a Sample>,
    sum: f64,
    numbers: usize,
    min: Option<(u64, f64)>,
    max: Option<(u64, f64)>,
}

impl<'a> Bucket<'a> {
    fn new(index: u64) -> Bucket<'a> {
        Bucket {
            index,
            count: 0,
            first: None,
            last: None,
            sum: 0.0,
            numbers: 0,
            min: None,
            max: None,
        }
    }

    fn add(&mut self, sample: &'a Sample) {
        self.count += 1;
        self.first.get_or_insert(sample);
        self.last = Some(sample);
        if let SampleValue::Number(number) = sample.value {
            self.sum += number;
            self.numbers += 1;
            if self.min.is_none_or(|(_, min)| number < min) {
                self.min = Some((sample.t_ms, number));
            }
            if self.max.is_none_or(|(_, max)| number > max) {
                self.max = Some((sample.t_ms, number));
            }
        }
    }

    /// A whole minute's summary, as its samples one by one would have been added.
    fn add_minute(&mut self, minute: &'a MinuteSummary) {
        self.count += minute.count;
        self.first.get_or_insert(&minute.first);
        self.last = Some(&minute.last);
        self.sum += minute.sum;
        self.numbers += minute.numbers;
        if let Some((t_ms, number)) = minute.min
            && self.min.is_none_or(|(_, min)| number < min)
        {
            self.min = Some((t_ms, number));
        }
        if let Some((t_ms, number)) = minute.max
            && self.max.is_none_or(|(_, max)| number > max)
        {
            self.max = Some((t_ms, number));
        }
    }

    fn points(self, how: Reduce, from_ms: u64, width: u64) -> Vec<Point> {
        let start = from_ms + self.index * width;
        let (min, max) = (self.min.map(|(_, v)| v), self.max.map(|(_, v)| v));
        let point = |t_ms, value| Point {
            t_ms,
            value,
            min,
            max,
            count: self.count,
        };
        let number = |found: Option<f64>| found.map(|n| vec![point(start, PointValue::Number(n))]);
        let taken = |sample: Option<&Sample>| {
            sample.map(|sample| vec![point(start, point_value(&sample.value))])
        };
        match how {
            Reduce::Mean => number((self.numbers > 0).then(|| self.sum / self.numbers as f64)),
            Reduce::Min => number(min),
            Reduce::Max => number(max),
            Reduce::First => taken(self.first),
            Reduce::Last => taken(self.last),
            Reduce::MinMax => match (self.min, self.max) {
                (Some((t_min, low)), Some((t_max, high))) => {
                    let mut both = vec![
                        point(t_min, PointValue::Number(low)),
                        point(t_max, PointValue::Number(high)),
                    ];
                    both.sort_by_key(|p| p.t_ms);
                    // One sample both the minimum and the maximum: one point.
                    both.dedup_by_key(|p| p.t_ms);
                    Some(both)
                }
                _ => None,
            },
            Reduce::Raw => None,
        }
        .unwrap_or_default()
    }
}

/// Where the channel had no value within `[from_ms, to_ms)`: each run of samples without one,
/// from its first to the next sample with a value. A run's reason is its first sample's.
pub fn gaps(samples: &[Sample], from_ms: u64, to_ms: u64) -> Vec<Gap> {
    gaps_in(samples.iter().map(Some), from_ms, to_ms)
}

/// [`gaps`] over samples given one by one (`None`s skipped).
fn gaps_in<'a>(
    samples: impl IntoIterator<Item = Option<&'a Sample>>,
    from_ms: u64,
    to_ms: u64,
) -> Vec<Gap> {
    let mut gaps = Vec::new();
    let mut open: Option<(u64, Status)> = None;
    for sample in samples.into_iter().flatten() {
        if sample.t_ms >= to_ms {
            break;
        }
        match (&open, sample.value.is_ok()) {
            (None, false) => open = Some((sample.t_ms, sample.value.status())),
            (Some((started, why)), true) => {
                push_clipped(&mut gaps, *started, sample.t_ms, *why, from_ms, to_ms);
                open = None;
            }
            _ => {}
        }
    }
    if let Some((started, why)) = open {
        push_clipped(&mut gaps, started, to_ms, why, from_ms, to_ms);
    }
    gaps
}

fn push_clipped(gaps: &mut Vec<Gap>, from: u64, to: u64, why: Status, from_ms: u64, to_ms: u64) {
    let (from, to) = (from.max(from_ms), to.min(to_ms));
    if from < to {
        gaps.push(Gap {
            from_ms: from,
            to_ms: to,
            why,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(t_ms: u64, value: f64) -> Sample {
        Sample {
            t_ms,
            value: SampleValue::Number(value),
        }
    }

    fn at(t_ms: u64, value: SampleValue) -> Sample {
        Sample { t_ms, value }
    }

    /// Two buckets of 10 ms over [100, 120): 1, 5, 3 in the first, 7 and 2 in the second.
    fn known() -> Vec<Sample> {
        vec![
            n(100, 1.0),
            n(104, 5.0),
            n(109, 3.0),
            n(110, 7.0),
            n(119, 2.0),
        ]
    }

    fn values(series: &Series) -> Vec<(u64, f64)> {
        series
            .points
            .iter()
            .map(|point| match point.value {
                PointValue::Number(v) => (point.t_ms, v),
                PointValue::Text(_) => panic!("a text"),
            })
            .collect()
    }

    #[test]
    fn every_function_over_known_buckets() {
        let samples = known();
        let of = |how| values(&reduce(&samples, 100, 120, 2, how));
        assert_eq!(of(Reduce::Mean), [(100, 3.0), (110, 4.5)]);
        assert_eq!(of(Reduce::Min), [(100, 1.0), (110, 2.0)]);
        assert_eq!(of(Reduce::Max), [(100, 5.0), (110, 7.0)]);
        assert_eq!(of(Reduce::First), [(100, 1.0), (110, 7.0)]);
        assert_eq!(of(Reduce::Last), [(100, 3.0), (110, 2.0)]);
        assert_eq!(
            of(Reduce::MinMax),
            [(100, 1.0), (104, 5.0), (110, 7.0), (119, 2.0)]
        );
        assert_eq!(
            of(Reduce::Raw),
            [(100, 1.0), (104, 5.0), (109, 3.0), (110, 7.0), (119, 2.0)]
        );
        let mean = reduce(&samples, 100, 120, 2, Reduce::Mean);
        assert_eq!(
            mean.points
                .iter()
                .map(|p| (p.min, p.max, p.count))
                .collect::<Vec<_>>(),
            [(Some(1.0), Some(5.0), 3), (Some(2.0), Some(7.0), 2)]
        );
    }

    #[test]
    fn a_sample_on_an_edge_belongs_to_the_bucket_it_starts_and_the_end_is_excluded() {
        let samples = vec![
            n(99, 9.0),
            n(100, 1.0),
            n(109, 2.0),
            n(110, 3.0),
            n(120, 4.0),
        ];
        let series = reduce(&samples, 100, 120, 2, Reduce::Last);
        assert_eq!(values(&series), [(100, 2.0), (110, 3.0)]);
        // 3 buckets over 20 ms: 7 ms each (rounded up), never a fourth.
        assert_eq!(bucket_width(100, 120, 3), 7);
        // [100, 107) holds 100; [107, 114) holds 109 and 110; [114, 120) nothing (120 is out).
        let series = reduce(&samples, 100, 120, 3, Reduce::First);
        assert_eq!(values(&series), [(100, 1.0), (107, 2.0)]);
        let series = reduce(&samples, 100, 120, 3, Reduce::Last);
        assert_eq!(values(&series), [(100, 1.0), (107, 3.0)]);
    }

    #[test]
    fn empty_buckets_give_no_point() {
        let samples = vec![n(100, 1.0), n(150, 2.0)];
        let series = reduce(&samples, 100, 200, 10, Reduce::Mean);
        assert_eq!(values(&series), [(100, 1.0), (150, 2.0)]);
    }

    #[test]
    fn gaps_run_from_the_first_sample_without_a_value_to_the_next_with_one() {
        let samples = vec![
            at(90, SampleValue::NotReached),
            n(105, 1.0),
            at(110, SampleValue::ReadError),
            at(112, SampleValue::NotReached),
            n(115, 2.0),
            at(118, SampleValue::NotReached),
        ];
        let series = reduce(&samples, 100, 120, 2, Reduce::Mean);
        assert_eq!(
            series.gaps,
            [
                Gap {
                    from_ms: 100,
                    to_ms: 105,
                    why: Status::NotReached
                },
                Gap {
                    from_ms: 110,
                    to_ms: 115,
                    why: Status::ReadError
                },
                Gap {
                    from_ms: 118,
                    to_ms: 120,
                    why: Status::NotReached
                },
            ]
        );
        // Samples without a value count in no bucket.
        assert_eq!(values(&series), [(100, 1.0), (110, 2.0)]);
        assert_eq!(series.points[1].count, 1);
    }

    #[test]
    fn texts_are_kept_by_raw_first_and_last_and_left_out_of_numbers() {
        let samples = vec![
            at(100, SampleValue::Text("Red".into())),
            at(101, SampleValue::Text("Green".into())),
        ];
        let first = reduce(&samples, 100, 110, 1, Reduce::First);
        assert_eq!(first.points[0].value, PointValue::Text("Red".into()));
        let last = reduce(&samples, 100, 110, 1, Reduce::Last);
        assert_eq!(last.points[0].value, PointValue::Text("Green".into()));
        assert_eq!(last.points[0].count, 2);
        assert!(
            reduce(&samples, 100, 110, 1, Reduce::Mean)
                .points
                .is_empty()
        );
        assert_eq!(reduce(&samples, 100, 110, 1, Reduce::Raw).points.len(), 2);
    }

    #[test]
    fn buckets_of_a_minute_or_more_are_whole_minutes_and_never_more_than_asked() {
        // 30 days at 1 000 points: 43.2 min each, widened to 44 whole minutes from a whole
        // minute.
        let from = 1_764_583_200_000 + 12_345;
        let to = from + 30 * 86_400_000;
        let buckets = Buckets::new(from, to, 1000, Reduce::Mean);
        assert!(buckets.by_minute);
        assert_eq!(buckets.from_ms, 1_764_583_200_000);
        assert_eq!(
            buckets.to_ms,
            1_764_583_200_000 + 30 * 86_400_000 + MINUTE_MS
        );
        assert_eq!(buckets.width_ms, 44 * MINUTE_MS);
        assert!(buckets.count() <= 1000);
        for points in [1, 2, 7, 59, 60, 61, 719, 720, 721, 1000] {
            for (from, to) in [(0, 43_200_000), (59_999, 43_200_001), (61_000, 3_661_000)] {
                let buckets = Buckets::new(from, to, points, Reduce::Max);
                assert!(buckets.count() <= points as u64, "{from} {to} {points}");
                assert!(buckets.from_ms <= from && buckets.to_ms >= to);
                if buckets.by_minute {
                    assert_eq!(buckets.from_ms % MINUTE_MS, 0);
                    assert_eq!(buckets.width_ms % MINUTE_MS, 0);
                } else {
                    assert_eq!((buckets.from_ms, buckets.to_ms), (from, to));
                }
            }
        }
        // Under a minute, and raw, the range stays as asked.
        let short = Buckets::new(from, from + 600_000, 1000, Reduce::Mean);
        assert_eq!(
            (short.from_ms, short.width_ms, short.by_minute),
            (from, 600, false)
        );
        let raw = Buckets::new(from, to, 10, Reduce::Raw);
        assert_eq!((raw.from_ms, raw.to_ms, raw.by_minute), (from, to, false));
        // The answer says which range it covers.
        let series = reduce(&[n(from, 1.0)], from, to, 1000, Reduce::Mean);
        assert_eq!(
            (series.from_ms, series.to_ms),
            (buckets.from_ms, buckets.to_ms)
        );
    }

    /// `samples` of one minute, all with a value, as the archive sums them up (in time order:
    /// the earliest of equal extremes).
    fn summed(minute_ms: u64, samples: &[Sample]) -> MinuteSummary {
        let numbers: Vec<(u64, f64)> = samples
            .iter()
            .filter_map(|s| number_of(&s.value).map(|v| (s.t_ms, v)))
            .collect();
        let pick = |better: fn(f64, f64) -> bool| {
            numbers
                .iter()
                .fold(None, |found: Option<(u64, f64)>, &(t, v)| match found {
                    Some((_, best)) if !better(v, best) => found,
                    _ => Some((t, v)),
                })
        };
        MinuteSummary {
            minute_ms,
            count: samples.len(),
            numbers: numbers.len(),
            sum: numbers.iter().map(|(_, v)| v).sum(),
            min: pick(|v, best| v < best),
            max: pick(|v, best| v > best),
            first: samples[0].clone(),
            last: samples[samples.len() - 1].clone(),
        }
    }

    #[test]
    fn whole_minutes_summed_up_answer_as_their_samples_do() {
        let m = MINUTE_MS;
        let base = 1_764_583_200_000;
        // Minutes 0..6: 0, 1 and 4 summed up; 2 has a gap and is read as samples; 3 is
        // empty; 5 is the seam's samples. Equal extremes at different times in minute 1.
        let minute = |i: u64, values: &[(u64, f64)]| -> Vec<Sample> {
            values
                .iter()
                .map(|&(at, v)| n(base + i * m + at, v))
                .collect()
        };
        let m0 = minute(0, &[(0, 4.0), (20_000, -2.0), (59_999, 8.0)]);
        let m1 = minute(1, &[(5, 8.0), (10, -2.0), (30_000, 8.0), (40_000, -2.0)]);
        let m2 = vec![
            n(base + 2 * m + 1_000, 3.0),
            at(base + 2 * m + 2_000, SampleValue::NotReached),
            n(base + 2 * m + 50_000, 1.5),
        ];
        let m4 = vec![
            at(base + 4 * m, SampleValue::Text("Red".into())),
            n(base + 4 * m + 100, 6.5),
        ];
        let m5 = minute(5, &[(1, 0.5), (59_000, 7.0)]);
        let before = at(base - 1, SampleValue::ReadError);
        let all: Vec<Sample> = std::iter::once(before.clone())
            .chain([&m0, &m1, &m2, &m4, &m5].into_iter().flatten().cloned())
            .collect();
        let minutes = vec![
            summed(base, &m0),
            summed(base + m, &m1),
            summed(base + 4 * m, &m4),
        ];
        let mut samples = vec![before];
        samples.extend(m2.iter().cloned());
        samples.extend(m5.iter().cloned());
        for how in Reduce::ALL {
            for points in [1, 2, 3, 6] {
                let buckets = Buckets::new(base, base + 6 * m, points, how);
                assert!(how == Reduce::Raw || buckets.by_minute);
                let expected = reduce_in(&buckets, &all, &[], how);
                let answered = reduce_in(&buckets, &samples, &minutes, how);
                if how == Reduce::Raw {
                    // Raw never uses summaries: the caller reads every sample for it.
                    assert!(answered.points.len() < expected.points.len());
                } else {
                    assert_eq!(answered, expected, "{} in {points}", how.name());
                }
            }
        }
        let series = reduce_in(
            &Buckets::new(base, base + 6 * m, 3, Reduce::MinMax),
            &samples,
            &minutes,
            Reduce::MinMax,
        );
        // [0, 2): min -2 first at 0:20, max 8 first at 0:59.999; [2, 4): 1.5 and 3;
        // [4, 6): 0.5 and 7.
        assert_eq!(
            values(&series),
            [
                (base + 20_000, -2.0),
                (base + 59_999, 8.0),
                (base + 2 * m + 1_000, 3.0),
                (base + 2 * m + 50_000, 1.5),
                (base + 5 * m + 1, 0.5),
                (base + 5 * m + 59_000, 7.0),
            ]
        );
        // The read error before the range ends with minute 0's first sample, on its edge.
        assert_eq!(
            series.gaps,
            [Gap {
                from_ms: base + 2 * m + 2_000,
                to_ms: base + 2 * m + 50_000,
                why: Status::NotReached
            }]
        );
    }

    #[test]
    fn every_function_has_a_name_that_parses_back() {
        for how in Reduce::ALL {
            assert_eq!(Reduce::parse(how.name()), Some(how));
        }
        assert_eq!(Reduce::parse("average"), None);
    }
}
