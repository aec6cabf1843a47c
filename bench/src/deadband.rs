//! Scenario 5b: deadband subscriptions. 10 000 filtered subscriptions (500 streams × 20, 10
//! channels each, 100 ms) beside a witness stream that holds one unfiltered and one filtered
//! subscription over every channel: the gateway's CPU and memory, how much later the witness's
//! ticks arrive with the filtered load than without it, and whether every filtered event is
//! exactly what the deadband lets through (replayed here against the unfiltered values of the
//! same tick).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value as Json, json};
use tokio_util::sync::CancellationToken;

use crate::report::{Row, Verdict, megabytes, thousands};
use crate::scenarios::{Bench, CpuSpan, EventStream};

const STREAMS: usize = 500;
const PER_STREAM: usize = 20;
const CHANNELS_EACH: usize = 10;
const INTERVAL_MS: u64 = 100;
/// Above the monitors' noise (3.30 ± 0.02 V, VMON's small noise): what passes is a real move
/// (a ramp, the ADC inputs' slow sines) or a text that changed (the uptime, once a second).
const BAND: f64 = 0.5;

/// One event of the witness stream, as it arrived.
struct Arrival {
    at: Instant,
    data: Json,
}

pub async fn deadband(bench: &Bench) -> Row {
    let scenario = format!(
        "Deadband subscriptions: {} filtered × {CHANNELS_EACH} channels @ {INTERVAL_MS} ms",
        STREAMS * PER_STREAM
    );
    match measure(bench).await {
        Ok(mut row) => {
            row.scenario = scenario;
            row
        }
        Err(why) => Row::not_measurable("5b", scenario, format!("{why:#}")),
    }
}

