//! `GET /v1/history?channel=NAME&from=T&to=T&points=N&fn=F&format=json|csv`: a channel's
//! values over a time range, reduced to `points` buckets (`crate::history::bucket`), with its
//! gaps. Recent times come from memory, older ones from the archive (`[history] archive`).

use serde_json::{Value as Json, json};

use super::call::{Answer, Call, ok};
use crate::error::{ApiError, ErrorKind};
use crate::history::bucket::{Buckets, Point, PointValue, Reduce, Series, reduce_in};
use crate::history::time_arg::{format_time, parse_time};
use crate::reply::typed_response;

/// The most buckets one query may ask for, and the most samples a `raw` query returns.
pub const MAX_POINTS: usize = 100_000;
const DEFAULT_POINTS: usize = 1000;

/// What a query asks, every parameter checked.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryQuery {
    pub channel: String,
    pub from_ms: u64,
    pub to_ms: u64,
    pub points: usize,
    pub how: Reduce,
    pub csv: bool,
}

impl HistoryQuery {
    /// The query string's parameters; 400 naming the one at fault. `from` is 10 minutes
    /// before `to` by default, `to` now (just after: what was recorded this millisecond too), `points` 1000, `fn` mean, `format` json.
    pub fn parse(query: Option<&str>, now_ms: u64) -> Result<HistoryQuery, ApiError> {
        let (mut channel, mut from, mut to, mut points, mut how, mut format) =
            (None, None, None, None, None, None);
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let slot = match &*key {
                "channel" => &mut channel,
                "from" => &mut from,
                "to" => &mut to,
                "points" => &mut points,
                "fn" => &mut how,
                "format" => &mut format,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {other:?}: the parameters are channel, from, to, points, fn, format"
                    )));
                }
            };
            *slot = Some(value.into_owned());
        }
        let channel = channel
            .filter(|name| !name.is_empty())
            .ok_or_else(|| ApiError::bad_request("the query parameter channel is missing"))?;
        let time = |name: &str, text: Option<String>, default: u64| match text {
            None => Ok(default),
            Some(text) => parse_time(&text, now_ms).map_err(|error| {
                ApiError::bad_request(format!("the query parameter {name}: {error}"))
            }),
        };
        // `to` is excluded: now means "everything recorded so far", a sample of this very
        // millisecond too.
        let to_ms = match time("to", to, now_ms)? {
            at if at == now_ms => at + 1,
            at => at,
        };
        let from_ms = time("from", from, to_ms.saturating_sub(600_000))?;
        if from_ms >= to_ms {
            return Err(ApiError::bad_request(format!(
                "the query parameter from ({}) must be before to ({})",
                format_time(from_ms),
                format_time(to_ms)
            )));
        }
        let points = match points {
            None => DEFAULT_POINTS,
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_POINTS).contains(n))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "the query parameter points must be a whole number from 1 to {MAX_POINTS}; got {text:?}"
                    ))
                })?,
        };
        let how = match how {
            None => Reduce::Mean,
            Some(name) => Reduce::parse(&name).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "the query parameter fn must be one of raw, mean, min, max, first, last, minmax; got {name:?}"
                ))
            })?,
        };
        let csv = match format.as_deref() {
            None | Some("json") => false,
            Some("csv") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the query parameter format must be json or csv; got {other:?}"
                )));
            }
        };
        Ok(HistoryQuery {
            channel,
            from_ms,
            to_ms,
            points,
            how,
            csv,
        })
    }
}

/// `GET /v1/history`.
pub(super) async fn query(call: Call<'_>) -> Answer {
    let history = call.gateway.history.as_ref().ok_or_else(|| {
        ApiError::not_found("the value history is off ([history] enabled = false)")
    })?;
    let asked = HistoryQuery::parse(call.query, history.clock().now_ms())?;
    // A channel's history is read like its cached value: the access rules' read rights.
    call.gateway
        .station
        .may_read(&call.who(), std::slice::from_ref(&asked.channel))
        .map_err(|refusal| {
            ApiError::from(crate::link::LinkError::Refused(
                crate::link::GuardRefusal::from(refusal),
            ))
        })?;
    let info = call.gateway.station.info();
    let name = info.channels.station_name(&asked.channel).to_owned();
    let unit = info.channels.get(&name).map(|channel| channel.unit.clone());
    // Buckets of a minute or more are whole minutes: the archive's minutes answer them.
    let buckets = Buckets::new(asked.from_ms, asked.to_ms, asked.points, asked.how);
    let found = crate::history::query::found(
        history,
        call.gateway.history_archive.as_deref(),
        &name,
        &buckets,
    )
    .await
    .map_err(|error| ApiError::new(ErrorKind::HistoryArchiveUnavailable, error.to_string()))?;
    if found.is_none() && unit.is_none() {
        return Err(ApiError::not_found(format!(
            "no history of {}: no such channel, and nothing recorded under that name",
            asked.channel
        )));
    }
    let found = found.unwrap_or_default();
    let series = reduce_in(&buckets, &found.samples, &found.minutes, asked.how);
    if asked.how == Reduce::Raw && series.points.len() > MAX_POINTS {
        return Err(ApiError::bad_request(format!(
            "the query parameter fn=raw would return {} samples, more than {MAX_POINTS}: narrow from and to, or reduce with another fn",
            series.points.len()
        )));
    }
    if asked.csv {
        return Ok(typed_response(
            "text/csv; charset=utf-8",
            csv(&series).into_bytes(),
        ));
    }
    ok(document(&asked, &name, unit.as_deref(), &series))
}

