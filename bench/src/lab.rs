//! `station-bench lab`: one gateway serving N stations measured for its start, its
//! memory and CPU at idle and its CPU a request under a cached-read load spread over the
//! stations, and N stations in one gateway beside N gateways of one station each.
//!
//! ```sh
//! station-bench lab --gateway target/release/station-gateway --stations 1,10,50 --processes 10
//! ```
//!
//! The simulated stations run in a helper process of their own (this binary with
//! `--serve-stations N`, each with a serial of its own), so the gateway's RSS and CPU
//! (`/proc/PID`) are the gateway's alone; the load generator is this process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use station_simulator::{Profile, Simulator};
use tokio::process::Child;

use crate::child::{GatewayProcess, cpu_time_of, rss_of};
use crate::http::HttpConnection;
use crate::load::{Bounds, Measured, drive, drive_paced};
use crate::scenarios::median;
use crate::workers::RestWorker;

/// What the helper process prints once every station listens: the addresses, comma-separated.
pub const STATIONS_READY: &str = "stations listening on ";

/// The cached read every connection sends to its station: `values/get` of one name with a
/// maximum age, as scenario 1 does, under the station's own path.
const VALUES_GET: &str = "/api/resources/values/get";

/// `station-bench lab`: the options.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// The station-gateway binary (default: the release build next to this binary).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
    /// How many stations one gateway serves, each a setup measured (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 10, 50])]
    pub stations: Vec<usize>,
    /// Also measure this many gateway processes of one station each (0: not), to compare with
    /// the same number of stations in one gateway.
    #[arg(long, default_value_t = 10)]
    pub processes: usize,
    /// How long idle CPU is measured, after a settling pause of 2 s.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// Measuring time of each load run (a warm-up of a fifth of it comes first).
    #[arg(long, default_value_t = 3)]
    pub duration_secs: u64,
    /// Keep-alive connections of the load, given to the stations in turn (connection i to
    /// station i mod N), so 100 spreads evenly over 1, 10 and 50 stations.
    #[arg(long, default_value_t = 100)]
    pub conns: usize,
    /// The offered load (requests a second, all stations together) at which every setup's CPU
    /// a request is compared.
    #[arg(long, default_value_t = 30_000.0)]
    pub rate: f64,
    /// Rounds: every setup once a round, in turn, so a change in the machine's load falls on
    /// all alike; medians are reported.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Read each station at the gateway's own `/api/...` instead of `/stations/simK/api/...`
    /// (only where every gateway serves one station), to see what the station segment's
    /// routing costs a request.
    #[arg(long)]
    pub plain_paths: bool,
    /// An environment variable for the gateways only, KEY=VALUE (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub gateway_env: Vec<String>,
}

/// One way of serving stations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// One gateway process with this many `[[station]]` tables.
    OneGateway(usize),
    /// This many gateway processes of one `[[station]]` each.
    Processes(usize),
}

impl Setup {
    /// The simulated stations it needs.
    pub fn stations(self) -> usize {
        match self {
            Setup::OneGateway(n) | Setup::Processes(n) => n,
        }
    }

    pub fn label(self) -> String {
        match self {
            Setup::OneGateway(1) => "1 station, 1 gateway".to_owned(),
            Setup::OneGateway(n) => format!("{n} stations, 1 gateway"),
            Setup::Processes(n) => format!("{n} gateways of 1 station"),
        }
    }

    /// Each gateway process's stations, as indices into the stations (0-based).
    pub fn gateways(self) -> Vec<Vec<usize>> {
        match self {
            Setup::OneGateway(n) => vec![(0..n).collect()],
            Setup::Processes(n) => (0..n).map(|k| vec![k]).collect(),
        }
    }
}

/// The setups of a run, in the order they run each round: one gateway of each size asked,
/// then the processes (when asked and more than one).
pub fn setups(stations: &[usize], processes: usize) -> Vec<Setup> {
    let mut setups: Vec<Setup> = stations
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| Setup::OneGateway(n))
        .collect();
    if processes > 1 {
        setups.push(Setup::Processes(processes));
    }
    setups
}

