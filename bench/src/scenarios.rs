//! The scenarios of BENCHMARKS.md, each measured through the gateway and beside its baseline.
//! Here what every scenario shares (the [`Bench`], the load workers, the medians and the
//! rows' cells); each family of scenarios in a module of its own: `cached`, `forced`,
//! `changes`, `legacy`, `fanout`, `serial`.

use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use serde_json::json;
use station_simulator::StationClient;
use tokio::net::TcpStream;

use crate::child::{GatewayProcess, StationProcess};
use crate::http::HttpConnection;
use crate::load::{Bounds, Measured, Worker, drive};
use crate::report::{Row, Verdict, megabytes, micros, rate_cell};
use crate::workers::{DirectReadWorker, RestWorker};

mod cached;
mod changes;
pub(crate) mod fanout;
mod forced;
mod legacy;
pub(crate) mod serial;

const VALUES_GET: &str = "/api/resources/values/get";
const VALUE_GET: &str = "/api/resources/value/get";
const VALUE_SET: &str = "/api/resources/value/set";
const VALUES_SET: &str = "/api/resources/values/set";

/// What every scenario needs.
pub struct Bench {
    /// The station the gateway and the direct baselines talk to, in a process of its own.
    pub station: StationProcess,
    pub gateway: GatewayProcess,
    pub bounds: Bounds,
    /// Channels that are readable, have no read side effects and no extra latency.
    pub names: Vec<String>,
    pub fanout_streams: usize,
    pub fanout_window: Duration,
    /// Connections for every throughput scenario instead of their defaults (64 cached, 8 others).
    pub conns: Option<usize>,
    /// Interleaved pairs (baseline, gateway) of the side-by-side scenarios; medians are reported.
    pub pairs: usize,
    /// How `gateway` was started, to start a fresh one like it.
    pub recipe: crate::child::GatewayRecipe,
}

/// One interleaved pair of runs: the gateway's and its baseline's throughput, CPU per request
/// and p50 (µs).
#[derive(Debug, Clone, Copy)]
struct Pair {
    gateway: f64,
    baseline: f64,
    gateway_us: f64,
    baseline_us: f64,
    gateway_p50: f64,
    baseline_p50: f64,
}

impl Pair {
    /// Each figure's median over `pairs` (the upper median of an even count).
    fn medians(pairs: &[Pair]) -> Pair {
        let median = |figure: fn(&Pair) -> f64| median(pairs.iter().map(figure));
        Pair {
            gateway: median(|p| p.gateway),
            baseline: median(|p| p.baseline),
            gateway_us: median(|p| p.gateway_us),
            baseline_us: median(|p| p.baseline_us),
            gateway_p50: median(|p| p.gateway_p50),
            baseline_p50: median(|p| p.baseline_p50),
        }
    }
}

/// The median of `values` (the upper one of an even count; 0 for none).
pub(crate) fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

pub(crate) fn body(value: serde_json::Value) -> Bytes {
    Bytes::from(serde_json::to_vec(&value).expect("JSON"))
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator == 0.0 {
        f64::NAN
    } else {
        numerator / denominator
    }
}

/// Gateway CPU used over a span, as a percentage of one core.
pub(crate) struct CpuSpan {
    pid: u32,
    cpu: Duration,
    at: Instant,
}

impl CpuSpan {
    pub(crate) fn start(gateway: &GatewayProcess) -> CpuSpan {
        CpuSpan::of(gateway.pid)
    }

    fn of(pid: u32) -> CpuSpan {
        CpuSpan {
            pid,
            cpu: crate::child::cpu_time_of(pid).unwrap_or_default(),
            at: Instant::now(),
        }
    }

    /// CPU time per request over the span, in µs.
    fn per_request_us(&self, requests: u64) -> f64 {
        let cpu = crate::child::cpu_time_of(self.pid).unwrap_or_default();
        cpu.saturating_sub(self.cpu).as_secs_f64() * 1e6 / requests.max(1) as f64
    }

    pub(crate) fn percent(&self) -> f64 {
        let cpu = crate::child::cpu_time_of(self.pid).unwrap_or_default();
        let wall = self.at.elapsed().as_secs_f64();
        100.0 * (cpu.saturating_sub(self.cpu)).as_secs_f64() / wall.max(1e-9)
    }
}

/// `count` load connections to the HTTP server at `addr`, each posting `body_of(i)` to `path`.
async fn rest_workers(
    addr: std::net::SocketAddr,
    count: usize,
    path: &'static str,
    body_of: impl Fn(usize) -> Bytes,
) -> anyhow::Result<Vec<RestWorker>> {
    let mut workers = Vec::with_capacity(count);
    for i in 0..count {
        workers.push(RestWorker::open(addr, path, &body_of(i)).await?);
    }
    Ok(workers)
}

