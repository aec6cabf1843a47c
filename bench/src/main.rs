//! `station-bench`: starts the simulator in-process and the release gateway as a child process,
//! runs BENCHMARKS.md's scenarios, each beside a baseline measured in the same run, prints a
//! markdown table and writes it into `BENCHMARKS.md`.
//!
//! `cargo run --release -p station-bench -- --all`; `station-bench lab` measures one gateway
//! serving several stations (`lab.rs`).

mod bus;
mod child;
mod deadband;
mod event_reader;
mod floor;
mod http;
mod lab;
mod load;
mod reconnects;
mod report;
mod sampling;
mod scenarios;
mod slow_readers;
mod workers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use futures::FutureExt;
use station_simulator::{Profile, Simulator};

use crate::child::{GatewayRecipe, StationProcess};
use crate::load::Bounds;
use crate::report::Row;
use crate::scenarios::Bench;

/// Every scenario, in the order they run.
const SCENARIOS: [&str; 17] = [
    "idle",
    "cached",
    "forced",
    "forced-shared",
    "slow-station",
    "batch",
    "set",
    "sets",
    "coalescing",
    "legacy",
    "fanout",
    "deadband",
    "slow-readers",
    "reconnects",
    "serial",
    "sampling",
    "bus",
];

#[derive(Parser, Debug)]
#[command(about = "Station Gateway benchmarks: each scenario beside its baseline, on loopback")]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Run every scenario and write the results into BENCHMARKS.md.
    #[arg(long)]
    all: bool,
    /// Run one scenario (repeatable): idle, cached, forced, forced-shared, slow-station, batch, set, sets,
    /// coalescing, legacy, fanout, deadband, slow-readers, reconnects, serial, sampling, bus
    /// (I2C through api/comm over TCP and serial).
    #[arg(long = "scenario", value_name = "NAME")]
    scenarios: Vec<String>,
    /// Measuring time of each throughput run (a warm-up of a fifth of it comes first).
    #[arg(long, default_value_t = 5)]
    duration_secs: u64,
    /// Most requests one worker sends in a measured run.
    #[arg(long, default_value_t = 1_000_000)]
    max_requests_per_worker: u64,
    /// Connections for every throughput scenario instead of their defaults (64 for the cached
    /// read, 8 for the others); e.g. 1 for a latency breakdown without queueing.
    #[arg(long)]
    conns: Option<usize>,
    /// Interleaved (baseline, gateway) pairs of the side-by-side scenarios (cached,
    /// forced-shared); their medians are reported. Five, as three left the cached read's
    /// ratios to one round's luck on this shared machine.
    #[arg(long, default_value_t = 5)]
    pairs: usize,
    /// Samples of each acquisition in the sampling scenario (over serial at 115 200 baud,
    /// 100 000 take about 71 s).
    #[arg(long, default_value_t = 100_000)]
    sampling_samples: u32,
    /// Event streams in the fan-out scenario.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// How long the fan-out is measured.
    #[arg(long, default_value_t = 10)]
    fanout_secs: u64,
    /// The station-gateway binary (default: the release build next to this binary, built
    /// first when run through cargo).
    #[arg(long)]
    gateway: Option<PathBuf>,
    /// An access rules file (`[access] rules`) the gateway child decides every request by,
    /// to measure the cost of the rules (the cached read with rules on).
    #[arg(long)]
    gateway_rules: Option<PathBuf>,
    /// A TOML file appended to the gateway child's config (e.g. a `[history]` section, to
    /// measure the cached read with the value history on).
    #[arg(long)]
    gateway_config: Option<PathBuf>,
    /// Where to write the results (with --all, or when given).
    #[arg(long)]
    write: Option<PathBuf>,
    /// Print only; do not write BENCHMARKS.md even with --all.
    #[arg(long)]
    no_write: bool,
    /// An environment variable for the gateway child only, KEY=VALUE (repeatable), e.g.
    /// TOKIO_WORKER_THREADS=1 to try a runtime setting without rebuilding.
    #[arg(long, value_name = "KEY=VALUE")]
    gateway_env: Vec<String>,
    /// Internal: serve ANSWER as the trivial hyper server in this process and nothing else (the
    /// cross-process baseline of the cached read runs the harness itself this way).
    #[arg(long, value_name = "ANSWER", hide = true)]
    serve_trivial: Option<String>,
    /// Internal: serve the floor server (the trivial one plus the JSON parse, the lookup and
    /// the access line any gateway needs for a cached `values/get` of NAME; `audited`: and the
    /// audit line; `streams`: the fan-out scenario's event streams, with both lines;
    /// `forced:STATION`: a `value/get` read from STATION, with both lines) in this
    /// process.
    #[arg(long, num_args = 3, value_names = ["NAME", "ANSWER", "plain|audited|streams|forced:STATION"], hide = true)]
    serve_floor: Option<Vec<String>>,
    /// Internal: serve the default station simulator and its control interface in this
    /// process and nothing else (the harness runs the station itself this way).
    #[arg(long, hide = true)]
    serve_station: bool,
    /// Internal: serve N default stations, each with a serial of its own, in this process and
    /// nothing else (`station-bench lab` runs its stations this way).
    #[arg(long, value_name = "N", hide = true)]
    serve_stations: Option<usize>,
    /// TOML appended to the gateway child's configuration file (repeatable), e.g.
    /// `--gateway-toml '[station]' --gateway-toml 'coalesce_max_us = 0'` to measure a setting.
    #[arg(long, value_name = "LINE")]
    gateway_toml: Vec<String>,
    /// A note to put beside the results (e.g. what else was running).
    #[arg(long)]
    note: Vec<String>,
}