/// The id of station `index` (0-based): `sim1`, `sim2`, ...
pub fn station_id(index: usize) -> String {
    format!("sim{}", index + 1)
}

/// A serial of its own for simulated station `index`, so no two stations say the same in
/// HELLO (the station's identity names its link-owner lease).
pub fn station_serial(index: usize) -> String {
    format!("BENCH-LAB-{:04}", index + 1)
}

/// A gateway's configuration file: HTTP on a port the kernel picks, the configuration files
/// under `files` (each station in `files/<id>`), and a `[[station]]` table for each
/// `(index, address)`.
pub fn lab_config(stations: &[(usize, SocketAddr)], files: &Path) -> String {
    let mut config = String::from(
        "[http]\nlisten = \"127.0.0.1:0\"\n# The load generator is one host standing in for many clients.\nmax_connections_per_ip = 4096\n\n",
    );
    config.push_str(&format!(
        "[config_files]\ndir = {:?}\n",
        files.display().to_string()
    ));
    for (index, addr) in stations {
        config.push_str(&format!(
            "\n[[station]]\nid = \"{}\"\nurl = \"tcp://{addr}\"\n",
            station_id(*index)
        ));
    }
    config
}

/// The path a cached read of station `index` is sent to: under `/stations/<id>`, or (`plain`)
/// the gateway's own, for a gateway of one station.
pub fn read_path(index: usize, plain: bool) -> String {
    if plain {
        VALUES_GET.to_owned()
    } else {
        format!("/stations/{}{VALUES_GET}", station_id(index))
    }
}

/// Which station each load connection reads (connection i: station i mod `stations`).
pub fn connection_stations(conns: usize, stations: usize) -> Vec<usize> {
    (0..conns).map(|i| i % stations.max(1)).collect()
}

/// The addresses on the helper's ready line.
pub fn parse_addresses(line: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let rest = &line[line
        .find(STATIONS_READY)
        .with_context(|| format!("no {STATIONS_READY:?} in {line:?}"))?
        + STATIONS_READY.len()..];
    rest.trim()
        .split(',')
        .map(|addr| {
            addr.trim()
                .parse()
                .with_context(|| format!("{addr:?} is not an address"))
        })
        .collect()
}

/// Memory a station adds: (RSS of N stations − RSS of one) / (N − 1), in bytes.
pub fn per_station(rss_n: f64, rss_1: f64, n: usize) -> Option<f64> {
    (n > 1).then(|| (rss_n - rss_1) / (n - 1) as f64)
}

/// `--serve-stations N`: N default stations, each with a serial of its own, in this process;
/// runs until killed.
pub async fn serve_stations(count: usize) -> anyhow::Result<()> {
    let mut simulators = Vec::with_capacity(count);
    for index in 0..count {
        let mut profile = Profile::default_station();
        profile.station.serial = station_serial(index);
        simulators.push(
            Simulator::start(profile, SocketAddr::from(([127, 0, 0, 1], 0)))
                .await
                .context("cannot start a simulator")?,
        );
    }
    let addrs: Vec<String> = simulators
        .iter()
        .map(|s| s.local_addr().to_string())
        .collect();
    eprintln!("{STATIONS_READY}{}", addrs.join(","));
    std::future::pending::<()>().await;
    Ok(())
}

/// The stations' helper process.
struct StationsProcess {
    _child: Child,
    addrs: Vec<SocketAddr>,
}

