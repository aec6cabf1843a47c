//! `station-dst`: runs seeds of the lab's deterministic simulation and says which failed, each
//! with the command that replays it.

use std::time::{Duration, Instant};

use clap::Parser;
use station_dst::{RunOptions, run};

/// Runs the lab's deterministic simulation.
#[derive(Parser, Debug)]
#[command(name = "station-dst")]
struct Args {
    /// How many seeds to run (from --first).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// Run seeds for this many minutes of wall time instead.
    #[arg(long)]
    minutes: Option<u64>,
    /// The first seed of a run of seeds.
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Replay this one seed.
    #[arg(long)]
    seed: Option<u64>,
    /// With --seed: print its trace, who did what when.
    #[arg(long)]
    trace: bool,
    /// Simulated seconds of faults per seed.
    #[arg(long, default_value_t = 60)]
    faulty_seconds: u64,
    /// Put back a fixed hole by name (needs the `reintroduce-holes` feature).
    #[arg(long)]
    reintroduce: Option<String>,
    /// Stop at the first seed that fails (the acid test: how long until a hole is found).
    #[arg(long)]
    until_found: bool,
}

/// The longest one seed may take in wall time.
const WATCHDOG: Duration = Duration::from_secs(90);

fn main() {
    let args = Args::parse();
    // The gateways' own log lines, interleaved with the trace: DST_LOG=info (an EnvFilter).
    if let Ok(filter) = std::env::var("DST_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .without_time()
            .with_writer(std::io::stdout)
            .init();
    }
    if let Some(name) = &args.reintroduce
        && let Err(why) = station_core::holes::reintroduce(name)
    {
        eprintln!("{why}");
        std::process::exit(2);
    }
    let options = |seed| RunOptions {
        seed,
        faulty_for: Duration::from_secs(args.faulty_seconds),
        echo: args.trace,
        reintroduce: args.reintroduce.clone(),
    };
    let started = Instant::now();
    let mut simulated = Duration::ZERO;
    let (mut ran, mut failed) = (0u64, 0u64);
    let seeds: Box<dyn Iterator<Item = u64>> = match args.seed {
        Some(seed) => Box::new(std::iter::once(seed)),
        None => Box::new(args.first..),
    };
    for seed in seeds {
        if args.seed.is_none() {
            let enough = match args.minutes {
                Some(minutes) => started.elapsed() >= Duration::from_secs(minutes * 60),
                None => ran >= args.seeds,
            };
            if enough {
                break;
            }
        }
        // A seed whose simulated time stops advancing (something spins at one instant) never
        // ends: it fails after WATCHDOG of wall time, and the run stops there (its thread
        // still spins).
        let (done, outcome) = std::sync::mpsc::channel();
        let seed_options = options(seed);
        std::thread::spawn(move || {
            let _ = done.send(run(seed_options));
        });
        let (failure, seed_simulated, hung) = match outcome.recv_timeout(WATCHDOG) {
            Ok(outcome) => (outcome.failure, outcome.simulated, false),
            Err(_) => (
                Some(format!(
                    "invariant 6: the seed did not end within {} s of wall time (simulated time stopped advancing)",
                    WATCHDOG.as_secs()
                )),
                Duration::ZERO,
                true,
            ),
        };
        ran += 1;
        simulated += seed_simulated;
        if let Some(why) = failure {
            failed += 1;
            let reintroduce = match &args.reintroduce {
                Some(name) => format!(" --reintroduce {name}"),
                None => String::new(),
            };
            println!(
                "seed {seed} FAILED after {} s wall: {why}",
                started.elapsed().as_secs()
            );
            println!(
                "  replay: cargo run --release -p station-dst{} -- --seed {seed}{reintroduce} --trace",
                if args.reintroduce.is_some() {
                    " --features reintroduce-holes"
                } else {
                    ""
                }
            );
            if args.until_found || hung {
                break;
            }
        }
    }
    println!(
        "dst: {ran} seeds, {failed} failed, simulated {} s in {} s wall",
        simulated.as_secs(),
        started.elapsed().as_secs()
    );
    // Exits rather than returns: a hung seed's thread would keep the process alive.
    std::process::exit(i32::from(failed > 0));
}
