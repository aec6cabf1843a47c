//! A sample as the archive's row: COPY's text format going in (`copy_row`), the columns a
//! query reads coming out (`sample_of`), and the spool's lines (JSON, one sample a line, each
//! batch after a line with its id).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::schema::{STATUS_GATEWAY_STOPPED, STATUS_NOT_REACHED, STATUS_OK, STATUS_READ_ERROR};
use crate::history::recorder::ArchivedSample;
use crate::history::ring::{Sample, SampleValue};
use crate::history::time_arg::format_time;

/// COPY's text format: a field with backslash, tab, newline or carriage return escaped.
fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            other => out.push(other),
        }
    }
    out
}

/// One line of COPY's text format: channel, t, status, value, text_value.
pub fn copy_row(sample: &ArchivedSample, out: &mut String) {
    let (status, value, text) = match &sample.sample.value {
        SampleValue::Number(number) if number.is_finite() => {
            (STATUS_OK, number.to_string(), "\\N".to_owned())
        }
        SampleValue::Number(number) => (
            STATUS_OK,
            (if number.is_nan() {
                "NaN"
            } else if *number > 0.0 {
                "Infinity"
            } else {
                "-Infinity"
            })
            .to_owned(),
            "\\N".to_owned(),
        ),
        SampleValue::Text(text) => (STATUS_OK, "\\N".to_owned(), escaped(text)),
        SampleValue::ReadError => (STATUS_READ_ERROR, "\\N".to_owned(), "\\N".to_owned()),
        SampleValue::NotReached => (STATUS_NOT_REACHED, "\\N".to_owned(), "\\N".to_owned()),
        SampleValue::GatewayStopped => (STATUS_GATEWAY_STOPPED, "\\N".to_owned(), "\\N".to_owned()),
    };
    out.push_str(&escaped(&sample.channel));
    out.push('\t');
    out.push_str(&format_time(sample.sample.t_ms));
    out.push('\t');
    out.push_str(&status.to_string());
    out.push('\t');
    out.push_str(&value);
    out.push('\t');
    out.push_str(&text);
    out.push('\n');
}

/// A row a query read.
pub fn sample_of(t_ms: i64, status: i16, value: Option<f64>, text: Option<String>) -> Sample {
    let value = match (status, value, text) {
        (STATUS_READ_ERROR, ..) => SampleValue::ReadError,
        (STATUS_NOT_REACHED, ..) => SampleValue::NotReached,
        (STATUS_GATEWAY_STOPPED, ..) => SampleValue::GatewayStopped,
        (_, _, Some(text)) => SampleValue::Text(text),
        (_, Some(number), None) => SampleValue::Number(number),
        (_, None, None) => SampleValue::ReadError,
    };
    Sample {
        t_ms: t_ms.max(0) as u64,
        value,
    }
}

/// The spool's line for one sample.
#[derive(Debug, Serialize, Deserialize)]
struct SpoolLine {
    c: String,
    t: u64,
    /// `n` number, `x` text, `e` read error, `u` station not reached.
    k: char,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    v: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    x: Option<String>,
}

pub fn spool_line(sample: &ArchivedSample) -> String {
    let (k, v, x) = match &sample.sample.value {
        SampleValue::Number(number) => ('n', Some(*number), None),
        SampleValue::Text(text) => ('x', None, Some(text.clone())),
        SampleValue::ReadError => ('e', None, None),
        SampleValue::NotReached => ('u', None, None),
        SampleValue::GatewayStopped => ('s', None, None),
    };
    let line = SpoolLine {
        c: sample.channel.to_string(),
        t: sample.sample.t_ms,
        k,
        v,
        x,
    };
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    text
}

/// The spool's line that starts a batch: its id, which the archive keeps for every batch it
/// took, so that a batch whose commit's answer was lost is not written twice.
pub fn spool_header(batch_id: &str) -> String {
    let mut text = serde_json::json!({ "batch": batch_id }).to_string();
    text.push('\n');
    text
}

fn header_of(line: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Header {
        batch: String,
    }
    line.starts_with("{\"batch\"")
        .then(|| serde_json::from_str::<Header>(line).ok())
        .flatten()
        .map(|header| header.batch)
}

/// Whether `line` is a sample's (not a batch's header).
pub fn is_sample_line(line: &str) -> bool {
    !line.starts_with("{\"batch\"")
}

/// A batch read back from the spool: its id (`None` for samples a gateway spooled before
/// batches had ids) and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct SpooledBatch {
    pub id: Option<String>,
    pub samples: Vec<ArchivedSample>,
}