/// Measurements other than the scenarios.
#[derive(clap::Subcommand, Debug)]
enum Command {
    /// One gateway serving N stations: start-up to /readyz, idle memory and CPU, CPU
    /// a request under a cached read spread over the stations; and N stations in one gateway
    /// beside N gateways of one station each. Prints; writes nothing.
    Lab(lab::LabArgs),
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Two load threads: one was a cap on the faster baselines.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(answer) = args.serve_trivial {
        return runtime.block_on(serve_trivial(answer));
    }
    if let Some(floor) = args.serve_floor {
        return runtime.block_on(serve_floor(floor));
    }
    if args.serve_station {
        return runtime.block_on(serve_station());
    }
    if let Some(count) = args.serve_stations {
        return runtime.block_on(lab::serve_stations(count));
    }
    if let Some(Command::Lab(lab)) = args.command {
        raise_file_limit();
        return runtime.block_on(lab::run(lab));
    }
    runtime.block_on(run(args))
}

/// The trivial server as a process of its own; runs until killed.
async fn serve_trivial(answer: String) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let addr = http::start_trivial_server(answer.into(), stop).await?;
    eprintln!("{}{addr}", child::TRIVIAL_READY);
    std::future::pending::<()>().await;
    Ok(())
}

/// The floor server as a process of its own; runs until killed.
async fn serve_floor(args: Vec<String>) -> anyhow::Result<()> {
    let [name, answer, floor] = <[String; 3]>::try_from(args).map_err(|_| {
        anyhow::anyhow!("--serve-floor takes NAME ANSWER plain|audited|streams|forced:STATION")
    })?;
    let addr = floor::start(name, answer.into(), floor.parse()?).await?;
    eprintln!("{}{addr}", child::TRIVIAL_READY);
    std::future::pending::<()>().await;
    Ok(())
}

