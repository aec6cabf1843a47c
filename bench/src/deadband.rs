//! Scenario 5b: deadband subscriptions. 10 000 filtered subscriptions (500 streams × 20, 10
//! channels each, 100 ms) beside a witness stream that holds one unfiltered and one filtered
//! subscription over every channel: the gateway's CPU and memory, how much later the witness's
//! ticks arrive with the filtered load than without it (the median of interleaved rounds, the
//! load set up anew for each), and whether every filtered event is exactly what the deadband
//! lets through (replayed here against the unfiltered values of the same tick).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value as Json, json};
use tokio_util::sync::CancellationToken;

use crate::http::HttpConnection;
use crate::report::{Row, Verdict, megabytes, thousands};
use crate::scenarios::fanout::EventStream;
use crate::scenarios::{Bench, CpuSpan, body, median};
use hyper::Method;

const STREAMS: usize = 500;
const PER_STREAM: usize = 20;
const CHANNELS_EACH: usize = 10;
const INTERVAL_MS: u64 = 100;
/// Interleaved rounds (without the load, then with it); the verdict takes their median.
const ROUNDS: usize = 3;
/// How often the witness renews its subscriptions (they end 60 s after the last renewal).
const RENEW_EVERY: Duration = Duration::from_secs(20);
/// Above the monitors' noise (3.30 ± 0.02 V, VMON's small noise): what passes is a real move
/// (a ramp, the ADC inputs' slow sines) or a text that changed (the uptime, once a second).
const BAND: f64 = 0.5;

/// One event of the witness stream, as it arrived.
struct Arrival {
    at: Instant,
    data: Json,
}

/// The witness stream, read on a thread and runtime of its own until `stop`: an event's
/// arrival is timed when its bytes come, not when this process's runtime has got through the
/// load's 500 streams, whose events come at the same ticks.
struct Witness {
    thread: std::thread::JoinHandle<anyhow::Result<Vec<Arrival>>>,
}

impl Witness {
    /// Opens the stream with `subscriptions` on the witness's thread; their ids.
    async fn start(
        addr: std::net::SocketAddr,
        subscriptions: Vec<Json>,
        stop: CancellationToken,
    ) -> anyhow::Result<(Vec<String>, Witness)> {
        let (ready, subscribed) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("witness".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let mut stream = match EventStream::subscribed(addr, &subscriptions).await {
                        Ok((stream, ids)) => {
                            let _ = ready.send(Ok(ids));
                            stream
                        }
                        Err(why) => {
                            let _ = ready.send(Err(why));
                            return Ok(Vec::new());
                        }
                    };
                    let mut arrivals = Vec::new();
                    loop {
                        let (kind, data) = tokio::select! {
                            _ = stop.cancelled() => return Ok(arrivals),
                            next = stream.next_event() => next?,
                        };
                        let at = Instant::now();
                        if kind == "values" {
                            let data = serde_json::from_str(&data)?;
                            arrivals.push(Arrival { at, data });
                        }
                    }
                })
            })?;
        let witness = Witness { thread };
        match subscribed.await {
            Ok(Ok(ids)) => Ok((ids, witness)),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(witness.arrivals().await.err().unwrap_or_else(|| {
                anyhow::anyhow!("the witness thread ended before it subscribed")
            })),
        }
    }

    /// Every `values` event that arrived, once `stop` has ended the stream.
    async fn arrivals(self) -> anyhow::Result<Vec<Arrival>> {
        tokio::task::spawn_blocking(move || self.thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the witness thread panicked"))?
    }
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

    // The witness: W (unfiltered) and F (filtered) over every channel, on one stream, read
    // from before the first window to after the last.
    let unfiltered = json!({ "Channels": names, "IntervalMs": INTERVAL_MS });
    let (ids, witness) = Witness::start(
        addr,
        vec![unfiltered.clone(), filtered(&names)],
        stop.clone(),
    )
    .await
    .context("the witness stream")?;
    let (w_id, f_id) = (ids[0].clone(), ids[1].clone());
    // The witness's subscriptions outlive the rounds (longer than their 60 s) by being renewed,
    // as a client that keeps them does.
    let renewing = {
        let stop = stop.clone();
        let renewals = [(w_id.clone(), unfiltered), (f_id.clone(), filtered(&names))];
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok::<_, anyhow::Error>(()),
                    _ = tokio::time::sleep(RENEW_EVERY) => {}
                }
                // A connection of its own each time: the gateway closes one idle this long.
                let mut control = HttpConnection::open(addr).await?;
                for (id, subscription) in &renewals {
                    let path = format!("/api/subscriptions/{id}");
                    control
                        .call(Method::PUT, &path, Some(&body(subscription.clone())))
                        .await
                        .with_context(|| format!("renewing the witness's subscription {id}"))?;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Interleaved rounds: a window without the filtered load, then one with it (set up anew and
    // ended after it), as a single pair's p99 of about a hundred ticks moves by milliseconds
    // between runs on a shared machine.
    let rss_before = bench.gateway.rss_bytes().unwrap_or(0);
    let mut pairs = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let quiet_from = Instant::now();
        let quiet_cpu = CpuSpan::start(&bench.gateway);
        tokio::time::sleep(window).await;
        let quiet_cpu = quiet_cpu.percent();
        let quiet = (quiet_from, Instant::now());
        let loaded = filtered_load(bench, &names, stop.child_token()).await;
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(why) => {
                stop.cancel();
                return Err(why);
            }
        };
        pairs.push((quiet, quiet_cpu, loaded));
    }
    stop.cancel();
    renewing.await.context("the witness's renewals")??;

    let arrivals = witness.arrivals().await.context("the witness stream")?;
    let of_in = |id: &str, (from, until): (Instant, Instant)| -> Vec<Instant> {
        arrivals
            .iter()
            .filter(|a| a.data["subscription"] == id && a.at >= from && a.at < until)
            .map(|a| a.at)
            .collect()
    };
    let rounds: Vec<Round> = pairs
        .iter()
        .map(|(quiet, quiet_cpu, loaded)| {
            let quiet_ticks = of_in(&w_id, *quiet);
            let loaded_ticks = of_in(&w_id, (loaded.from, loaded.until));
            Round {
                quiet: lateness(&quiet_ticks),
                loaded: lateness(&loaded_ticks),
                quiet_cpu: *quiet_cpu,
                // The filtered events' delivery: the witness's own filtered subscription
                // without the load, and every filtered event of the load, each on the
                // unfiltered witness's grid of its window.
                quiet_filtered: lateness_on(&quiet_ticks, &of_in(&f_id, *quiet)),
                loaded_filtered: lateness_on(&loaded_ticks, &loaded.arrivals),
            }
        })
        .collect();
    if let Some(at) = rounds
        .iter()
        .position(|r| r.quiet.count == 0 || r.loaded.count == 0)
    {
        bail!("the witness saw no tick in a window of round {}", at + 1);
    }
    let replay = replay(&arrivals, &w_id, &f_id);
    let loads: Vec<&FilteredLoad> = pairs.iter().map(|(_, _, loaded)| loaded).collect();
    Ok(judged(
        &rounds,
        &loads,
        &replay,
        rss_before,
        names.len(),
        window,
    ))
}

