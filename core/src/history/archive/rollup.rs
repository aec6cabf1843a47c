//! The archive's per-minute summaries: a batch's samples summed up per channel and minute
//! (`minute_rows`, merged into `{table}_minutes` by `schema::upsert_minutes` in the batch's
//! transaction), a row read back as the query's [`MinuteSummary`] (`summary_of`), and which
//! stretches a query still reads as samples (`sample_windows`). Pure.

use std::collections::HashMap;
use std::sync::Arc;

use crate::history::bucket::{MINUTE_MS, MinuteSummary};
use crate::history::recorder::ArchivedSample;
use crate::history::ring::{Sample, SampleValue};

/// One channel's samples of one minute within a batch, summed up. Times are ms into the
/// minute. The rules do not depend on the order the samples come in: the earliest of equal
/// extremes, the earliest first, the latest last.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteRow {
    pub channel: Arc<str>,
    pub minute_ms: u64,
    pub count: i32,
    pub numbers: i32,
    pub sum: f64,
    pub min: Option<(i32, f64)>,
    pub max: Option<(i32, f64)>,
    pub first: Option<(i32, SampleValue)>,
    pub last: Option<(i32, SampleValue)>,
    /// Samples without a value, or with a number that is not finite.
    pub irregular: i32,
}

impl MinuteRow {
    fn new(channel: Arc<str>, minute_ms: u64) -> MinuteRow {
        MinuteRow {
            channel,
            minute_ms,
            count: 0,
            numbers: 0,
            sum: 0.0,
            min: None,
            max: None,
            first: None,
            last: None,
            irregular: 0,
        }
    }

    fn add(&mut self, at: i32, value: &SampleValue) {
        match value {
            SampleValue::Number(number) if number.is_finite() => {
                let number = *number;
                self.numbers += 1;
                self.sum += number;
                if self
                    .min
                    .is_none_or(|(t, min)| number < min || (number == min && at < t))
                {
                    self.min = Some((at, number));
                }
                if self
                    .max
                    .is_none_or(|(t, max)| number > max || (number == max && at < t))
                {
                    self.max = Some((at, number));
                }
            }
            SampleValue::Text(_) => {}
            SampleValue::Number(_)
            | SampleValue::ReadError
            | SampleValue::NotReached
            | SampleValue::GatewayStopped => {
                self.irregular += 1;
                return;
            }
        }
        self.count += 1;
        if self.first.as_ref().is_none_or(|(t, _)| at < *t) {
            self.first = Some((at, value.clone()));
        }
        if self.last.as_ref().is_none_or(|(t, _)| at >= *t) {
            self.last = Some((at, value.clone()));
        }
    }
}

/// `batch` summed up per channel and minute, ordered by channel and minute.
pub fn minute_rows(batch: &[ArchivedSample]) -> Vec<MinuteRow> {
    let mut rows: HashMap<(&str, u64), MinuteRow> = HashMap::new();
    for archived in batch {
        let t_ms = archived.sample.t_ms;
        let minute_ms = t_ms - t_ms % MINUTE_MS;
        rows.entry((&archived.channel, minute_ms))
            .or_insert_with(|| MinuteRow::new(archived.channel.clone(), minute_ms))
            .add((t_ms - minute_ms) as i32, &archived.sample.value);
    }
    let mut rows: Vec<MinuteRow> = rows.into_values().collect();
    rows.sort_by(|a, b| (&a.channel, a.minute_ms).cmp(&(&b.channel, b.minute_ms)));
    rows
}

/// A value as its number and text columns.
pub fn value_columns(value: Option<&SampleValue>) -> (Option<f64>, Option<String>) {
    match value {
        Some(SampleValue::Number(number)) => (Some(*number), None),
        Some(SampleValue::Text(text)) => (None, Some(text.clone())),
        _ => (None, None),
    }
}

/// One row of `{table}_minutes` as read (the columns of `schema::select_minutes`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoredMinute {
    pub minute_ms: i64,
    pub count: i32,
    pub numbers: i32,
    pub sum: f64,
    pub min: Option<f64>,
    pub min_ms: Option<i32>,
    pub max: Option<f64>,
    pub max_ms: Option<i32>,
    pub first_ms: Option<i32>,
    pub first_value: Option<f64>,
    pub first_text: Option<String>,
    pub last_ms: Option<i32>,
    pub last_value: Option<f64>,
    pub last_text: Option<String>,
    pub irregular: i32,
}

fn taken(
    minute_ms: u64,
    at: Option<i32>,
    number: Option<f64>,
    text: Option<String>,
) -> Option<Sample> {
    let t_ms = minute_ms + u64::try_from(at?).ok()?;
    let value = match (number, text) {
        (_, Some(text)) => SampleValue::Text(text),
        (Some(number), None) => SampleValue::Number(number),
        (None, None) => return None,
    };
    Some(Sample { t_ms, value })
}

/// A stored minute as the query's summary; `None` when its samples must be read instead (a
/// sample without a value or a number not finite among them, or a row not whole).
pub fn summary_of(row: StoredMinute) -> Option<MinuteSummary> {
    if row.irregular != 0 || row.count <= 0 {
        return None;
    }
    let minute_ms = u64::try_from(row.minute_ms).ok()?;
    let extreme =
        |at: Option<i32>, value: Option<f64>| Some((minute_ms + u64::try_from(at?).ok()?, value?));
    let (min, max) = (extreme(row.min_ms, row.min), extreme(row.max_ms, row.max));
    if row.numbers > 0 && (min.is_none() || max.is_none()) {
        return None;
    }
    Some(MinuteSummary {
        minute_ms,
        count: row.count as usize,
        numbers: row.numbers.max(0) as usize,
        sum: row.sum,
        min,
        max,
        first: taken(minute_ms, row.first_ms, row.first_value, row.first_text)?,
        last: taken(minute_ms, row.last_ms, row.last_value, row.last_text)?,
    })
}

