//! Scenario 5d, slow readers: an event stream that never leaves a reader silently wrong.
//!
//! 5d, slow readers: 1 000 streams (`--streams`), each subscribed to 10 channels at 100 ms,
//! eight of them set points the harness moves all along; in one run every reader keeps up, in
//! the other a third of them are ten times too slow (a 4 KB receive buffer, one event taken a
//! second where their subscription makes ten). Interleaved rounds, each on a fresh gateway:
//! the gateway's CPU (and its own runtime's thread, where the scheduler runs, apart from the
//! connection threads), every fast reader's delivery p99, the memory a slow stream costs, and,
//! once the set points are set one last time, how long until every slow reader shows exactly
//! the station's values.
//!
//! The readers are plain sockets parsing the chunked `text/event-stream` themselves
//! (`event_reader.rs`), so that a slow one holds no more than its receive buffer and its own
//! few bytes. Scenario 5e, reconnects, is in `reconnects.rs`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value as Json, json};
use tokio_util::sync::CancellationToken;

use crate::child::{GatewayProcess, rss_of};
use crate::http::HttpConnection;
use crate::report::{Row, Verdict, megabytes};
use crate::scenarios::{Bench, CpuSpan, body, median, wait_until_serving};

use crate::event_reader::{INTERVAL_MS, opened};
/// One reader in this many is slow.
const SLOW_ONE_IN: usize = 3;
/// A slow reader takes one event this often: ten times slower than its subscription sends.
const SLOW_EVERY: Duration = Duration::from_secs(1);
/// A slow reader's receive buffer (what a slow network or client leaves in flight).
const SLOW_RECEIVE_BUFFER: u32 = 4096;
/// Interleaved rounds: without slow readers, then with them.
const ROUNDS: usize = 2;
/// The longest a slow reader may take to show the station's last values.
const CONVERGE_WITHIN: Duration = Duration::from_secs(120);
/// The set points the harness moves (and, last, sets to values every reader must show).
const SET_POINTS: [&str; 8] = [
    "0.4.ESH10000662.VSET1",
    "0.4.ESH10000662.VSET2",
    "0.4.ESH10000662.VSET3",
    "0.4.ESH10000662.VSET4",
    "0.4.ESH10000662.ISET1",
    "0.4.ESH10000662.ISET2",
    "0.4.ESH10000662.ISET3",
    "0.4.ESH10000662.ISET4",
];
const MONITORS: [&str; 2] = ["0.1.ESH10000158.MON_3V3", "0.4.ESH10000662.VMON1"];

/// Every channel a reader subscribes to: the set points the harness moves, then the monitors.
pub(crate) fn channels() -> Vec<&'static str> {
    SET_POINTS.iter().chain(MONITORS.iter()).copied().collect()
}

/// What a reader showed last of each channel (`values` events and snapshots).
type View = HashMap<String, String>;

fn apply_values(view: &mut View, data: &Json) {
    if let Some(values) = data["values"].as_object() {
        for (name, value) in values {
            if let Some(text) = value.as_str() {
                view.insert(name.clone(), text.to_owned());
            }
        }
    }
}

/// One run of 5d: its figures.
struct Run {
    slow: usize,
    fast: usize,
    /// The gateway's CPU over the window, % of one core; its own runtime's thread (the
    /// scheduler's) and the connection threads.
    cpu: f64,
    runtime_cpu: f64,
    connections_cpu: f64,
    rss_before: u64,
    rss_end: u64,
    /// Every fast reader's delivery p99 on the tick grid, ms: the largest and the median.
    fast_p99_max: f64,
    fast_p99_median: f64,
    fast_events_per_second: f64,
    /// How long after the last set every slow reader showed the station's values; `None`:
    /// some did not within [`CONVERGE_WITHIN`] (how many in `unconverged`).
    converged_after: Option<Duration>,
    unconverged: usize,
    slow_events: u64,
    failed: usize,
}

/// CPU time of the gateway's threads by group: (its own runtime and the rest, the connection
/// threads `http-N`).
fn thread_cpu(pid: u32) -> (Duration, Duration) {
    let mut runtime = Duration::ZERO;
    let mut connections = Duration::ZERO;
    let tick = 100.0; // USER_HZ
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (runtime, connections);
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks = |index: usize| {
            fields
                .get(index)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime are fields 14 and 15 of stat: 11 and 12 after the name.
        let time = Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / tick);
        if name.starts_with("http-") {
            connections += time;
        } else {
            runtime += time;
        }
    }
    (runtime, connections)
}