async fn direct_clients(
    addr: std::net::SocketAddr,
    count: usize,
) -> anyhow::Result<Vec<StationClient<TcpStream>>> {
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let mut client = StationClient::connect(addr).await?;
        client.set_timeout(Duration::from_secs(2));
        client.hello("station-bench").await?;
        clients.push(client);
    }
    Ok(clients)
}

/// A byte-protocol client per name at `addr`, each reading its one name.
async fn read_workers(
    addr: std::net::SocketAddr,
    names: &[String],
) -> anyhow::Result<Vec<DirectReadWorker<TcpStream>>> {
    Ok(direct_clients(addr, names.len())
        .await?
        .into_iter()
        .zip(names)
        .map(|(client, name)| DirectReadWorker {
            client,
            names: vec![name.clone()],
        })
        .collect())
}

/// One connection alone, straight to the station and through a server, nothing queued.
struct Unloaded {
    direct: Measured,
    through: Measured,
}

impl Unloaded {
    /// What the server adds to the p50.
    fn overhead_us(&self) -> f64 {
        self.through.p50_us() - self.direct.p50_us()
    }

    fn note(&self) -> String {
        format!(
            "unloaded (1 connection, nothing queued): direct p50 {} · p99 {}; through the gateway p50 {} · p99 {}: p50 +{}",
            micros(self.direct.p50_us()),
            micros(self.direct.p99_us()),
            micros(self.through.p50_us()),
            micros(self.through.p99_us()),
            micros(self.overhead_us())
        )
    }
}

impl Bench {
    fn conns_or(&self, default: usize) -> usize {
        self.conns.unwrap_or(default).max(1)
    }

    /// One connection alone, for half the usual time: the latency of the path itself, without
    /// queueing behind other requests on a busy machine.
    async fn unloaded<W: Worker>(&self, worker: W) -> Measured {
        let bounds = Bounds {
            warmup: self.bounds.warmup / 2,
            duration: self.bounds.duration / 2,
            ..self.bounds
        };
        drive(vec![worker], bounds).await
    }

    /// A read of `name` straight from the station and through `through`, one connection each.
    async fn unloaded_side_by_side<W: Worker>(
        &self,
        name: &str,
        through: W,
    ) -> anyhow::Result<Unloaded> {
        let client = direct_clients(self.station.addr, 1).await?.remove(0);
        let direct = self
            .unloaded(DirectReadWorker {
                client,
                names: vec![name.to_owned()],
            })
            .await;
        let through = self.unloaded(through).await;
        Ok(Unloaded { direct, through })
    }

    /// Waits until a forced read through the gateway answers 200; returns when it did.
    pub async fn wait_until_serving(&self, limit: Duration) -> anyhow::Result<Instant> {
        wait_until_serving(&self.gateway, &self.names[0], limit).await
    }

    /// 8. Idle memory, and the time from spawn to the first answered forced read.
    pub async fn idle(&self, first_answer: Instant) -> Row {
        let mut row = Row::new("8", "Idle memory; start-up to first answered request");
        let startup = first_answer.duration_since(self.gateway.spawned);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss = self.gateway.rss_bytes().unwrap_or(0);
        row.gateway = format!(
            "RSS {} idle · start-up {}",
            megabytes(rss),
            micros(startup.as_secs_f64() * 1e6)
        );
        row.baseline = "target".to_owned();
        row.ratio = format!("{:.2} × 20 MB", rss as f64 / 20e6);
        row.target = "idle RSS ≤ 20 MB".to_owned();
        row.verdict = Verdict::from_bool(rss <= 20_000_000);
        row.notes.push(
            "start-up: spawn of the release binary → first 200 to a forced value/get \
             (process start, config, bind, station connect with HELLO/SYSTEM/LIST, first read)"
                .to_owned(),
        );
        row
    }
}

