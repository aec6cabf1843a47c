//! `api/numeric-results/...`: NumericResult channels and their targets, acquisitions with
//! their statistics (`acquire`), measurements kept per channel (`measure`, `result/*`).
//! The checks and the bookkeeping are `crate::numeric`'s; the station is reached through the
//! station service under the lease admission's send guard.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value as Json, json};

use super::call::{Answer, Call, known_channels, ok};
use crate::body::Deferred;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::lease::rfc3339;
use crate::link::StationUrl;
use crate::numeric::{self, Acquisition, Line, Measurement, Stats};
use crate::requests::numeric::{NumericAcquireRequest, NumericMeasureRequest};

/// `GET api/numeric-results/channels`.
pub(super) async fn channels(call: Call<'_>) -> Answer {
    let table = known_channels(call.gateway)?;
    let mut list = Vec::new();
    for sampler in numeric::samplers(&table) {
        let info = call
            .gateway
            .numeric
            .info(&call.gateway.station, sampler)
            .await?;
        list.push(json!({
            "netName": sampler.name,
            "alias": sampler.alias,
            "possibleTargetNames": sampler.options,
            "sampleRate": info.rate.round() as u64,
            "defaultSamples": info.default_samples,
        }));
    }
    ok(Json::Array(list))
}

/// `GET api/numeric-results/targets?channel=`.
pub(super) async fn targets(call: Call<'_>) -> Answer {
    let table = known_channels(call.gateway)?;
    let wanted = query_channel(call.query)?;
    let sampler = numeric::find_sampler(&table, &wanted)?;
    ok(json!(sampler.options))
}

