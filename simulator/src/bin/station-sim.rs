//! `station-sim`: runs the simulated station on TCP, and on a pseudo-terminal with `--pty`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use station_simulator::profile::DEFAULT_PROFILE_TOML;
use station_simulator::{Profile, Simulator, control};

/// A simulated high-voltage test station speaking the station byte protocol.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// TCP address to serve; port 0 picks a free one (printed on start).
    #[arg(long, default_value = "127.0.0.1:4000")]
    listen: SocketAddr,
    /// Station profile (TOML); the built-in default is config/station.toml.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Also serve a pseudo-terminal (window 1) and print its device path.
    #[arg(long)]
    pty: bool,
    /// Pace the pty's replies as a serial line of this many bits per second would.
    #[arg(long)]
    baud: Option<u32>,
    /// Time every request takes before it is answered (overrides the profile).
    #[arg(long)]
    processing_ms: Option<u64>,
    /// How many applied writes (and READ batch sizes) to keep for `writes`; older ones are
    /// dropped and counted, so a simulator left running does not grow.
    #[arg(long, value_name = "N", default_value_t = station_simulator::DEFAULT_HISTORY_LIMIT)]
    history: usize,
    /// Serve a line-based control interface (drop, stall on|off, corrupt, delay MS, ...).
    #[arg(long)]
    control: Option<SocketAddr>,
    /// Print the built-in default profile and exit.
    #[arg(long)]
    print_default_profile: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.print_default_profile {
        print!("{DEFAULT_PROFILE_TOML}");
        return Ok(());
    }
    let profile = match &args.profile {
        Some(path) => Profile::from_file(path)?,
        None => Profile::default_station(),
    };
    if args.baud == Some(0) {
        anyhow::bail!("--baud must be above 0");
    }
    let simulator = Simulator::start(profile, args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    if let Some(ms) = args.processing_ms {
        simulator.set_processing_time(Duration::from_millis(ms));
    }
    simulator.set_history_limit(args.history);
    println!("listening {}", simulator.local_addr());
    if args.pty {
        let path = simulator
            .attach_pty(args.baud)
            .context("cannot open a pseudo-terminal")?;
        println!("pty {}", path.display());
    }
    if let Some(addr) = args.control {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for control on {addr}"))?;
        println!("control {}", listener.local_addr()?);
        tokio::spawn(control::run_control(listener, simulator.clone()));
    }
    tokio::signal::ctrl_c().await?;
    simulator.shutdown();
    Ok(())
}