/// Waits until a forced read of `name` through `gateway` answers 200.
pub async fn wait_until_serving(
    gateway: &GatewayProcess,
    name: &str,
    limit: Duration,
) -> anyhow::Result<Instant> {
    let started = Instant::now();
    let request = body(json!({ "Name": name }));
    let mut last_error = String::new();
    while started.elapsed() < limit {
        match HttpConnection::open(gateway.http_addr).await {
            Ok(mut connection) => loop {
                match connection.post(VALUE_GET, &request).await {
                    Ok(_) => return Ok(Instant::now()),
                    Err(why) => last_error = format!("{why:#}"),
                }
                if started.elapsed() >= limit {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            },
            Err(why) => last_error = format!("{why:#}"),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    bail!("the gateway answered no forced read within {limit:?}: {last_error}")
}

fn fill_rate_row(row: &mut Row, measured: &Measured, baseline: &Measured, baseline_name: &str) {
    let r = ratio(measured.throughput(), baseline.throughput());
    row.gateway = rate_cell(measured);
    row.baseline = format!("{baseline_name}: {}", rate_cell(baseline));
    row.ratio = format!(
        "{r:.2}× throughput; p50 +{}",
        micros(measured.p50_us() - baseline.p50_us())
    );
    row.target = "—".to_owned();
    row.verdict = Verdict::Info;
    error_notes(row, measured, baseline);
}

fn error_notes(row: &mut Row, measured: &Measured, baseline: &Measured) {
    if let Some(error) = &measured.first_error {
        row.notes.push(format!(
            "gateway: {} errors, first: {error}",
            measured.errors
        ));
    }
    if let Some(error) = &baseline.first_error {
        row.notes.push(format!(
            "baseline: {} errors, first: {error}",
            baseline.errors
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::cached::{cached_parts, nginx_part};
    use crate::scenarios::fanout::{FanOut, stream_own_cost};
    use crate::scenarios::forced::forced_own_cost;

    #[test]
    fn the_forced_reads_own_cost_is_judged_beside_its_floor() {
        // The 2026-12-02 figures: the floor misses both parts too.
        let row = forced_own_cost(8, (35.0, 133.0), (29.1, 116.0), 0);
        assert_eq!(row.verdict, Verdict::OutOfReach);
        assert!(
            row.notes
                .iter()
                .any(|note| note.starts_with("out of reach"))
        );
        // A floor that meets the CPU part: it does not show that part out of reach.
        let row = forced_own_cost(8, (35.0, 133.0), (14.0, 116.0), 0);
        assert_eq!(row.verdict, Verdict::Missed);
        assert!(row.notes.is_empty());
        assert_eq!(
            forced_own_cost(8, (14.0, 39.0), (20.0, 60.0), 0).verdict,
            Verdict::Met
        );
        // Errors are never out of reach.
        assert_eq!(
            forced_own_cost(8, (35.0, 133.0), (29.1, 116.0), 3).verdict,
            Verdict::Missed
        );
    }

    #[test]
    fn the_cached_read_is_out_of_reach_only_when_its_floor_missed_in_every_round() {
        // 2026-12-03 04:52 UTC, five rounds: the floor's median missed both parts (0.87×,
        // 1.16×), but its last round was 1.09× the trivial server's throughput. The CPU
        // figures are the run's medians spread as its rounds were.
        let trivial = [
            (118.0e3, 8.5),
            (118.1e3, 8.4),
            (110.9e3, 8.6),
            (116.9e3, 8.5),
            (88.1e3, 10.2),
        ];
        let floor = [
            (101.8e3, 9.9),
            (109.2e3, 9.8),
            (96.8e3, 10.1),
            (107.0e3, 9.9),
            (95.6e3, 11.9),
        ];
        let parts = cached_parts(0.76, 1.42, &floor, &trivial);
        assert_eq!(parts, vec![(false, true), (false, false)]);
        assert_eq!(Verdict::beside_floor(&parts), Verdict::Missed);
        // Without that round, the floor missed throughput and CPU in every one: out of reach.
        let parts = cached_parts(0.76, 1.42, &floor[..4], &trivial[..4]);
        assert_eq!(parts, vec![(false, false), (false, false)]);
        assert_eq!(Verdict::beside_floor(&parts), Verdict::OutOfReach);
        // nginx: the floor beside each round's nginx.
        let nginx = [(103.2e3, 8.8), (103.7e3, 8.7)];
        assert_eq!(nginx_part(0.86, &floor, &nginx), (true, true));
        assert_eq!(nginx_part(0.75, &[(80.0e3, 10.0)], &nginx), (false, false));
    }

    fn fan_out_run(cpu: f64, kb_a_stream: f64, failed: usize) -> FanOut {
        FanOut {
            per_second: 10_000.0,
            cpu,
            peak_rss: 5_000_000 + (kb_a_stream * 1000.0 * 1000.0) as u64,
            rss_before: 5_000_000,
            streams: 1000,
            setup: Duration::from_millis(300),
            elapsed: Duration::from_secs(10),
            failed,
        }
    }

    #[test]
    fn a_streams_cost_is_judged_beside_the_stream_floor() {
        let floor = fan_out_run(14.0, 19.6, 0);
        // Memory met, CPU missed by both: out of reach.
        let row = stream_own_cost(1000, &fan_out_run(13.0, 18.0, 0), &floor);
        assert_eq!(row.verdict, Verdict::OutOfReach);
        assert!(row.gateway.contains("18.0 KB a stream"), "{}", row.gateway);
        // Memory missed where the floor met it: missed.
        let row = stream_own_cost(1000, &fan_out_run(13.0, 23.4, 0), &floor);
        assert_eq!(row.verdict, Verdict::Missed);
        // Both met.
        let row = stream_own_cost(1000, &fan_out_run(7.0, 18.0, 0), &floor);
        assert_eq!(row.verdict, Verdict::Met);
        // A stream that ended early is a miss, whatever the numbers.
        let row = stream_own_cost(1000, &fan_out_run(7.0, 18.0, 2), &floor);
        assert_eq!(row.verdict, Verdict::Missed);
    }
}