/// The spool's text as its batches, in order; lines cut short are skipped.
pub fn spooled_batches(text: &str) -> Vec<SpooledBatch> {
    let mut batches: Vec<SpooledBatch> = Vec::new();
    for line in text.lines() {
        if let Some(id) = header_of(line) {
            batches.push(SpooledBatch {
                id: Some(id),
                samples: Vec::new(),
            });
        } else if let Some(sample) = from_spool_line(line) {
            match batches.last_mut() {
                Some(batch) => batch.samples.push(sample),
                None => batches.push(SpooledBatch {
                    id: None,
                    samples: vec![sample],
                }),
            }
        }
    }
    batches
}

/// A spool line back; `None` for a line cut short (the gateway stopped mid-write).
pub fn from_spool_line(line: &str) -> Option<ArchivedSample> {
    let line: SpoolLine = serde_json::from_str(line).ok()?;
    let value = match (line.k, line.v, line.x) {
        ('n', Some(number), _) => SampleValue::Number(number),
        // JSON has no NaN: a non-finite number comes back as null.
        ('n', None, _) => SampleValue::Number(f64::NAN),
        ('x', _, Some(text)) => SampleValue::Text(text),
        ('e', ..) => SampleValue::ReadError,
        ('u', ..) => SampleValue::NotReached,
        ('s', ..) => SampleValue::GatewayStopped,
        _ => return None,
    };
    Some(ArchivedSample {
        channel: Arc::from(line.c),
        sample: Sample {
            t_ms: line.t,
            value,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archived(channel: &str, t_ms: u64, value: SampleValue) -> ArchivedSample {
        ArchivedSample {
            channel: Arc::from(channel),
            sample: Sample { t_ms, value },
        }
    }

    #[test]
    fn copy_rows_escape_and_mark_nulls() {
        let mut out = String::new();
        copy_row(
            &archived("A\tB", 1_764_583_200_000, SampleValue::Number(1.5)),
            &mut out,
        );
        copy_row(
            &archived("S", 1_764_583_200_001, SampleValue::Text("x\\y\nz".into())),
            &mut out,
        );
        copy_row(
            &archived("S", 1_764_583_200_002, SampleValue::NotReached),
            &mut out,
        );
        assert_eq!(
            out,
            "A\\tB\t2025-12-01T10:00:00Z\t0\t1.5\t\\N\n\
             S\t2025-12-01T10:00:00.001Z\t0\t\\N\tx\\\\y\\nz\n\
             S\t2025-12-01T10:00:00.002Z\t2\t\\N\t\\N\n"
        );
    }

    #[test]
    fn spool_lines_come_back_as_they_went_and_a_cut_line_is_skipped() {
        for value in [
            SampleValue::Number(2.5),
            SampleValue::Text("Red".into()),
            SampleValue::ReadError,
            SampleValue::NotReached,
            SampleValue::GatewayStopped,
        ] {
            let sample = archived("V", 7, value);
            let line = spool_line(&sample);
            assert_eq!(from_spool_line(line.trim_end()), Some(sample));
        }
        let line = spool_line(&archived("V", 7, SampleValue::Number(1.0)));
        assert_eq!(from_spool_line(&line[..line.len() / 2]), None);
    }

    #[test]
    fn the_spool_keeps_each_batch_with_its_id() {
        let (a, b, c) = (
            archived("V", 1, SampleValue::Number(1.0)),
            archived("V", 2, SampleValue::NotReached),
            archived("W", 3, SampleValue::Text("x".into())),
        );
        // A spool from before batch ids, then two batches, the last cut short.
        let text = [
            spool_line(&a),
            spool_header("b1"),
            spool_line(&b),
            spool_line(&c),
            spool_header("b2"),
            spool_line(&a),
        ]
        .concat();
        let cut = &text[..text.len() - 5];
        assert_eq!(
            spooled_batches(cut),
            [
                SpooledBatch {
                    id: None,
                    samples: vec![a.clone()]
                },
                SpooledBatch {
                    id: Some("b1".into()),
                    samples: vec![b, c]
                },
                SpooledBatch {
                    id: Some("b2".into()),
                    samples: vec![]
                },
            ]
        );
        assert_eq!(text.lines().filter(|l| is_sample_line(l)).count(), 4);
    }

    #[test]
    fn rows_read_back_by_status() {
        assert_eq!(
            sample_of(5, 0, Some(1.0), None).value,
            SampleValue::Number(1.0)
        );
        assert_eq!(
            sample_of(5, 0, None, Some("Red".into())).value,
            SampleValue::Text("Red".into())
        );
        assert_eq!(sample_of(5, 1, None, None).value, SampleValue::ReadError);
        assert_eq!(sample_of(5, 2, None, None).value, SampleValue::NotReached);
    }
}
