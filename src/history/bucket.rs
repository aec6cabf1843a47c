//! A time range of samples reduced to what a query asks: `points` buckets of one function
//! (`raw`, `mean`, `min`, `max`, `first`, `last`, `minmax`) and the gaps — where the channel
//! had no value, and why. Pure: the samples and the range are passed in.

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

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    pub points: Vec<Point>,
    pub gaps: Vec<Gap>,
}

/// `samples` (in time order; any before `from_ms` only tell the state at `from_ms`) reduced
/// over `[from_ms, to_ms)` in `points` buckets of equal width (the last may be shorter).
/// Buckets without a value give no point: nothing is interpolated.
pub fn reduce(samples: &[Sample], from_ms: u64, to_ms: u64, points: usize, how: Reduce) -> Series {
    let to_ms = to_ms.max(from_ms);
    let gaps = gaps(samples, from_ms, to_ms);
    let in_range = samples
        .iter()
        .filter(|sample| sample.t_ms >= from_ms && sample.t_ms < to_ms && sample.value.is_ok());
    if how == Reduce::Raw {
        let points = in_range
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
        return Series { points, gaps };
    }
    let width = bucket_width(from_ms, to_ms, points);
    let mut out = Vec::new();
    let mut bucket: Option<Bucket<'_>> = None;
    for sample in in_range {
        let index = (sample.t_ms - from_ms) / width;
        if bucket.as_ref().is_some_and(|open| open.index != index) {
            out.extend(
                bucket
                    .take()
                    .into_iter()
                    .flat_map(|done| done.points(how, from_ms, width)),
            );
        }
        bucket.get_or_insert_with(|| Bucket::new(index)).add(sample);
    }
    out.extend(
        bucket
            .into_iter()
            .flat_map(|done| done.points(how, from_ms, width)),
    );
    Series { points: out, gaps }
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
    let mut gaps = Vec::new();
    let mut open: Option<(u64, Status)> = None;
    for sample in samples {
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
    fn every_function_has_a_name_that_parses_back() {
        for how in Reduce::ALL {
            assert_eq!(Reduce::parse(how.name()), Some(how));
        }
        assert_eq!(Reduce::parse("average"), None);
    }
}