fn value_json(value: &PointValue) -> Json {
    match value {
        PointValue::Number(number) => json!(number),
        PointValue::Text(text) => json!(text),
    }
}

/// The JSON answer; its `from` and `to` are the range the buckets cover (whole minutes when
/// a bucket is a minute or more).
pub fn document(asked: &HistoryQuery, name: &str, unit: Option<&str>, series: &Series) -> Json {
    let points: Vec<Json> = series
        .points
        .iter()
        .map(|point: &Point| {
            json!({
                "t": format_time(point.t_ms),
                "value": value_json(&point.value),
                "min": point.min,
                "max": point.max,
                "count": point.count,
            })
        })
        .collect();
    let gaps: Vec<Json> = series
        .gaps
        .iter()
        .map(|gap| {
            json!({
                "from": format_time(gap.from_ms),
                "to": format_time(gap.to_ms),
                "why": gap.why.name(),
            })
        })
        .collect();
    json!({
        "channel": name,
        "unit": unit,
        "from": format_time(series.from_ms),
        "to": format_time(series.to_ms),
        "fn": asked.how.name(),
        "points": points,
        "gaps": gaps,
    })
}

/// The CSV answer: `t,value,min,max,count`, one line a point; gaps as lines with an empty
/// value and the reason in a `gap` column.
pub fn csv(series: &Series) -> String {
    let mut out = String::from("t,value,min,max,count,gap\n");
    let number = |n: Option<f64>| n.map(|n| n.to_string()).unwrap_or_default();
    let mut gaps = series.gaps.iter().peekable();
    for point in &series.points {
        while let Some(gap) = gaps.next_if(|gap| gap.from_ms <= point.t_ms) {
            out.push_str(&format!(
                "{},,,,0,{}\n",
                format_time(gap.from_ms),
                gap.why.name()
            ));
        }
        let value = match &point.value {
            PointValue::Number(n) => n.to_string(),
            PointValue::Text(text) => format!("\"{}\"", text.replace('"', "\"\"")),
        };
        out.push_str(&format!(
            "{},{value},{},{},{},\n",
            format_time(point.t_ms),
            number(point.min),
            number(point.max),
            point.count
        ));
    }
    for gap in gaps {
        out.push_str(&format!(
            "{},,,,0,{}\n",
            format_time(gap.from_ms),
            gap.why.name()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_583_200_000;

    fn parse(query: &str) -> Result<HistoryQuery, String> {
        HistoryQuery::parse(Some(query), NOW).map_err(|error| error.message)
    }

    #[test]
    fn defaults_and_every_parameter() {
        let asked = parse("channel=VMON1").unwrap();
        assert_eq!(
            (
                asked.from_ms,
                asked.to_ms,
                asked.points,
                asked.how,
                asked.csv
            ),
            (NOW + 1 - 600_000, NOW + 1, 1000, Reduce::Mean, false)
        );
        let asked =
            parse("channel=0.4.X.VMON1&from=-1h&to=2025-12-01T10%3A00%3A00Z&points=60&fn=minmax&format=csv")
                .unwrap();
        assert_eq!(asked.channel, "0.4.X.VMON1");
        assert_eq!((asked.from_ms, asked.to_ms), (NOW - 3_600_000, NOW + 1));
        assert_eq!(
            (asked.points, asked.how, asked.csv),
            (60, Reduce::MinMax, true)
        );
    }

    #[test]
    fn bad_input_names_the_parameter() {
        for (query, named) in [
            ("from=-1h", "channel"),
            ("channel=V&from=yesterday", "from"),
            ("channel=V&to=soon", "to"),
            ("channel=V&from=-1m&to=-2m", "from"),
            ("channel=V&points=0", "points"),
            ("channel=V&points=many", "points"),
            ("channel=V&fn=average", "fn"),
            ("channel=V&format=xml", "format"),
            ("channel=V&colour=red", "\"colour\""),
        ] {
            let message = parse(query).unwrap_err();
            assert!(message.contains(named), "{query}: {message}");
        }
    }

    #[test]
    fn csv_puts_gaps_in_time_order() {
        use crate::history::bucket::Gap;
        use crate::history::ring::Status;
        let series = Series {
            from_ms: NOW,
            to_ms: NOW + 2000,
            points: vec![Point {
                t_ms: NOW + 1000,
                value: PointValue::Number(2.5),
                min: Some(2.0),
                max: Some(3.0),
                count: 4,
            }],
            gaps: vec![Gap {
                from_ms: NOW,
                to_ms: NOW + 1000,
                why: Status::NotReached,
            }],
        };
        assert_eq!(
            csv(&series),
            "t,value,min,max,count,gap\n\
             2025-12-01T10:00:00Z,,,,0,station not reached\n\
             2025-12-01T10:00:01Z,2.5,2,3,4,\n"
        );
    }
}