async fn measure(bench: &Bench) -> anyhow::Result<Row> {
    let addr = bench.gateway.http_addr;
    let names = bench.names.clone();
    let window = bench.fanout_window;
    let stop = CancellationToken::new();

    // The witness: W (unfiltered) and F (filtered) over every channel, on one stream.
    let filtered = |channels: &[String]| json!({ "Channels": channels, "IntervalMs": INTERVAL_MS, "Deadband": { "Absolute": BAND } });
    let unfiltered = json!({ "Channels": names, "IntervalMs": INTERVAL_MS });
    let (mut witness, ids) = EventStream::subscribed(addr, &[unfiltered, filtered(&names)]).await?;
    let (w_id, f_id) = (ids[0].clone(), ids[1].clone());
    let arrivals: Arc<Mutex<Vec<Arrival>>> = Arc::default();
    let reader = {
        let (arrivals, stop) = (arrivals.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let (kind, data) = tokio::select! {
                    _ = stop.cancelled() => return Ok::<_, anyhow::Error>(()),
                    next = witness.next_event() => next?,
                };
                if kind == "values" {
                    let data: Json = serde_json::from_str(&data)?;
                    let at = Instant::now();
                    arrivals.lock().unwrap().push(Arrival { at, data });
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Without the filtered load.
    let quiet_from = Instant::now();
    let quiet_cpu = CpuSpan::start(&bench.gateway);
    tokio::time::sleep(window).await;
    let quiet_cpu = quiet_cpu.percent();
    let quiet_until = Instant::now();
    let rss_before = bench.gateway.rss_bytes().unwrap_or(0);

    // The filtered load: 500 streams × 20 subscriptions of 10 channels each.
    let counting = Arc::new(AtomicBool::new(false));
    // When each filtered event of the load arrived, for its lateness on the witness's grid.
    let load_arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let events = Arc::new(AtomicU64::new(0));
    let passed = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let open_limit = Arc::new(tokio::sync::Semaphore::new(32));
    let subscribed = Arc::new(AtomicU64::new(0));
    for stream in 0..STREAMS {
        let bodies: Vec<Json> = (0..PER_STREAM)
            .map(|k| {
                let first = (stream * PER_STREAM + k) % names.len();
                let channels: Vec<String> = (0..CHANNELS_EACH)
                    .map(|c| names[(first + c) % names.len()].clone())
                    .collect();
                filtered(&channels)
            })
            .collect();
        let load_arrivals = load_arrivals.clone();
        let (counting, events, passed, stop, open_limit, subscribed) = (
            counting.clone(),
            events.clone(),
            passed.clone(),
            stop.clone(),
            open_limit.clone(),
            subscribed.clone(),
        );
        tasks.spawn(async move {
            let permit = open_limit.acquire_owned().await?;
            let (mut stream, _) = EventStream::subscribed(addr, &bodies).await?;
            drop(permit);
            subscribed.fetch_add(1, Ordering::Relaxed);
            loop {
                let (kind, data) = tokio::select! {
                    _ = stop.cancelled() => return Ok::<_, anyhow::Error>(()),
                    next = stream.next_event() => next?,
                };
                if kind == "values" && counting.load(Ordering::Relaxed) {
                    load_arrivals.lock().unwrap().push(Instant::now());
                    let data: Json = serde_json::from_str(&data)?;
                    let count = |field: &str| data[field].as_object().map_or(0, |map| map.len());
                    events.fetch_add(1, Ordering::Relaxed);
                    passed.fetch_add(
                        (count("values") + count("errors")) as u64,
                        Ordering::Relaxed,
                    );
                }
            }
        });
    }
    let setup_started = Instant::now();
    while subscribed.load(Ordering::Relaxed) < STREAMS as u64 {
        if let Some(Ok(Err(why))) = tasks.try_join_next() {
            stop.cancel();
            return Err(why.context("a filtered stream could not be set up"));
        }
        if setup_started.elapsed() > Duration::from_secs(60) {
            stop.cancel();
            bail!("the filtered streams were not set up within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let setup = setup_started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    counting.store(true, Ordering::Relaxed);
    let loaded_from = Instant::now();
    let loaded_cpu = CpuSpan::start(&bench.gateway);
    let mut peak_rss = 0;
    while loaded_from.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak_rss = peak_rss.max(bench.gateway.rss_bytes().unwrap_or(0));
    }
    counting.store(false, Ordering::Relaxed);
    let loaded_cpu = loaded_cpu.percent();
    let loaded_until = Instant::now();
    let elapsed = loaded_until - loaded_from;
    stop.cancel();
    let mut failed = 0;
    while let Some(joined) = tasks.join_next().await {
        if !matches!(joined, Ok(Ok(()))) {
            failed += 1;
        }
    }
    reader.await.context("the witness reader")??;

    let arrivals = std::mem::take(&mut *arrivals.lock().unwrap());
    let ticks_in = |from: Instant, until: Instant| -> Vec<Instant> {
        arrivals
            .iter()
            .filter(|a| a.data["subscription"] == w_id.as_str() && a.at >= from && a.at < until)
            .map(|a| a.at)
            .collect()
    };
    let quiet = lateness(&ticks_in(quiet_from, quiet_until));
    let loaded_ticks = ticks_in(loaded_from, loaded_until);
    let loaded = lateness(&loaded_ticks);
    // The filtered events' delivery: the witness's own filtered subscription without the load,
    // and every filtered event of the load, each on the unfiltered witness's grid of its window.
    let filtered_in = |from: Instant, until: Instant| -> Vec<Instant> {
        arrivals
            .iter()
            .filter(|a| a.data["subscription"] == f_id.as_str() && a.at >= from && a.at < until)
            .map(|a| a.at)
            .collect()
    };
    let quiet_filtered = lateness_on(
        &ticks_in(quiet_from, quiet_until),
        &filtered_in(quiet_from, quiet_until),
    );
    let load_arrivals = std::mem::take(&mut *load_arrivals.lock().unwrap());
    let loaded_filtered = lateness_on(&loaded_ticks, &load_arrivals);
    let replay = replay(&arrivals, &w_id, &f_id);

    let events = events.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
    let passed = passed.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
    let read = (STREAMS * PER_STREAM * CHANNELS_EACH) as f64 * 1000.0 / INTERVAL_MS as f64;
    let added_p99 = loaded.p99 - quiet.p99;
    let mut row = Row::new("5b", "");
    row.gateway = format!(
        "CPU {loaded_cpu:.0} % of one core · RSS {} (peak) · {} events/s carrying {} channel values/s of {} offered · witness tick p99 {:.2} ms later than its best",
        megabytes(peak_rss),
        thousands(events),
        thousands(passed),
        thousands(read),
        loaded.p99
    );
    row.baseline = format!(
        "without the filtered load: CPU {quiet_cpu:.0} %, witness tick p99 {:.2} ms later than its best",
        quiet.p99
    );
    row.ratio = format!("{added_p99:+.2} ms delivery p99");
    row.target = "CPU ≤ 25 % of one core; ≤ 1 ms added to the delivery p99; every filtered event exactly what the filter lets through".to_owned();
    row.verdict = Verdict::from_bool(
        loaded_cpu <= 25.0
            && added_p99 <= 1.0
            && replay.mismatched == 0
            && replay.unpaired == 0
            && replay.checked > 0
            && failed == 0,
    );
    row.notes.push(format!(
        "{} streams × {PER_STREAM} subscriptions set up in {:.1} s; measured over {:.1} s each, without and with them; RSS before them {}; {failed} streams ended early; deadband {BAND} absolute over the {} plain readable channels of the default station",
        STREAMS,
        setup.as_secs_f64(),
        elapsed.as_secs_f64(),
        megabytes(rss_before),
        names.len()
    ));
    row.notes.push(format!(
        "filtered events' delivery on the unfiltered witness's grid (above its best): without the load, the witness's filtered subscription ({} events) p50 {:.2} / p99 {:.2} ms; with it, every filtered event of the load ({} events) p50 {:.2} / p99 {:.2} ms",
        quiet_filtered.count,
        quiet_filtered.p50,
        quiet_filtered.p99,
        loaded_filtered.count,
        loaded_filtered.p50,
        loaded_filtered.p99
    ));
    row.notes.push(format!(
        "witness replay: {} ticks checked, {} filtered events, {} channel values let through of {} read; {} ticks where the filtered event differed from the deadband rule applied to the same tick's unfiltered values, {} filtered events matching no tick; witness tick lateness p50 {:.2} / {:.2} ms (without / with the load)",
        replay.checked,
        replay.events,
        replay.passed,
        replay.offered,
        replay.mismatched,
        replay.unpaired,
        quiet.p50,
        loaded.p50
    ));
    Ok(row)
}

/// How much later than the best of them ticks on a 100 ms grid arrived, in ms.
struct Lateness {
    p50: f64,
    p99: f64,
    count: usize,
}

/// How much later than the best of `ticks` each of `arrivals` came, on the ticks' grid (the
/// offset modulo the interval from the first tick, less the ticks' smallest offset).
fn lateness_on(ticks: &[Instant], arrivals: &[Instant]) -> Lateness {
    let none = Lateness {
        p50: f64::NAN,
        p99: f64::NAN,
        count: arrivals.len(),
    };
    let Some(first) = ticks.first() else {
        return none;
    };
    let interval = INTERVAL_MS as f64;
    let offset = |at: &Instant| {
        let ms = if at >= first {
            at.duration_since(*first).as_secs_f64() * 1000.0
        } else {
            -(first.duration_since(*at).as_secs_f64() * 1000.0)
        };
        let offset = ms.rem_euclid(interval);
        if offset > interval / 2.0 {
            offset - interval
        } else {
            offset
        }
    };
    let best = ticks.iter().map(offset).fold(f64::INFINITY, f64::min);
    let mut offsets: Vec<f64> = arrivals.iter().map(|at| offset(at) - best).collect();
    if offsets.is_empty() {
        return none;
    }
    offsets.sort_by(f64::total_cmp);
    let at = |share: f64| offsets[((offsets.len() - 1) as f64 * share).round() as usize];
    Lateness {
        p50: at(0.50),
        p99: at(0.99),
        count: offsets.len(),
    }
}

/// Each arrival's offset on the tick grid (taken modulo the interval from the first), less the
/// smallest such offset: the delivery latency above the best case.
fn lateness(ticks: &[Instant]) -> Lateness {
    let Some(first) = ticks.first() else {
        return Lateness {
            p50: f64::NAN,
            p99: f64::NAN,
            count: 0,
        };
    };
    let interval = INTERVAL_MS as f64;
    let mut offsets: Vec<f64> = ticks
        .iter()
        .map(|at| {
            let ms = at.duration_since(*first).as_secs_f64() * 1000.0;
            let offset = ms.rem_euclid(interval);
            if offset > interval / 2.0 {
                offset - interval
            } else {
                offset
            }
        })
        .collect();
    let best = offsets.iter().copied().fold(f64::INFINITY, f64::min);
    for offset in &mut offsets {
        *offset -= best;
    }
    offsets.sort_by(f64::total_cmp);
    let at = |share: f64| offsets[((offsets.len() - 1) as f64 * share).round() as usize];
    Lateness {
        p50: at(0.50),
        p99: at(0.99),
        count: ticks.len(),
    }
}

#[derive(Default)]
struct Replay {
    checked: u64,
    events: u64,
    passed: u64,
    offered: u64,
    mismatched: u64,
    unpaired: u64,
}

/// What a channel showed: a number, any other value, or an error.
#[derive(Clone, PartialEq)]
enum Seen {
    Number(f64),
    Text(String),
    Error(String),
}

/// The channels of a `values` event with what each showed.
fn seen_in(data: &Json) -> HashMap<String, (Seen, Json)> {
    let mut seen = HashMap::new();
    if let Some(values) = data["values"].as_object() {
        for (name, value) in values {
            let text = value.as_str().unwrap_or_default();
            let shown = match text.parse::<f64>() {
                Ok(x) => Seen::Number(x),
                Err(_) => Seen::Text(text.to_owned()),
            };
            seen.insert(name.clone(), (shown, data["ageMs"][name].clone()));
        }
    }
    if let Some(errors) = data["errors"].as_object() {
        for (name, why) in errors {
            let why = why.as_str().unwrap_or_default().to_owned();
            seen.insert(name.clone(), (Seen::Error(why), Json::Null));
        }
    }
    seen
}

/// The deadband rule of `docs/events.md` without rate limits or heartbeats.
fn passes(last: Option<&Seen>, now: &Seen) -> bool {
    match (last, now) {
        (None, _) => true,
        (Some(Seen::Number(before)), Seen::Number(x)) => (x - before).abs() > BAND,
        (Some(before), now) => before != now,
    }
}

/// Pairs each filtered event of the witness with the unfiltered event of its tick (the same
/// values with the same ages), and checks that it carried exactly the channels the rule lets
/// through given what was sent before.
fn replay(arrivals: &[Arrival], w_id: &str, f_id: &str) -> Replay {
    let mut result = Replay::default();
    let ticks: Vec<HashMap<String, (Seen, Json)>> = arrivals
        .iter()
        .filter(|a| a.data["subscription"] == w_id)
        .map(|a| seen_in(&a.data))
        .collect();
    let filtered: Vec<HashMap<String, (Seen, Json)>> = arrivals
        .iter()
        .filter(|a| a.data["subscription"] == f_id)
        .map(|a| seen_in(&a.data))
        .collect();
    let Some((first, rest)) = filtered.split_first() else {
        return result;
    };
    let mut last: HashMap<String, Seen> = first
        .iter()
        .map(|(name, (seen, _))| (name.clone(), seen.clone()))
        .collect();
    // Each later filtered event's tick: the unfiltered event with the same values and ages.
    let mut paired: HashMap<usize, &HashMap<String, (Seen, Json)>> = HashMap::new();
    let mut from = 0;
    for event in rest {
        result.events += 1;
        let tick = (from..ticks.len()).find(|&k| {
            event
                .iter()
                .all(|(name, shown)| ticks[k].get(name) == Some(shown))
        });
        match tick {
            Some(k) => {
                paired.insert(k, event);
                from = k + 1;
            }
            None => result.unpaired += 1,
        }
    }
    // Every tick after the first filtered event's arrival but the last (whose filtered event
    // may have come after the recording stopped): the rule's choice against what went out.
    let first_at = arrivals
        .iter()
        .position(|a| a.data["subscription"] == f_id)
        .unwrap_or(0);
    let start = arrivals[..first_at]
        .iter()
        .filter(|a| a.data["subscription"] == w_id)
        .count();
    let end = ticks.len().saturating_sub(2);
    for (k, tick) in ticks.iter().enumerate().take(end + 1).skip(start) {
        result.checked += 1;
        result.offered += tick.len() as u64;
        let mut expected: Vec<&String> = tick
            .iter()
            .filter(|(name, (seen, _))| passes(last.get(*name), seen))
            .map(|(name, _)| name)
            .collect();
        let mut sent: Vec<&String> = paired.get(&k).map_or(Vec::new(), |e| e.keys().collect());
        expected.sort();
        sent.sort();
        if expected != sent {
            result.mismatched += 1;
        }
        result.passed += sent.len() as u64;
        if let Some(event) = paired.get(&k) {
            for (name, (seen, _)) in event.iter() {
                last.insert(name.clone(), seen.clone());
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_is_measured_from_the_best_arrival_on_the_grid() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Ticks 100 ms apart, arriving 2, 0, 1 and 30 ms later than the best of them.
        let ticks = [t0 + ms(2), t0 + ms(100), t0 + ms(201), t0 + ms(330)];
        let lateness = lateness(&ticks);
        assert!((lateness.p99 - 30.0).abs() < 1e-6, "{}", lateness.p99);
        assert!((lateness.p50 - 2.0).abs() < 1e-6, "{}", lateness.p50);
    }

    #[test]
    fn other_arrivals_are_measured_on_the_ticks_grid_from_its_best() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let ticks = [t0 + ms(3), t0 + ms(101), t0 + ms(202)];
        let arrivals = [t0 + ms(1), t0 + ms(105), t0 + ms(111), t0 + ms(301)];
        let lateness = lateness_on(&ticks, &arrivals);
        // Offsets 1, 5, 11 and 1 (modulo 100), less the ticks' best (1): 0, 4, 10, 0.
        assert_eq!(lateness.count, 4);
        assert!((lateness.p99 - 10.0).abs() < 1e-6, "{}", lateness.p99);
        assert!((lateness.p50 - 4.0).abs() < 1e-6, "{}", lateness.p50);
    }

    #[test]
    fn the_replay_flags_an_event_the_rule_would_not_send() {
        let t0 = Instant::now();
        let event = |id: &str, value: &str, age: f64| Arrival {
            at: t0,
            data: json!({ "subscription": id, "values": { "A": value }, "ageMs": { "A": age }, "errors": null }),
        };
        let good = [
            event("w", "1", 0.1),
            event("f", "1", 0.2),
            event("w", "1.01", 0.3),
            event("w", "2", 0.4),
            event("f", "2", 0.4),
            event("w", "2", 0.6),
        ];
        let replayed = replay(&good, "w", "f");
        assert_eq!(
            (replayed.checked, replayed.mismatched, replayed.unpaired),
            (2, 0, 0)
        );
        let bad = [
            event("w", "1", 0.1),
            event("f", "1", 0.2),
            event("w", "1.01", 0.3),
            event("f", "1.01", 0.3),
            event("w", "1.01", 0.5),
        ];
        let replayed = replay(&bad, "w", "f");
        assert_eq!((replayed.checked, replayed.mismatched), (1, 1));
    }
}