/// The station as a process of its own; runs until killed.
async fn serve_station() -> anyhow::Result<()> {
    let simulator = Simulator::start(
        Profile::default_station(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .context("cannot start the simulator")?;
    let control = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    eprintln!(
        "{}{}{}{}",
        child::STATION_READY,
        simulator.local_addr(),
        child::STATION_CONTROL,
        control.local_addr()?
    );
    station_simulator::control::run_control(control, simulator).await;
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let selected: Vec<String> = if args.all || args.scenarios.is_empty() {
        SCENARIOS.iter().map(|s| (*s).to_owned()).collect()
    } else {
        for name in &args.scenarios {
            if !SCENARIOS.contains(&name.as_str()) {
                bail!("no scenario {name:?}; there are {}", SCENARIOS.join(", "));
            }
        }
        args.scenarios.clone()
    };
    let wants = |name: &str| selected.iter().any(|s| s == name);
    raise_file_limit();
    let command = std::env::args().skip(1).fold(
        "cargo run --release -p station-bench --".to_owned(),
        |acc, a| {
            if a.contains([' ', '\'', '"']) {
                format!("{acc} '{}'", a.replace('\'', "'\\''"))
            } else {
                format!("{acc} {a}")
            }
        },
    );
    let mut gateway_env = Vec::new();
    for pair in &args.gateway_env {
        let (key, value) = pair
            .split_once('=')
            .with_context(|| format!("--gateway-env {pair:?} is not KEY=VALUE"))?;
        gateway_env.push((key.to_owned(), value.to_owned()));
    }
    let load_at_start = report::load_average();
    let started_at = report::now_utc();

    let binary = child::locate_binary(args.gateway.clone(), true)?;
    let load_after_build = report::load_average();
    eprintln!("gateway binary: {}", binary.display());

    let simulator = Simulator::start(
        Profile::default_station(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .context("cannot start the simulator")?;
    let names: Vec<String> = simulator
        .profile()
        .channels
        .iter()
        .filter(|ch| ch.descriptor.readable && !ch.descriptor.consuming && ch.latency.is_zero())
        .map(|ch| ch.descriptor.name.clone())
        .collect();
    if names.len() < 10 {
        bail!(
            "the station profile has only {} plain readable channels",
            names.len()
        );
    }
    let bounds = Bounds {
        warmup: Duration::from_secs(args.duration_secs).div_f64(5.0),
        duration: Duration::from_secs(args.duration_secs),
        max_per_worker: args.max_requests_per_worker,
    };

    let mut rows: Vec<Row> = Vec::new();
    let needs_tcp_gateway = selected.iter().any(|s| s != "serial" && s != "sampling");
    if needs_tcp_gateway {
        let station = StationProcess::spawn().await?;
        let url = format!("tcp://{}", station.addr);
        // The load generator is one host standing in for many clients: give it the whole
        // connection limit, not the one-address share (a quarter) real clients get.
        let mut parts = vec![String::from("[http]\nmax_connections_per_ip = 4096\n")];
        if let Some(rules) = &args.gateway_rules {
            let rules = std::fs::canonicalize(rules)?;
            parts.push(format!(
                "[access]\nrules = {:?}\n",
                rules.display().to_string()
            ));
        }
        if let Some(extra) = &args.gateway_config {
            parts
                .push(std::fs::read_to_string(extra).with_context(|| {
                    format!("cannot read --gateway-config {}", extra.display())
                })?);
        }
        if !args.gateway_toml.is_empty() {
            parts.push(args.gateway_toml.join("\n"));
        }
        let config = crate::child::merged_config(&parts)?;
        let recipe = GatewayRecipe {
            binary: binary.clone(),
            station_url: url.clone(),
            env: gateway_env.clone(),
            config,
        };
        let gateway = recipe.spawn().await?;
        eprintln!(
            "station pid {} on {}; gateway pid {} on http://{} (legacy {:?})",
            station.pid, station.addr, gateway.pid, gateway.http_addr, gateway.legacy_addr
        );
        let bench = Bench {
            station,
            gateway,
            bounds,
            names: names.clone(),
            fanout_streams: args.streams,
            fanout_window: Duration::from_secs(args.fanout_secs),
            conns: args.conns,
            pairs: args.pairs,
            recipe,
        };
        let first_answer = bench.wait_until_serving(Duration::from_secs(20)).await?;
        if wants("idle") {
            step(&mut rows, "idle", async {
                Ok(bench.idle(first_answer).await)
            })
            .await;
        }
        if wants("cached") {
            step(&mut rows, "cached", bench.cached()).await;
        }
        if wants("forced") {
            step(&mut rows, "forced", bench.forced()).await;
        }
        if wants("forced-shared") {
            step(&mut rows, "forced-shared", bench.forced_shared()).await;
        }
        if wants("slow-station") {
            step(&mut rows, "slow-station", bench.slow_station()).await;
        }
        if wants("batch") {
            step(&mut rows, "batch", bench.batch()).await;
        }
        if wants("set") {
            step(&mut rows, "set", bench.set_one()).await;
        }
        if wants("sets") {
            step(&mut rows, "sets", bench.set_many()).await;
        }
        if wants("coalescing") {
            step(&mut rows, "coalescing", bench.coalescing()).await;
        }
        if wants("legacy") {
            step(&mut rows, "legacy", async { Ok(bench.legacy().await) }).await;
        }
        if wants("fanout") {
            step(&mut rows, "fanout", async { Ok(bench.fanout().await) }).await;
        }
        if wants("deadband") {
            step(&mut rows, "deadband", async {
                Ok(deadband::deadband(&bench).await)
            })
            .await;
        }
        if wants("slow-readers") {
            step(&mut rows, "slow-readers", async {
                Ok(slow_readers::slow_readers(&bench).await)
            })
            .await;
        }
        if wants("reconnects") {
            step(&mut rows, "reconnects", async {
                Ok(reconnects::reconnects(&bench).await)
            })
            .await;
        }
        if wants("bus") {
            step(&mut rows, "bus", async { Ok(bus::bus(&bench).await) }).await;
        }
        bench.gateway.stop().await;
    }
    if wants("serial") {
        step(&mut rows, "serial", async {
            Ok(
                scenarios::serial::serial(&simulator, &binary, &names[0], bounds, &gateway_env)
                    .await,
            )
        })
        .await;
    }
    if wants("sampling") {
        let samples = args.sampling_samples;
        step(
            &mut rows,
            "sampling (TCP)",
            sampling::tcp(&binary, &gateway_env, samples).map(Ok),
        )
        .await;
        step(&mut rows, "sampling (serial)", async {
            Ok(sampling::serial(&simulator, &binary, &gateway_env, samples).await)
        })
        .await;
    }
    if wants("bus") {
        step(&mut rows, "bus-serial", async {
            Ok(bus::bus_serial(&simulator, &binary, bounds, &gateway_env).await)
        })
        .await;
    }
    simulator.shutdown();
    rows.sort_by(|a, b| a.id.cmp(&b.id));

    let table = report::table(&rows);
    println!("{table}");

    let target = match (&args.write, args.all && !args.no_write) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => Some(workspace_root().join("BENCHMARKS.md")),
        (None, false) => None,
    };
    if let Some(path) = target {
        let mut notes = args.note.clone();
        let busy = load_at_start.max(load_after_build);
        if busy > 0.5 {
            notes.push(format!(
                "1-minute load average {load_at_start:.2} at the start and {load_after_build:.2} after the build (a build just before, or other work on the machine, still counts in it); treat throughput as a lower bound"
            ));
        }
        let mut section = format!(
            "## Results\n\n- Date: {started_at}\n- Machine: {}\n- Command: `{command}`\n- Each throughput run: {} s measured after {:.1} s of warm-up; fan-out measured over {} s\n",
            report::machine(),
            args.duration_secs,
            bounds.warmup.as_secs_f64(),
            args.fanout_secs
        );
        for note in notes {
            section.push_str(&format!("- Note: {note}\n"));
        }
        section.push('\n');
        section.push_str(&table);
        report::write_results(&path, &section)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs one scenario (one row or several); a failure becomes a "not measurable" row rather
/// than ending the run.
async fn step<R: Into<Vec<Row>>>(
    rows: &mut Vec<Row>,
    name: &str,
    scenario: impl std::future::Future<Output = anyhow::Result<R>>,
) {
    eprintln!("scenario {name} ...");
    let measured = match scenario.await {
        Ok(measured) => measured.into(),
        Err(why) => vec![Row::not_measurable("?", name, format!("{why:#}"))],
    };
    for row in measured {
        eprintln!(
            "  {} | {} | {} | {}",
            row.gateway, row.baseline, row.ratio, row.target
        );
        for note in &row.notes {
            eprintln!("  note: {note}");
        }
        rows.push(row);
    }
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// 1 000 event streams need more descriptors than a default soft limit may allow; the child
/// gateway inherits the raised limit.
fn raise_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