/// The row of 5b from its rounds: judged on the median round's added p99 and the busiest
/// window's CPU.
fn judged(
    rounds: &[Round],
    loads: &[&FilteredLoad],
    replay: &Replay,
    rss_before: u64,
    channels: usize,
    window: Duration,
) -> Row {
    let added: Vec<f64> = rounds.iter().map(Round::added_p99).collect();
    let added_p99 = median(added.iter().copied());
    let middle = rounds
        .iter()
        .find(|round| round.added_p99() == added_p99)
        .unwrap_or(&rounds[0]);
    let loaded_cpu = loads.iter().map(|l| l.cpu).fold(0.0, f64::max);
    let quiet_cpu = rounds.iter().map(|r| r.quiet_cpu).fold(0.0, f64::max);
    let elapsed: f64 = loads.iter().map(|l| (l.until - l.from).as_secs_f64()).sum();
    let events = loads.iter().map(|l| l.events).sum::<u64>() as f64 / elapsed;
    let passed = loads.iter().map(|l| l.passed).sum::<u64>() as f64 / elapsed;
    let peak_rss = loads.iter().map(|l| l.peak_rss).max().unwrap_or(0);
    let failed: usize = loads.iter().map(|l| l.failed).sum();
    let read = (STREAMS * PER_STREAM * CHANNELS_EACH) as f64 * 1000.0 / INTERVAL_MS as f64;
    let mut row = Row::new("5b", "");
    row.gateway = format!(
        "CPU {loaded_cpu:.0} % of one core · RSS {} (peak) · {} events/s carrying {} channel values/s of {} offered · witness tick p99 {:.2} ms later than its best",
        megabytes(peak_rss),
        thousands(events),
        thousands(passed),
        thousands(read),
        middle.loaded.p99
    );
    row.baseline = format!(
        "without the filtered load: CPU {quiet_cpu:.0} %, witness tick p99 {:.2} ms later than its best",
        middle.quiet.p99
    );
    row.ratio = format!(
        "{added_p99:+.2} ms delivery p99 (median of {})",
        rounds.len()
    );
    row.target = "CPU ≤ 25 % of one core; ≤ 1 ms added to the delivery p99; every filtered event exactly what the filter lets through".to_owned();
    row.verdict = Verdict::from_bool(
        loaded_cpu <= 25.0
            && added_p99 <= 1.0
            && replay.mismatched == 0
            && replay.unpaired == 0
            && replay.checked > 0
            && failed == 0,
    );
    let setups: Vec<String> = loads
        .iter()
        .map(|l| format!("{:.1}", l.setup.as_secs_f64()))
        .collect();
    row.notes.push(format!(
        "{} interleaved rounds, each {:.1} s without the filtered load, then {:.1} s with it ({} streams × {PER_STREAM} subscriptions, set up in {} s and ended after the window); the median round's figures shown; RSS before the first {}; {failed} streams ended early; deadband {BAND} absolute over the {channels} plain readable channels of the default station",
        rounds.len(),
        window.as_secs_f64(),
        elapsed / loads.len().max(1) as f64,
        STREAMS,
        setups.join(" / "),
        megabytes(rss_before),
    ));
    let per_round: Vec<String> = rounds
        .iter()
        .map(|r| format!("{:.2}/{:.2}", r.quiet.p99, r.loaded.p99))
        .collect();
    row.notes.push(format!(
        "witness tick p99 above its best, without/with the load, round by round: {} ms (added: {})",
        per_round.join(", "),
        added
            .iter()
            .map(|a| format!("{a:+.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    row.notes.push(format!(
        "filtered events' delivery on the unfiltered witness's grid (above its best), the median round: without the load, the witness's filtered subscription ({} events) p50 {:.2} / p99 {:.2} ms; with it, every filtered event of the load ({} events) p50 {:.2} / p99 {:.2} ms",
        middle.quiet_filtered.count,
        middle.quiet_filtered.p50,
        middle.quiet_filtered.p99,
        middle.loaded_filtered.count,
        middle.loaded_filtered.p50,
        middle.loaded_filtered.p99
    ));
    row.notes.push(format!(
        "witness replay over every round: {} ticks checked, {} filtered events, {} channel values let through of {} read; {} ticks where the filtered event differed from the deadband rule applied to the same tick's unfiltered values, {} filtered events matching no tick; the median round's witness tick lateness p50 {:.2} / {:.2} ms (without / with the load)",
        replay.checked,
        replay.events,
        replay.passed,
        replay.offered,
        replay.mismatched,
        replay.unpaired,
        middle.quiet.p50,
        middle.loaded.p50
    ));
    row
}

/// One round of 5b: the witness's ticks without the load and with it.
struct Round {
    quiet: Lateness,
    loaded: Lateness,
    quiet_cpu: f64,
    quiet_filtered: Lateness,
    loaded_filtered: Lateness,
}

impl Round {
    /// What the load added to the witness's tick p99, in ms.
    fn added_p99(&self) -> f64 {
        self.loaded.p99 - self.quiet.p99
    }
}

/// The gateway's `subscriptions` gauge, from `GET /metrics`.
async fn live_subscriptions(addr: std::net::SocketAddr) -> anyhow::Result<u64> {
    let text = HttpConnection::open(addr)
        .await?
        .call(Method::GET, "/metrics", None)
        .await?;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find_map(|line| line.strip_prefix("station_gateway_subscriptions "))
        .and_then(|value| value.trim().parse().ok())
        .context("GET /metrics shows no station_gateway_subscriptions")
}

/// A subscription over `channels` with the scenario's interval and deadband.
fn filtered(channels: &[String]) -> Json {
    json!({ "Channels": channels, "IntervalMs": INTERVAL_MS, "Deadband": { "Absolute": BAND } })
}

/// One window with the filtered load: what it cost and what arrived.
struct FilteredLoad {
    from: Instant,
    until: Instant,
    cpu: f64,
    peak_rss: u64,
    setup: Duration,
    events: u64,
    passed: u64,
    /// When each filtered event of the load arrived, for its lateness on the witness's grid.
    arrivals: Vec<Instant>,
    failed: usize,
}

/// Sets up the filtered load (500 streams × 20 subscriptions of 10 channels each), measures
/// one window with it, and ends it.
async fn filtered_load(
    bench: &Bench,
    names: &[String],
    stop: CancellationToken,
) -> anyhow::Result<FilteredLoad> {
    let addr = bench.gateway.http_addr;
    let counting = Arc::new(AtomicBool::new(false));
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
    let from = Instant::now();
    let cpu = CpuSpan::start(&bench.gateway);
    let mut peak_rss = 0;
    while from.elapsed() < bench.fanout_window {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak_rss = peak_rss.max(bench.gateway.rss_bytes().unwrap_or(0));
    }
    counting.store(false, Ordering::Relaxed);
    let cpu = cpu.percent();
    let until = Instant::now();
    stop.cancel();
    let mut failed = 0;
    while let Some(joined) = tasks.join_next().await {
        if !matches!(joined, Ok(Ok(()))) {
            failed += 1;
        }
    }
    // The gateway ends a stream's subscriptions once it sees the stream closed; the next
    // window without the load starts when only the witness's two are left.
    let ended_from = Instant::now();
    loop {
        let live = live_subscriptions(addr).await?;
        if live <= 2 {
            break;
        }
        if ended_from.elapsed() > Duration::from_secs(30) {
            bail!("{live} subscriptions still live 30 s after the filtered load ended");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let arrivals = std::mem::take(&mut *load_arrivals.lock().unwrap());
    Ok(FilteredLoad {
        from,
        until,
        cpu,
        peak_rss,
        setup,
        events: events.load(Ordering::Relaxed),
        passed: passed.load(Ordering::Relaxed),
        arrivals,
        failed,
    })
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

    /// A round whose load added `added` ms to the witness's tick p99.
    fn round(added: f64) -> Round {
        let at = |p99| Lateness {
            p50: 0.5,
            p99,
            count: 100,
        };
        Round {
            quiet: at(2.0),
            loaded: at(2.0 + added),
            quiet_cpu: 1.0,
            quiet_filtered: at(1.0),
            loaded_filtered: at(1.0),
        }
    }

    fn load(cpu: f64) -> FilteredLoad {
        let from = Instant::now();
        FilteredLoad {
            from,
            until: from + Duration::from_secs(10),
            cpu,
            peak_rss: 60 << 20,
            setup: Duration::from_secs(2),
            events: 37_000,
            passed: 38_000,
            arrivals: Vec::new(),
            failed: 0,
        }
    }

    fn judge(added: &[f64]) -> Row {
        let rounds: Vec<Round> = added.iter().copied().map(round).collect();
        let loads: Vec<FilteredLoad> = added.iter().map(|_| load(4.0)).collect();
        let replay = Replay {
            checked: 300,
            ..Replay::default()
        };
        let loads: Vec<&FilteredLoad> = loads.iter().collect();
        judged(
            &rounds,
            &loads,
            &replay,
            10 << 20,
            54,
            Duration::from_secs(10),
        )
    }

    #[test]
    fn the_verdict_takes_the_median_round_not_the_worst_or_the_last() {
        let row = judge(&[3.5, 0.4, -1.2]);
        assert_eq!(row.verdict, Verdict::Met, "{}", row.ratio);
        assert!(row.ratio.starts_with("+0.40 ms"), "{}", row.ratio);
        assert!(row.gateway.contains("p99 2.40 ms"), "{}", row.gateway);
        assert!(
            row.notes[1].contains("+3.50, +0.40, -1.20"),
            "{}",
            row.notes[1]
        );

        let row = judge(&[0.2, 1.6, 2.5]);
        assert_eq!(row.verdict, Verdict::Missed, "{}", row.ratio);
        assert!(row.ratio.starts_with("+1.60 ms"), "{}", row.ratio);
    }

    #[test]
    fn the_busiest_window_judges_the_cpu_and_a_mismatch_fails_every_round() {
        let rounds: Vec<Round> = [0.1, 0.2, 0.3].into_iter().map(round).collect();
        let window = Duration::from_secs(10);
        let fine = Replay {
            checked: 300,
            ..Replay::default()
        };
        let busy = [load(4.0), load(26.0), load(4.0)];
        let busy: Vec<&FilteredLoad> = busy.iter().collect();
        let row = judged(&rounds, &busy, &fine, 0, 54, window);
        assert_eq!(row.verdict, Verdict::Missed, "{}", row.gateway);
        assert!(row.gateway.starts_with("CPU 26 %"), "{}", row.gateway);

        let calm = [load(4.0), load(4.0), load(4.0)];
        let calm: Vec<&FilteredLoad> = calm.iter().collect();
        assert_eq!(
            judged(&rounds, &calm, &fine, 0, 54, window).verdict,
            Verdict::Met
        );
        let mismatched = Replay {
            mismatched: 1,
            ..fine
        };
        let row = judged(&rounds, &calm, &mismatched, 0, 54, window);
        assert_eq!(row.verdict, Verdict::Missed);
    }

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