/// The stretches a query of `[from_ms, to_ms)` (`from_ms` a whole minute) reads as samples:
/// the minutes in `irregular` (whole minutes before `to_ms`'s, in time order) and the part
/// of a minute at the end; neighbours joined.
pub fn sample_windows(irregular: &[u64], from_ms: u64, to_ms: u64) -> Vec<(u64, u64)> {
    let whole_to = (to_ms - to_ms % MINUTE_MS).max(from_ms);
    let mut windows: Vec<(u64, u64)> = Vec::new();
    let minutes = irregular
        .iter()
        .map(|&minute| (minute, minute + MINUTE_MS))
        .chain((whole_to < to_ms).then_some((whole_to, to_ms)));
    for (from, to) in minutes {
        match windows.last_mut() {
            Some(last) if last.1 == from => last.1 = to,
            _ => windows.push((from, to)),
        }
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 1_764_583_200_000;

    fn archived(channel: &str, t_ms: u64, value: SampleValue) -> ArchivedSample {
        ArchivedSample {
            channel: Arc::from(channel),
            sample: Sample { t_ms, value },
        }
    }

    fn stored(row: &MinuteRow) -> StoredMinute {
        let (first_value, first_text) = value_columns(row.first.as_ref().map(|(_, v)| v));
        let (last_value, last_text) = value_columns(row.last.as_ref().map(|(_, v)| v));
        StoredMinute {
            minute_ms: row.minute_ms as i64,
            count: row.count,
            numbers: row.numbers,
            sum: row.sum,
            min: row.min.map(|(_, v)| v),
            min_ms: row.min.map(|(t, _)| t),
            max: row.max.map(|(_, v)| v),
            max_ms: row.max.map(|(t, _)| t),
            first_ms: row.first.as_ref().map(|(t, _)| *t),
            first_value,
            first_text,
            last_ms: row.last.as_ref().map(|(t, _)| *t),
            last_value,
            last_text,
            irregular: row.irregular,
        }
    }

    #[test]
    fn a_batch_is_summed_up_per_channel_and_minute_whatever_its_order() {
        let batch = vec![
            archived("B", BASE + 61_000, SampleValue::Number(1.0)),
            archived("A", BASE + 30_000, SampleValue::Number(5.0)),
            archived("A", BASE + 10_000, SampleValue::Number(-1.0)),
            archived("A", BASE + 20_000, SampleValue::Number(5.0)),
            archived("A", BASE + 40_000, SampleValue::Number(-1.0)),
            archived("A", BASE + 50_000, SampleValue::Text("Red".into())),
            archived("A", BASE + 60_000, SampleValue::NotReached),
        ];
        let rows = minute_rows(&batch);
        assert_eq!(
            rows.iter()
                .map(|r| (&*r.channel, r.minute_ms - BASE))
                .collect::<Vec<_>>(),
            [("A", 0), ("A", 60_000), ("B", 60_000)]
        );
        let a = &rows[0];
        assert_eq!((a.count, a.numbers, a.sum, a.irregular), (5, 4, 8.0, 0));
        assert_eq!((a.min, a.max), (Some((10_000, -1.0)), Some((20_000, 5.0))));
        assert_eq!(a.first, Some((10_000, SampleValue::Number(-1.0))));
        assert_eq!(a.last, Some((50_000, SampleValue::Text("Red".into()))));
        assert_eq!((rows[1].count, rows[1].irregular), (0, 1));
    }

    #[test]
    fn a_minute_with_a_gap_or_a_number_not_finite_is_read_as_samples() {
        let clean = minute_rows(&[
            archived("A", BASE + 1, SampleValue::Number(2.0)),
            archived("A", BASE + 2, SampleValue::Text("x".into())),
        ]);
        let summary = summary_of(stored(&clean[0])).unwrap();
        assert_eq!(
            summary.first,
            Sample {
                t_ms: BASE + 1,
                value: SampleValue::Number(2.0)
            }
        );
        assert_eq!(
            summary.last,
            Sample {
                t_ms: BASE + 2,
                value: SampleValue::Text("x".into())
            }
        );
        assert_eq!(
            (summary.min, summary.max),
            (Some((BASE + 1, 2.0)), Some((BASE + 1, 2.0)))
        );
        for odd in [
            SampleValue::Number(f64::NAN),
            SampleValue::Number(f64::INFINITY),
            SampleValue::ReadError,
            SampleValue::NotReached,
            SampleValue::GatewayStopped,
        ] {
            let rows = minute_rows(&[
                archived("A", BASE + 1, SampleValue::Number(2.0)),
                archived("A", BASE + 2, odd),
            ]);
            assert_eq!(rows[0].irregular, 1);
            assert_eq!(summary_of(stored(&rows[0])), None);
        }
    }

    #[test]
    fn samples_are_read_for_irregular_minutes_and_the_last_part_minute() {
        let m = MINUTE_MS;
        assert_eq!(
            sample_windows(
                &[BASE + m, BASE + 2 * m, BASE + 5 * m],
                BASE,
                BASE + 6 * m + 10
            ),
            [(BASE + m, BASE + 3 * m), (BASE + 5 * m, BASE + 6 * m + 10)]
        );
        assert_eq!(sample_windows(&[], BASE, BASE + 6 * m), []);
        assert_eq!(sample_windows(&[], BASE, BASE + 10), [(BASE, BASE + 10)]);
    }
}