/// Where the best arrivals are on the grid: the offset that follows the largest empty stretch
/// of the circle of offsets (arrivals come just after the gateway's ticks and spread late from
/// there; the stretch before a tick is empty), so that lateness is measured from there even
/// when arrivals straddle the grid's wrap.
fn earliest_on_grid(offsets: &[f64]) -> f64 {
    let mut sorted = offsets.to_vec();
    sorted.sort_by(f64::total_cmp);
    let Some(&first) = sorted.first() else {
        return 0.0;
    };
    let interval = INTERVAL_MS as f64;
    let mut best = (first + interval - sorted[sorted.len() - 1], first);
    for pair in sorted.windows(2) {
        let gap = pair[1] - pair[0];
        if gap > best.0 {
            best = (gap, pair[1]);
        }
    }
    best.1
}

/// Each offset of `arrivals` on the 100 ms grid from `origin`, in ms.
fn grid_offsets(arrivals: &[Instant], origin: Instant) -> Vec<f64> {
    let interval = INTERVAL_MS as f64;
    arrivals
        .iter()
        .map(|at| {
            let ms = at.duration_since(origin).as_secs_f64() * 1000.0;
            ms.rem_euclid(interval)
        })
        .collect()
}

fn percentile(sorted: &[f64], share: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * share).round() as usize]
}