/// `POST api/numeric-results/acquire {Channel, Target, Samples, Lsl?, Usl?}`: the samples and
/// their statistics; the kept result of `measure` is not touched.
pub(super) async fn acquire(call: Call<'_>, asked: NumericAcquireRequest) -> Answer {
    let limits = asked.limits()?;
    let samples = NumericAcquireRequest::samples(asked.samples.value)?;
    let acquisition = run(&call, asked.channel.value, asked.target.value, samples).await?;
    let stats = Stats::of(&acquisition.samples, limits);
    publish(call.gateway, &acquisition, &stats);
    call.gateway
        .numeric
        .record(measurement(&acquisition, stats.clone(), false), false);
    let mut bytes = Vec::with_capacity(acquisition.samples.len() * 8);
    for x in &acquisition.samples {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    ok(json!({
        "channel": acquisition.channel,
        "target": acquisition.target,
        "unit": acquisition.unit,
        "sampleRate": acquisition.rate.round() as u64,
        "started": rfc3339(acquisition.started),
        "durationMs": millis(acquisition.duration),
        "samples": base64::engine::general_purpose::STANDARD.encode(bytes),
        "stats": stats.to_json(),
    }))
}

/// `POST api/numeric-results/measure {ChannelNetName, TargetNetName, Samples, ReducedSet}`:
/// kept as the channel's result; its samples only when `ReducedSet` is false.
pub(super) async fn measure(call: Call<'_>, asked: NumericMeasureRequest) -> Answer {
    let (reduced, samples) = asked.reduced_and_samples()?;
    let acquisition = run(
        &call,
        asked.channel_net_name.value,
        asked.target_net_name.value,
        samples,
    )
    .await?;
    let stats = Stats::of(&acquisition.samples, None);
    publish(call.gateway, &acquisition, &stats);
    let kept = call
        .gateway
        .numeric
        .record(measurement(&acquisition, stats, !reduced), true);
    let stopped = kept.started + kept.duration;
    ok(json!({
        "channelNetName": kept.channel,
        "targetNetName": kept.target,
        "sampleCount": kept.samples.as_ref().map_or(0, Vec::len),
        "sampleRate": kept.rate.round() as u64,
        "reducedSet": reduced,
        "started": rfc3339(kept.started),
        "stopped": rfc3339(stopped),
        "duration": timespan(kept.duration),
    }))
}

/// `GET api/numeric-results/result/{mean|min|max|stdev|samples}?channel=`.
pub(super) async fn result(call: Call<'_>) -> Answer {
    let table = known_channels(call.gateway)?;
    let wanted = query_channel(call.query)?;
    let sampler = numeric::find_sampler(&table, &wanted)?;
    let statistic = call.id;
    if !["mean", "min", "max", "stdev", "samples"].contains(&statistic) {
        return Err(ApiError::not_found(format!(
            "not found: no result {statistic:?}; there are mean, min, max, stdev and samples"
        )));
    }
    let Some(kept) = call.gateway.numeric.kept(&sampler.name) else {
        return Err(ApiError::not_found(format!(
            "not found: {} has no result yet; POST api/numeric-results/measure first",
            sampler.name
        )));
    };
    let value = match statistic {
        "mean" => kept.stats.mean,
        "min" => kept.stats.min,
        "max" => kept.stats.max,
        "stdev" => kept.stats.stdev,
        _ => {
            return match &kept.samples {
                Some(samples) => ok(json!(samples)),
                None => Err(ApiError::bad_request(format!(
                    "the last measurement of {} was reduced (ReducedSet true): its samples were \
                     not kept; measure again with ReducedSet false",
                    sampler.name
                ))),
            };
        }
    };
    // The clients bind a number (.NET `double`: `GetMeanAsync` and the others in
    // `WebApiClient/Groups/NumericResultsGroup.cs` at 9195343; Python `float`:
    // `_get_stat` in `accordionq2/numeric_results.py` 5.28.1): a statistic the samples cannot
    // give is refused saying why, never a 200 with `null`.
    match value {
        Some(value) => ok(json!(value)),
        None => Err(ApiError::bad_request(no_statistic(
            &sampler.name,
            statistic,
            kept.stats.count,
        ))),
    }
}

/// Why the kept measurement of `channel` (`count` samples) gives no `statistic`.
fn no_statistic(channel: &str, statistic: &str, count: usize) -> String {
    let plural = if count == 1 { "" } else { "s" };
    if statistic == "stdev" && count < 2 {
        format!(
            "the last measurement of {channel} has {count} sample{plural}: its stdev needs 2 \
             samples or more; measure again with Samples 2 or more"
        )
    } else {
        format!(
            "the last measurement of {channel} ({count} sample{plural}) gives no finite \
             {statistic}; measure again"
        )
    }
}

/// Checks the request and runs the acquisition it asks for.
async fn run(
    call: &Call<'_>,
    channel: Deferred<String>,
    target: Deferred<String>,
    samples: i64,
) -> Result<Acquisition, ApiError> {
    let gateway = call.gateway;
    let table = known_channels(gateway)?;
    let sampler = numeric::find_sampler(&table, &channel.checked()?)?;
    let target = numeric::find_target(&table, sampler, &target.checked()?)?;
    let line = StationUrl::parse(&gateway.config.station.url)
        .map(|url| Line::of(&url))
        .unwrap_or(Line::Network);
    let info = gateway.numeric.info(&gateway.station, sampler).await?;
    // The acquisition's own time may be up to `station.max_operation_ms`: the link waits for
    // it on top of the request timeout, frame by frame (each frame sized to come within half
    // a request timeout), and the station service's bound on the change follows it.
    let count = numeric::check_count(samples, info.rate, line, gateway.config.max_operation())?;
    let plan = numeric::Plan {
        sampler: sampler.name.clone(),
        target,
        count,
        rate: info.rate,
        line,
        frame_samples: line.frame_samples(info.rate, gateway.link.request_timeout()),
    };
    gateway
        .numeric
        .acquire(
            &gateway.station,
            &call.admitted,
            call.change_origin()?,
            plan,
        )
        .await
        .map_err(ApiError::from)
}

fn measurement(a: &Acquisition, stats: Stats, keep_samples: bool) -> Measurement {
    Measurement {
        channel: a.channel.clone(),
        target: a.target.clone(),
        unit: a.unit.clone(),
        rate: a.rate,
        started: a.started,
        duration: a.duration,
        stats,
        samples: keep_samples.then(|| a.samples.clone()),
    }
}

/// A `numeric-result` event on every open stream whose reader may read the channel and its
/// target (the access rules' `read_cache`, as a subscription to them asks): its mean and
/// deviation are the target's values.
fn publish(gateway: &Gateway, a: &Acquisition, stats: &Stats) {
    let data = json!({
        "channel": a.channel,
        "target": a.target,
        "unit": a.unit,
        "count": stats.count,
        "mean": stats.mean,
        "stdev": stats.stdev,
        "started": rfc3339(a.started),
    });
    gateway.events.broadcast_about(
        &[&a.channel, &a.target],
        "numeric-result",
        &data.to_string(),
    );
}

/// `channel=` of the query, percent-decoded; 400 when missing.
fn query_channel(query: Option<&str>) -> Result<String, ApiError> {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.eq_ignore_ascii_case("channel"))
        .map(|(_, value)| percent_decode(value))
        .filter(|value| !value.is_empty())
        .ok_or_else(|| ApiError::bad_request("the query parameter channel is missing"))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (escaped, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, other) => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 10_000.0).round() / 10.0
}

/// A .NET `TimeSpan` as text: `hh:mm:ss.fffffff`.
fn timespan(duration: Duration) -> String {
    let secs = duration.as_secs();
    let ticks = duration.subsec_nanos() / 100;
    format!(
        "{:02}:{:02}:{:02}.{ticks:07}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_comes_from_the_query_percent_decoded() {
        assert_eq!(
            query_channel(Some("channel=0.1.ESH10000158.NumericResult")).unwrap(),
            "0.1.ESH10000158.NumericResult"
        );
        assert_eq!(query_channel(Some("x=1&Channel=a%20b%2")).unwrap(), "a b%2");
        assert!(query_channel(None).is_err());
        assert!(query_channel(Some("channel=")).is_err());
    }

    #[test]
    fn a_missing_statistic_says_why() {
        let one = no_statistic("0.8.X.NumericResult", "stdev", 1);
        assert!(
            one.contains("1 sample:") && one.contains("2 samples or more"),
            "{one}"
        );
        let odd = no_statistic("0.8.X.NumericResult", "mean", 5);
        assert!(
            odd.contains("5 samples") && odd.contains("no finite mean"),
            "{odd}"
        );
    }

    #[test]
    fn timespans_read_as_dotnet_writes_them() {
        assert_eq!(timespan(Duration::from_millis(100)), "00:00:00.1000000");
        assert_eq!(timespan(Duration::from_secs(3725)), "01:02:05.0000000");
    }
}