impl StationsProcess {
    async fn spawn(count: usize) -> anyhow::Result<StationsProcess> {
        let count_arg = count.to_string();
        let (child, line) =
            crate::child::spawn_helper(&["--serve-stations", &count_arg], STATIONS_READY).await?;
        let addrs = parse_addresses(&line)?;
        if addrs.len() != count {
            bail!(
                "asked for {count} stations, the helper started {}",
                addrs.len()
            );
        }
        Ok(StationsProcess {
            _child: child,
            addrs,
        })
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one setup measured in one round.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub setup: Setup,
    /// From the first spawn until every gateway's `/readyz` answered 200.
    pub ready: Duration,
    /// RSS of every gateway process together, 2 s after all were ready, in bytes.
    pub rss: u64,
    /// Their CPU (utime + stime) over the idle window, as a percentage of one core.
    pub idle_cpu_percent: f64,
    /// Their CPU over the idle window, in ms.
    pub idle_cpu_ms: f64,
    /// As fast as they answer: requests a second, CPU a request (µs, warm-up included), p50.
    pub saturated: f64,
    pub saturated_us: f64,
    pub saturated_p50_us: f64,
    /// The offered rate, and at it: requests a second answered, CPU a request (µs), p50.
    pub offered: f64,
    pub paced: f64,
    pub paced_us: f64,
    pub paced_p50_us: f64,
    /// RSS of every gateway together after the load, in bytes.
    pub rss_after: u64,
    pub errors: Vec<String>,
}

/// CPU of every process in `pids` together.
fn cpu_of(pids: &[u32]) -> Duration {
    pids.iter()
        .map(|&pid| cpu_time_of(pid).unwrap_or_default())
        .sum()
}

fn rss_sum(pids: &[u32]) -> u64 {
    pids.iter().map(|&pid| rss_of(pid).unwrap_or(0)).sum()
}

/// Waits until `GET /readyz` at `addr` answers 200.
async fn wait_ready(addr: SocketAddr, limit: Duration) -> anyhow::Result<Instant> {
    let started = Instant::now();
    let mut last = String::from("no answer");
    let mut connection: Option<HttpConnection> = None;
    while started.elapsed() < limit {
        if connection.is_none() {
            connection = HttpConnection::open(addr).await.ok();
        }
        if let Some(open) = connection.as_mut() {
            match open.send(Method::GET, "/readyz", None).await {
                Ok(response) => {
                    let status = response.status();
                    let body = response.into_body().collect().await;
                    if status == StatusCode::OK {
                        return Ok(Instant::now());
                    }
                    if let Ok(body) = body {
                        last = format!("{status}: {}", String::from_utf8_lossy(&body.to_bytes()));
                    } else {
                        connection = None;
                    }
                }
                Err(why) => {
                    last = format!("{why:#}");
                    connection = None;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bail!("{addr}/readyz did not answer 200 within {limit:?}: {last}")
}

/// The load's connections: connection i reads station `connection_stations[i]` through the
/// gateway that serves it.
async fn workers(
    conns: usize,
    station_gateway: &[SocketAddr],
    request: &Bytes,
    plain: bool,
) -> anyhow::Result<Vec<RestWorker>> {
    let mut workers = Vec::with_capacity(conns);
    for station in connection_stations(conns, station_gateway.len()) {
        let path = read_path(station, plain);
        workers.push(RestWorker::open(station_gateway[station], &path, request).await?);
    }
    Ok(workers)
}

/// A run's CPU a request of `pids` (µs, the warm-up's requests counted at the run's rate, as
/// scenario 1 does), and its errors.
fn cpu_per_request(
    cpu: Duration,
    measured: &Measured,
    errors: &mut Vec<String>,
    what: &str,
) -> f64 {
    if measured.errors > 0 {
        errors.push(format!(
            "{what}: {} errors, the first: {}",
            measured.errors,
            measured.first_error.as_deref().unwrap_or("?")
        ));
    }
    cpu.as_secs_f64() * 1e6 / (measured.requests * 6 / 5).max(1) as f64
}

/// Starts `setup`'s stations and gateways, measures them, stops them.
async fn measure(
    setup: Setup,
    binary: &Path,
    env: &[(String, String)],
    args: &LabArgs,
    names: &[String],
) -> anyhow::Result<Measurement> {
    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let stations = StationsProcess::spawn(setup.stations()).await?;
    let dir = TempDir(std::env::temp_dir().join(format!(
        "station-bench-lab-{}-{}",
        std::process::id(),
        RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )));
    std::fs::create_dir_all(&dir.0)?;

    // Spawn every gateway first, then wait for each to be ready: the start of the setup is the
    // first spawn, its end the last `/readyz` 200.
    let mut gateways: Vec<GatewayProcess> = Vec::new();
    let mut station_gateway = vec![SocketAddr::from(([127, 0, 0, 1], 0)); setup.stations()];
    let mut started: Option<Instant> = None;
    for (k, served) in setup.gateways().into_iter().enumerate() {
        let listed: Vec<(usize, SocketAddr)> =
            served.iter().map(|&i| (i, stations.addrs[i])).collect();
        let files = dir.0.join(format!("files-{k}"));
        let path = dir.0.join(format!("gateway-{k}.toml"));
        std::fs::write(&path, lab_config(&listed, &files))?;
        let arg = path.to_string_lossy().into_owned();
        let gateway = GatewayProcess::spawn_args(binary, env, &["--config", &arg], false)
            .await
            .with_context(|| format!("{}: gateway {k}", setup.label()))?;
        started.get_or_insert(gateway.spawned);
        for &i in &served {
            station_gateway[i] = gateway.http_addr;
        }
        gateways.push(gateway);
    }
    let started = started.context("no gateway")?;
    let mut last_ready = started;
    for gateway in &gateways {
        let ready = wait_ready(gateway.http_addr, Duration::from_secs(60)).await?;
        last_ready = last_ready.max(ready);
    }
    let ready = last_ready.duration_since(started);
    let pids: Vec<u32> = gateways.iter().map(|g| g.pid).collect();

    // Every station's cache primed with the name read, through its own path (and so the
    // routing checked: a 404 here fails the setup).
    let request =
        crate::scenarios::body(serde_json::json!({ "Names": [names[0]], "MaxAgeMs": 600_000 }));
    for (i, addr) in station_gateway.iter().enumerate() {
        let mut probe = HttpConnection::open(*addr).await?;
        probe
            .post(
                &format!("/stations/{}{VALUES_GET}", station_id(i)),
                &request,
            )
            .await
            .with_context(|| format!("the cached read of {}", station_id(i)))?;
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_sum(&pids);
    let idle_from = (cpu_of(&pids), Instant::now());
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let idle_cpu = cpu_of(&pids).saturating_sub(idle_from.0);
    let idle_wall = idle_from.1.elapsed();

    let bounds = Bounds {
        warmup: Duration::from_secs(args.duration_secs).div_f64(5.0),
        duration: Duration::from_secs(args.duration_secs),
        max_per_worker: u64::MAX,
    };
    let mut errors = Vec::new();
    let load = workers(args.conns, &station_gateway, &request, args.plain_paths).await?;
    let cpu = cpu_of(&pids);
    let saturated = drive(load, bounds).await;
    let saturated_us = cpu_per_request(
        cpu_of(&pids).saturating_sub(cpu),
        &saturated,
        &mut errors,
        "saturated",
    );
    let load = workers(args.conns, &station_gateway, &request, args.plain_paths).await?;
    let cpu = cpu_of(&pids);
    let paced = drive_paced(load, bounds, args.rate).await;
    let paced_us = cpu_per_request(
        cpu_of(&pids).saturating_sub(cpu),
        &paced,
        &mut errors,
        "paced",
    );
    if paced.throughput() < args.rate * 0.97 {
        errors.push(format!(
            "answered {:.0} req/s of the {:.0} offered",
            paced.throughput(),
            args.rate
        ));
    }
    let rss_after = rss_sum(&pids);
    for gateway in gateways {
        gateway.stop().await;
    }
    drop(stations);
    Ok(Measurement {
        setup,
        ready,
        rss,
        idle_cpu_percent: 100.0 * idle_cpu.as_secs_f64() / idle_wall.as_secs_f64().max(1e-9),
        idle_cpu_ms: idle_cpu.as_secs_f64() * 1e3,
        saturated: saturated.throughput(),
        saturated_us,
        saturated_p50_us: saturated.p50_us(),
        offered: args.rate,
        paced: paced.throughput(),
        paced_us,
        paced_p50_us: paced.p50_us(),
        rss_after,
        errors,
    })
}

/// `station-bench lab`: every setup once a round, `rounds` rounds; prints each measurement as
/// it comes, then the table of medians.
pub async fn run(args: LabArgs) -> anyhow::Result<()> {
    let binary = crate::child::locate_binary(args.gateway.clone(), true)?;
    let mut env = Vec::new();
    for pair in &args.gateway_env {
        let (key, value) = pair
            .split_once('=')
            .with_context(|| format!("--gateway-env {pair:?} is not KEY=VALUE"))?;
        env.push((key.to_owned(), value.to_owned()));
    }
    let setups = setups(&args.stations, args.processes);
    if args.plain_paths
        && setups
            .iter()
            .any(|s| matches!(s, Setup::OneGateway(n) if *n > 1))
    {
        bail!("--plain-paths: a gateway of several stations has no plain /api/... for each");
    }
    if setups.is_empty() {
        bail!("nothing to measure: give --stations N (N ≥ 1) or --processes N (N ≥ 2)");
    }
    let profile = Profile::default_station();
    let names: Vec<String> = profile
        .channels
        .iter()
        .filter(|ch| ch.descriptor.readable && !ch.descriptor.consuming && ch.latency.is_zero())
        .map(|ch| ch.descriptor.name.clone())
        .take(1)
        .collect();
    if names.is_empty() {
        bail!("the station profile has no plain readable channel");
    }
    eprintln!(
        "gateway binary: {}; started {}; 1-minute load average {:.2}; {}",
        binary.display(),
        crate::report::now_utc(),
        crate::report::load_average(),
        crate::report::machine()
    );
    let mut all: Vec<Measurement> = Vec::new();
    for round in 1..=args.rounds.max(1) {
        for &setup in &setups {
            eprintln!("round {round}: {} ...", setup.label());
            let measured = measure(setup, &binary, &env, &args, &names).await?;
            println!("round {round}: {}", line(&measured));
            for error in &measured.errors {
                println!("  note: {error}");
            }
            all.push(measured);
        }
    }
    println!();
    println!("{}", table(&setups, &all, &args));
    eprintln!(
        "finished {}; 1-minute load average {:.2}",
        crate::report::now_utc(),
        crate::report::load_average()
    );
    Ok(())
}

/// One measurement on one line.
fn line(m: &Measurement) -> String {
    format!(
        "{}: ready {:.1} ms · RSS {:.2} MB idle ({:.2} MB after the load) · idle CPU {:.0} ms = {:.2} % of a core · saturated {:.1} k req/s, {:.2} µs CPU/request, p50 {:.0} µs · at {:.1} k req/s offered: {:.1} k answered, {:.2} µs CPU/request, p50 {:.0} µs",
        m.setup.label(),
        m.ready.as_secs_f64() * 1e3,
        m.rss as f64 / 1e6,
        m.rss_after as f64 / 1e6,
        m.idle_cpu_ms,
        m.idle_cpu_percent,
        m.saturated / 1e3,
        m.saturated_us,
        m.saturated_p50_us,
        m.offered / 1e3,
        m.paced / 1e3,
        m.paced_us,
        m.paced_p50_us,
    )
}

/// The medians of each setup, and the memory a station adds beside one station's.
fn table(setups: &[Setup], all: &[Measurement], args: &LabArgs) -> String {
    let mut out = format!(
        "| setup | ready (/readyz 200) | idle RSS | idle CPU ({} s) | saturated ({} conns) | CPU/request at {:.0} k req/s | RSS after the load |\n|---|---|---|---|---|---|---|\n",
        args.idle_secs,
        args.conns,
        args.rate / 1e3
    );
    let of = |setup: Setup, f: &dyn Fn(&Measurement) -> f64| {
        median(all.iter().filter(|m| m.setup == setup).map(f))
    };
    for &setup in setups {
        out.push_str(&format!(
            "| {} | {:.1} ms | {:.2} MB | {:.2} % of a core | {:.1} k req/s · {:.2} µs CPU | {:.2} µs | {:.2} MB |\n",
            setup.label(),
            of(setup, &|m| m.ready.as_secs_f64() * 1e3),
            of(setup, &|m| m.rss as f64) / 1e6,
            of(setup, &|m| m.idle_cpu_percent),
            of(setup, &|m| m.saturated) / 1e3,
            of(setup, &|m| m.saturated_us),
            of(setup, &|m| m.paced_us),
            of(setup, &|m| m.rss_after as f64) / 1e6,
        ));
    }
    if setups.contains(&Setup::OneGateway(1)) {
        let rss_1 = of(Setup::OneGateway(1), &|m| m.rss as f64);
        for &setup in setups {
            if let Setup::OneGateway(n) = setup
                && let Some(each) = per_station(of(setup, &|m| m.rss as f64), rss_1, n)
            {
                out.push_str(&format!(
                    "\nmemory a station adds ({n} stations beside 1): {:.0} KB\n",
                    each / 1e3
                ));
            }
        }
    }
    out.push_str(&format!(
        "\nmedians of {} rounds; CPU is utime + stime of every gateway process together, from /proc\n",
        args.rounds.max(1)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_names_every_station_and_binds_a_port_the_kernel_picks() {
        let a: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:4002".parse().unwrap();
        let text = lab_config(&[(0, a), (4, b)], Path::new("/tmp/x y"));
        let table: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(table["http"]["listen"].as_str(), Some("127.0.0.1:0"));
        assert_eq!(table["config_files"]["dir"].as_str(), Some("/tmp/x y"));
        let stations = table["station"].as_array().unwrap();
        assert_eq!(stations.len(), 2);
        assert_eq!(stations[0]["id"].as_str(), Some("sim1"));
        assert_eq!(stations[0]["url"].as_str(), Some("tcp://127.0.0.1:4001"));
        assert_eq!(stations[1]["id"].as_str(), Some("sim5"));
        assert_eq!(stations[1]["url"].as_str(), Some("tcp://127.0.0.1:4002"));
    }

    #[test]
    fn connections_go_to_the_stations_in_turn_and_evenly_when_they_divide() {
        assert_eq!(connection_stations(5, 2), vec![0, 1, 0, 1, 0]);
        for stations in [1, 10, 50] {
            let mut count = vec![0; stations];
            for s in connection_stations(100, stations) {
                count[s] += 1;
            }
            assert!(count.iter().all(|&c| c == 100 / stations));
        }
        assert_eq!(connection_stations(3, 0), vec![0, 0, 0]);
    }

    #[test]
    fn setups_are_each_size_then_the_processes() {
        assert_eq!(
            setups(&[1, 10, 50], 10),
            vec![
                Setup::OneGateway(1),
                Setup::OneGateway(10),
                Setup::OneGateway(50),
                Setup::Processes(10)
            ]
        );
        assert_eq!(setups(&[0, 2], 1), vec![Setup::OneGateway(2)]);
        assert_eq!(
            Setup::Processes(3).gateways(),
            vec![vec![0], vec![1], vec![2]]
        );
        assert_eq!(Setup::OneGateway(3).gateways(), vec![vec![0, 1, 2]]);
        assert_eq!(Setup::Processes(10).label(), "10 gateways of 1 station");
    }

    #[test]
    fn stations_have_ids_and_serials_of_their_own() {
        assert_eq!(station_id(0), "sim1");
        assert_eq!(station_id(49), "sim50");
        assert_ne!(station_serial(0), station_serial(1));
        assert_eq!(station_serial(9), "BENCH-LAB-0010");
    }

    #[test]
    fn the_ready_line_gives_every_address() {
        let line = format!("{STATIONS_READY}127.0.0.1:1,127.0.0.1:2");
        assert_eq!(
            parse_addresses(&line).unwrap(),
            vec![
                "127.0.0.1:1".parse::<SocketAddr>().unwrap(),
                "127.0.0.1:2".parse().unwrap()
            ]
        );
        assert!(parse_addresses("nothing").is_err());
        assert!(parse_addresses(&format!("{STATIONS_READY}127.0.0.1")).is_err());
    }

    #[test]
    fn a_read_goes_under_its_stations_path_unless_plain() {
        assert_eq!(
            read_path(2, false),
            "/stations/sim3/api/resources/values/get"
        );
        assert_eq!(read_path(2, true), "/api/resources/values/get");
    }

    #[test]
    fn a_stations_memory_is_the_growth_over_one_station_shared_out() {
        assert_eq!(per_station(30e6, 12e6, 10), Some(2e6));
        assert_eq!(per_station(12e6, 12e6, 1), None);
    }
}