/// Moves the set points until `stop`, one every 250 ms, then sets each one last time; the
/// last values.
async fn move_set_points(
    addr: SocketAddr,
    stop: CancellationToken,
    round: u64,
) -> anyhow::Result<HashMap<String, f64>> {
    let mut control = HttpConnection::open(addr).await?;
    let value_of = |name: &str, step: u64| -> f64 {
        let n = SET_POINTS.iter().position(|s| *s == name).unwrap_or(0) as u64;
        if name.contains("VSET") {
            (100 + (step * 7 + n * 13 + round * 3) % 900) as f64
        } else {
            (1 + (step * 3 + n + round) % 9) as f64
        }
    };
    let mut step = 0u64;
    while !stop.is_cancelled() {
        let name = SET_POINTS[(step as usize) % SET_POINTS.len()];
        set(&mut control, name, value_of(name, step)).await?;
        step += 1;
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
    let mut last = HashMap::new();
    for name in SET_POINTS {
        let value = value_of(name, step + 1_000);
        set(&mut control, name, value).await?;
        last.insert(name.to_owned(), value);
    }
    Ok(last)
}

/// Writes `value` to the set point `name` through the gateway.
async fn set(control: &mut HttpConnection, name: &str, value: f64) -> anyhow::Result<()> {
    let request = body(json!({ "Name": name, "Value": value.to_string() }));
    control.post("/api/resources/value/set", &request).await?;
    Ok(())
}

fn shows(view: &View, last: &HashMap<String, f64>) -> bool {
    last.iter().all(|(name, value)| {
        view.get(name)
            .and_then(|text| text.parse::<f64>().ok())
            .is_some_and(|shown| (shown - value).abs() < 1e-6)
    })
}

async fn run(bench: &Bench, slow_share: bool, round: u64) -> anyhow::Result<Run> {
    let gateway = bench
        .recipe
        .spawn()
        .await
        .context("cannot start a fresh gateway")?;
    wait_until_serving(&gateway, &bench.names[0], Duration::from_secs(20)).await?;
    let measured = run_on(bench, &gateway, slow_share, round).await;
    gateway.stop().await;
    measured
}

async fn run_on(
    bench: &Bench,
    gateway: &GatewayProcess,
    slow_share: bool,
    round: u64,
) -> anyhow::Result<Run> {
    let addr = gateway.http_addr;
    let streams = bench.fanout_streams;
    let channels = channels();
    let counting = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let subscribed = Arc::new(AtomicU64::new(0));
    let slow_events = Arc::new(AtomicU64::new(0));
    let open_limit = Arc::new(tokio::sync::Semaphore::new(32));
    let rss_before = rss_of(gateway.pid).unwrap_or(0);
    let mut fast_tasks = tokio::task::JoinSet::new();
    let mut slow_views: Vec<Arc<Mutex<View>>> = Vec::new();
    let mut slow_tasks = tokio::task::JoinSet::new();
    for n in 0..streams {
        let slow = slow_share && n % SLOW_ONE_IN == SLOW_ONE_IN - 1;
        let channels = channels.clone();
        let (counting, stop, subscribed, open_limit) = (
            counting.clone(),
            stop.clone(),
            subscribed.clone(),
            open_limit.clone(),
        );
        if slow {
            let view = Arc::new(Mutex::new(View::new()));
            slow_views.push(view.clone());
            let slow_events = slow_events.clone();
            slow_tasks.spawn(async move {
                let permit = open_limit.acquire_owned().await?;
                let (mut events, _) =
                    opened(addr, &channels, Some(SLOW_RECEIVE_BUFFER), 512).await?;
                drop(permit);
                subscribed.fetch_add(1, Ordering::Relaxed);
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => return anyhow::Ok(()),
                        next = events.next() => next?,
                    };
                    let Some(event) = next else {
                        bail!("a slow reader's stream ended");
                    };
                    if event.name == "values" || event.name == "snapshot" {
                        let data: Json = serde_json::from_str(&event.data)?;
                        apply_values(&mut view.lock().unwrap(), &data);
                        slow_events.fetch_add(1, Ordering::Relaxed);
                    }
                    if event.name == "closed" {
                        bail!("a slow reader's stream was closed: {}", event.data);
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return anyhow::Ok(()),
                        _ = tokio::time::sleep(SLOW_EVERY) => {}
                    }
                }
            });
        } else {
            fast_tasks.spawn(async move {
                let permit = open_limit.acquire_owned().await?;
                let (mut events, _) = opened(addr, &channels, None, 64 * 1024).await?;
                drop(permit);
                subscribed.fetch_add(1, Ordering::Relaxed);
                let mut arrivals = Vec::new();
                loop {
                    let next = tokio::select! {
                        _ = stop.cancelled() => return anyhow::Ok(arrivals),
                        next = events.next() => next?,
                    };
                    let Some(event) = next else {
                        bail!("a fast reader's stream ended");
                    };
                    if event.name == "values" && counting.load(Ordering::Relaxed) {
                        arrivals.push(Instant::now());
                    }
                }
            });
        }
    }
    let setup = Instant::now();
    while subscribed.load(Ordering::Relaxed) < streams as u64 {
        if setup.elapsed() > Duration::from_secs(90) {
            stop.cancel();
            bail!(
                "only {} of {streams} streams subscribed within 90 s",
                subscribed.load(Ordering::Relaxed)
            );
        }
        if let Some(Ok(Err(why))) = fast_tasks.try_join_next() {
            stop.cancel();
            return Err(why.context("a fast reader failed to start"));
        }
        if let Some(Ok(Err(why))) = slow_tasks.try_join_next() {
            stop.cancel();
            return Err(why.context("a slow reader failed to start"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The set points move from now on; the slow readers fall behind for a while first.
    let moving = CancellationToken::new();
    let mover = tokio::spawn(move_set_points(addr, moving.clone(), round));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let origin = Instant::now();
    counting.store(true, Ordering::Relaxed);
    let cpu = CpuSpan::start(gateway);
    let threads_before = thread_cpu(gateway.pid);
    let started = Instant::now();
    while started.elapsed() < bench.fanout_window {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    counting.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu = cpu.percent();
    let threads_after = thread_cpu(gateway.pid);
    let rss_end = rss_of(gateway.pid).unwrap_or(0);
    let share = |before: Duration, after: Duration| {
        after.saturating_sub(before).as_secs_f64() / elapsed.as_secs_f64() * 100.0
    };
    let runtime_cpu = share(threads_before.0, threads_after.0);
    let connections_cpu = share(threads_before.1, threads_after.1);
    // The last set: every slow reader must come to show it.
    moving.cancel();
    let last = mover.await??;
    let set_at = Instant::now();
    let mut converged_after = None;
    let mut unconverged = slow_views.len();
    while set_at.elapsed() < CONVERGE_WITHIN {
        unconverged = slow_views
            .iter()
            .filter(|view| !shows(&view.lock().unwrap(), &last))
            .count();
        if unconverged == 0 {
            converged_after = Some(set_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    let mut failed = 0;
    let mut p99s = Vec::new();
    let mut fast_events = 0usize;
    let mut all_offsets = Vec::new();
    let mut per_reader = Vec::new();
    while let Some(joined) = fast_tasks.join_next().await {
        match joined {
            Ok(Ok(arrivals)) => {
                fast_events += arrivals.len();
                let offsets = grid_offsets(&arrivals, origin);
                all_offsets.extend(offsets.iter().copied());
                per_reader.push(offsets);
            }
            _ => failed += 1,
        }
    }
    let mut first_failure = None;
    while let Some(joined) = slow_tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                failed += 1;
                first_failure.get_or_insert(format!("{why:#}"));
            }
            Err(why) => {
                failed += 1;
                first_failure.get_or_insert(format!("{why}"));
            }
        }
    }
    if let Some(why) = first_failure {
        eprintln!("    a slow reader failed: {why}");
    }
    // The best case on the grid: where the earliest arrivals of every tick are.
    let best = earliest_on_grid(&all_offsets);
    for mut offsets in per_reader {
        if offsets.is_empty() {
            continue;
        }
        for offset in &mut offsets {
            *offset = (*offset - best).rem_euclid(INTERVAL_MS as f64);
        }
        offsets.sort_by(f64::total_cmp);
        p99s.push(percentile(&offsets, 0.99));
    }
    p99s.sort_by(f64::total_cmp);
    let fast = streams - slow_views.len();
    Ok(Run {
        slow: slow_views.len(),
        fast,
        cpu,
        runtime_cpu,
        connections_cpu,
        rss_before,
        rss_end,
        fast_p99_max: p99s.last().copied().unwrap_or(f64::NAN),
        fast_p99_median: percentile(&p99s, 0.5),
        fast_events_per_second: fast_events as f64 / elapsed.as_secs_f64(),
        converged_after,
        unconverged,
        slow_events: slow_events.load(Ordering::Relaxed),
        failed,
    })
}

/// Row 5d.
pub async fn slow_readers(bench: &Bench) -> Row {
    let scenario = format!(
        "Slow readers: {} streams × 10 channels @ 100 ms, a third 10× too slow",
        bench.fanout_streams
    );
    match slow_readers_rounds(bench).await {
        Ok(mut row) => {
            row.scenario = scenario;
            row
        }
        Err(why) => Row::not_measurable("5d", scenario, format!("{why:#}")),
    }
}

async fn slow_readers_rounds(bench: &Bench) -> anyhow::Result<Row> {
    let mut without = Vec::new();
    let mut with = Vec::new();
    for round in 0..ROUNDS {
        eprintln!("  round {}: every reader keeps up", round + 1);
        let run_without = run(bench, false, round as u64 * 2).await?;
        eprintln!("  round {}: a third of the readers 10× too slow", round + 1);
        let run_with = run(bench, true, round as u64 * 2 + 1).await?;
        eprintln!(
            "    without: CPU {:.1} % (runtime {:.1} %, connections {:.1} %), fast p99 max {:.1} ms median {:.1} ms, RSS {}",
            run_without.cpu,
            run_without.runtime_cpu,
            run_without.connections_cpu,
            run_without.fast_p99_max,
            run_without.fast_p99_median,
            megabytes(run_without.rss_end)
        );
        eprintln!(
            "    with:    CPU {:.1} % (runtime {:.1} %, connections {:.1} %), fast p99 max {:.1} ms median {:.1} ms, RSS {}; slow readers converged {:?} ({} not), {} slow events, {} failed",
            run_with.cpu,
            run_with.runtime_cpu,
            run_with.connections_cpu,
            run_with.fast_p99_max,
            run_with.fast_p99_median,
            megabytes(run_with.rss_end),
            run_with.converged_after,
            run_with.unconverged,
            run_with.slow_events,
            run_with.failed
        );
        without.push(run_without);
        with.push(run_with);
    }
    Ok(judged(&without, &with))
}

fn judged(without: &[Run], with: &[Run]) -> Row {
    let med = |runs: &[Run], pick: fn(&Run) -> f64| median(runs.iter().map(pick));
    let mut row = Row::new("5d", "");
    let slow = with.first().map_or(0, |run| run.slow);
    let fast = with.first().map_or(0, |run| run.fast);
    let grown = |run: &Run| run.rss_end.saturating_sub(run.rss_before) as f64;
    let per_slow = (med(with, grown) - med(without, grown)) / slow.max(1) as f64;
    let worst_converged = with
        .iter()
        .map(|run| run.converged_after.map(|at| at.as_secs_f64()))
        .try_fold(0.0f64, |worst, at| at.map(|at| worst.max(at)));
    row.gateway = format!(
        "CPU {:.1} % of one core (its runtime's thread, the scheduler's: {:.1} %) · fast readers' p99 {:.1} ms (worst reader {:.1} ms) · {:+.1} KB a slow stream · every slow reader showed the station's last values {}",
        med(with, |r| r.cpu),
        med(with, |r| r.runtime_cpu),
        med(with, |r| r.fast_p99_median),
        med(with, |r| r.fast_p99_max),
        per_slow / 1000.0,
        match worst_converged {
            Some(at) => format!("within {at:.1} s"),
            None => "NOT: some never did".to_owned(),
        }
    );
    row.baseline = format!(
        "every reader keeping up: CPU {:.1} % (runtime {:.1} %) · fast readers' p99 {:.1} ms (worst reader {:.1} ms)",
        med(without, |r| r.cpu),
        med(without, |r| r.runtime_cpu),
        med(without, |r| r.fast_p99_median),
        med(without, |r| r.fast_p99_max),
    );
    row.ratio = format!(
        "{:.2}× the CPU; the runtime's thread {:.2}×; the median fast reader's p99 {:+.1} ms",
        med(with, |r| r.cpu) / med(without, |r| r.cpu).max(1e-9),
        med(with, |r| r.runtime_cpu) / med(without, |r| r.runtime_cpu).max(1e-9),
        med(with, |r| r.fast_p99_median) - med(without, |r| r.fast_p99_median)
    );
    row.target = "CPU and fast readers' p99 unchanged; memory a slow stream bounded; every slow reader converges to the station's values".to_owned();
    let failed: usize = with.iter().chain(without).map(|run| run.failed).sum();
    row.verdict = Verdict::from_bool(worst_converged.is_some() && failed == 0);
    row.notes.push(format!(
        "{ROUNDS} interleaved rounds (without, then with the slow readers), each run on a fresh gateway; medians; {fast} fast and {slow} slow readers; a slow reader has a {SLOW_RECEIVE_BUFFER}-byte receive buffer and takes one event a second (its subscription sends ten); 8 of the 10 channels are set points moved every 250 ms, set a last time at the end of the window; fast readers' lateness on the 100 ms grid above the best arrival"
    ));
    row.notes.push(format!(
        "fast events a second (median): {:.0} without, {:.0} with; slow readers' values events read (all of them, per run): {:?}; streams failed: {failed}",
        med(without, |r| r.fast_events_per_second),
        med(with, |r| r.fast_events_per_second),
        with.iter().map(|run| run.slow_events).collect::<Vec<_>>()
    ));
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_shows_the_last_values_only_when_every_one_matches() {
        let last: HashMap<String, f64> = [("A".to_owned(), 100.0), ("B".to_owned(), 2.0)]
            .into_iter()
            .collect();
        let mut view = View::new();
        apply_values(&mut view, &json!({ "values": { "A": "100", "B": "3" } }));
        assert!(!shows(&view, &last));
        apply_values(&mut view, &json!({ "values": { "B": "2.0" } }));
        assert!(shows(&view, &last));
    }

    #[test]
    fn offsets_on_the_grid_are_modulo_the_interval() {
        let origin = Instant::now();
        let at = |ms: u64| origin + Duration::from_millis(ms);
        let offsets = grid_offsets(&[at(3), at(105), at(1_207)], origin);
        let rounded: Vec<u64> = offsets.iter().map(|x| x.round() as u64).collect();
        assert_eq!(rounded, [3, 5, 7]);
    }

    #[test]
    fn the_earliest_arrivals_are_found_across_the_grids_wrap() {
        // Ticks' arrivals from 95 ms to 10 ms (wrapping): the earliest is 95.
        assert_eq!(earliest_on_grid(&[95.0, 97.0, 99.0, 2.0, 10.0]), 95.0);
        assert_eq!(earliest_on_grid(&[3.0, 4.0, 30.0]), 3.0);
    }
}
