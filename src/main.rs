//! `station-gateway`: parses flags and config, binds the listeners, and runs the gateway
//! until SIGINT or SIGTERM.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use station_gateway::config::lab::Lab;
use station_gateway::config::{Config, EXAMPLE_CONFIG, parse_listen};
use station_gateway::logs::BatchingWriterGuard;
use station_gateway::{BindError, LabListeners, Listener, run_lab};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "The one way to a high-voltage test station: REST contract, control lease, value cache"
)]
struct Args {
    /// Config file (TOML); see config/gateway.toml or --print-config. Every key has a default;
    /// flags override the file. [default: none]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The station: tcp://HOST:PORT or serial:///dev/ttyUSB0?baud=115200 (station.url).
    /// [default: tcp://127.0.0.1:4000]
    #[arg(long, value_name = "URL")]
    station: Option<String>,
    /// Where to serve HTTP (http.listen); port 0 picks a free one, logged at start.
    /// [default: 127.0.0.1:5000]
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Where to serve the legacy byte protocol, e.g. 127.0.0.1:4001 (legacy.listen).
    /// [default: off]
    #[arg(long, value_name = "ADDR")]
    legacy: Option<String>,
    /// Where leases live: memory, sqlite:PATH, postgres://... or redis://... (lease.backend).
    /// [default: memory]
    #[arg(long, value_name = "URL")]
    lease_backend: Option<String>,
    /// Start an embedded simulated station and point the link at it (instead of --station):
    /// try the gateway without hardware. `--simulator N` starts N stations, sim1...simN, each
    /// at /stations/simK/api/...; with a config of several [[station]] tables, `--simulator`
    /// gives each of them a simulated station.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "1")]
    simulator: Option<usize>,
    /// Where the embedded simulator serves the byte protocol, e.g. 127.0.0.1:4000.
    /// [default: a free port, logged at start as "simulator listening ADDR"]
    #[arg(long, value_name = "ADDR", requires = "simulator")]
    simulator_listen: Option<String>,
    /// The embedded simulator's station profile.
    /// [default: the built-in station, a copy of config/station.toml]
    #[arg(long, value_name = "FILE", requires = "simulator")]
    simulator_profile: Option<PathBuf>,
    /// Adds an API key with the role `control` (sent as X-Api-Key); turns access control on.
    /// May be given more than once. [default: none; access control off]
    #[arg(long = "api-key", value_name = "KEY")]
    api_keys: Vec<String>,
    /// Stand by for another gateway of the same station (ha.mode = "standby"): serve health,
    /// readiness and metrics, point API clients at the owner, and take the station over once
    /// the owner's link-owner lease lapses. Needs a shared --lease-backend. [default: owner]
    #[arg(long)]
    standby: bool,
    /// Log format: human or json. RUST_LOG sets the level (default info).
    #[arg(long, default_value = "human")]
    log_format: String,
    /// Print the documented example config and exit.
    #[arg(long)]
    print_config: bool,
}

/// The gateway's own runtime: one worker thread (`TOKIO_WORKER_THREADS` may say otherwise),
/// where the link, the lease, the change runner and the first of the HTTP connections run, so
/// that a request to the station crosses no thread; `http.threads` adds threads for more
/// connections (`http::threads`; measured in BENCHMARKS.md, "The cached read").
fn gateway_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(1);
    }
    builder.enable_all().build()
}

/// Runs the gateway; a failure to start is one line on stderr, `station-gateway: ...`, and exit
/// status 1 (no backtrace, whatever `RUST_BACKTRACE` says: the message is for an operator).
fn main() -> ExitCode {
    let started = gateway_runtime()
        .context("cannot start the async runtime")
        .and_then(|runtime| runtime.block_on(gateway_main(Args::parse())));
    match started {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("station-gateway: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, leaving out a cause its effect already quotes.
fn one_line(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

async fn gateway_main(args: Args) -> anyhow::Result<()> {
    if args.simulator.is_some() && args.station.is_some() {
        // Both say where the link goes; taking one silently would test the wrong station.
        Args::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--simulator and --station both say where the station is: --simulator starts \
                 an embedded simulated station, --station points at a real one; give one of them",
            )
            .exit();
    }
    let shutdown = shutdown_signal()?;
    if args.print_config {
        print!("{EXAMPLE_CONFIG}");
        return Ok(());
    }
    let _log_writer = init_logging(&args.log_format)?;

    let mut lab = match &args.config {
        Some(path) => Lab::from_file(path)?,
        None => Lab::single(Config::default()),
    };
    let configured = lab.stations.len();
    match args.simulator {
        Some(0) => anyhow::bail!("--simulator 0: give the number of simulated stations, 1 or more"),
        Some(count) if count > 1 && configured > 1 && count != configured => anyhow::bail!(
            "--simulator {count}: the configuration names {configured} stations ({}); give --simulator without a number to simulate each of them",
            lab.ids().join(", ")
        ),
        Some(count) if count > 1 && configured == 1 => {
            lab = Lab::simulated(&lab.stations[0].config, count)
                .map_err(|error| anyhow::anyhow!("--simulator {count}: {error}"))?;
        }
        _ => {}
    }
    let several = lab.stations.len() > 1;
    if several {
        // One station's address or listener cannot be given for several.
        if args.station.is_some() {
            anyhow::bail!(
                "--station names one station, and the configuration has {} ({}): give each [[station]] its url in the file",
                lab.stations.len(),
                lab.ids().join(", ")
            );
        }
        if args.legacy.is_some() {
            anyhow::bail!(
                "--legacy names one listener, and the gateway serves {} stations: give each its own [station.legacy] listen in the file",
                lab.stations.len()
            );
        }
        if args.simulator_listen.is_some() {
            anyhow::bail!(
                "--simulator-listen names one address, and there are {} simulated stations: each takes a free port, logged at start",
                lab.stations.len()
            );
        }
    }
    if let Some(http) = &args.http {
        parse_listen(http).map_err(|why| anyhow::anyhow!("--http: {why}"))?;
    }
    if let Some(legacy) = &args.legacy {
        parse_listen(legacy).map_err(|why| anyhow::anyhow!("--legacy: {why}"))?;
    }
    let station_named = args.station.is_some();
    for setup in &mut lab.stations {
        let config = &mut setup.config;
        if let Some(station) = &args.station {
            config.station.url = station.clone();
        }
        if let Some(http) = &args.http {
            config.http.listen = http.clone();
        }
        if let Some(legacy) = &args.legacy {
            config.legacy.listen = legacy.clone();
        }
        if let Some(backend) = &args.lease_backend {
            config.lease.backend = backend.clone();
        }
        add_api_keys(config, args.api_keys.clone());
        if args.standby {
            config.ha.mode = station_gateway::config::HaMode::Standby;
        }
    }

    let mut _simulators = Vec::new();
    if args.simulator.is_some() {
        let profile = match &args.simulator_profile {
            // Formatted into one line: the error already says the cause; no "Caused by" repeat.
            Some(path) => station_simulator::Profile::from_file(path)
                .map_err(|error| anyhow::anyhow!("--simulator-profile: {error}"))?,
            None => station_simulator::Profile::default_station(),
        };
        for setup in &mut lab.stations {
            let mut profile = profile.clone();
            if several {
                // Each simulated station its own identity, as each real one has.
                profile.station.serial = format!("{}-{}", profile.station.serial, setup.id);
            }
            _simulators.push(
                start_simulator(&args, &setup.id, several, profile, &mut setup.config).await?,
            );
        }
    }
    if args.simulator.is_none()
        && !station_named
        && !several
        && lab.stations[0].config.station.url == default_station_url()
    {
        tracing::info!(
            "{}",
            default_station_notice(&lab.stations[0].config.station.url)
        );
    }
    for setup in &lab.stations {
        setup.config.validate()?;
    }
    station_gateway::config::lab::check_apart(&lab.stations)?;

    let listeners = LabListeners::bind(&lab).await?;
    run_lab(listeners, lab, shutdown).await?;
    tracing::info!("station-gateway stopped");
    Ok(())
}

/// Starts the embedded simulator of station `id` and points `config`'s link at it.
async fn start_simulator(
    args: &Args,
    id: &str,
    several: bool,
    profile: station_simulator::Profile,
    config: &mut Config,
) -> anyhow::Result<station_simulator::SimulatorHandle> {
    let configured = &config.station.url;
    if *configured != default_station_url() {
        tracing::warn!(
            "--simulator: the link goes to the embedded simulator, not to station.url \
             {configured} from the config file"
        );
    }
    // The control lease is named after the station, not after its address: the embedded
    // simulator takes a new port each start, and a lease in a lasting backend must still be
    // found after a restart. Its serial (what HELLO will say) is known from the profile now,
    // before the link-owner lease is claimed and the lease resumed.
    if config.lease.name.trim().is_empty() && config.station_id().is_none() {
        config.lease.name = simulator_lease_name(&profile.station.serial);
        tracing::info!(
            "--simulator: the control lease (one client at a time may change the station: \
             POST api/lease) is named {}, after the simulated station's serial",
            config.lease.name
        );
    }
    let listen = args.simulator_listen.as_deref().unwrap_or("127.0.0.1:0");
    let listen =
        parse_listen(listen).map_err(|why| anyhow::anyhow!("--simulator-listen: {why}"))?;
    let simulator = station_simulator::Simulator::start(profile, listen)
        .await
        .map_err(|error| BindError::new(Listener::Simulator, listen.to_string(), error))?;
    // Nothing reads the embedded simulator's write log (it has no control port): a short
    // one, so that a demo left running does not grow with every write.
    simulator.set_history_limit(EMBEDDED_SIMULATOR_HISTORY);
    let addr = simulator.local_addr();
    config.station.url = format!("tcp://{addr}");
    if several {
        tracing::info!("simulator {id} listening {addr}");
    } else {
        tracing::info!("simulator listening {addr}");
    }
    Ok(simulator)
}

fn default_station_url() -> String {
    station_gateway::config::StationConfig::default().url
}

/// What a gateway started without a station says once: where its link goes, and the two ways
/// to give it a station (a newcomer without hardware otherwise sees only "station link down").
fn default_station_notice(url: &str) -> String {
    format!(
        "no station given: the link goes to the default station.url {url}; \
         to try the gateway without hardware, start it with --simulator; \
         to use a real station, --station tcp://HOST:PORT (or serial:///dev/ttyUSB0?baud=115200)"
    )
}

/// `--api-key KEY`: one `control` key each.
fn add_api_keys(config: &mut Config, keys: Vec<String>) {
    for key in keys {
        config.access.keys.push(station_gateway::config::ApiKey {
            key,
            role: station_gateway::config::Role::Control,
            name: String::new(),
        });
    }
}

/// The applied writes (and READ batch sizes) the embedded simulator keeps: its newest, for a
/// debugger; about 260 KB.
const EMBEDDED_SIMULATOR_HISTORY: usize = 1_000;

/// The control lease's name for the embedded simulator: after the station's identity (its
/// serial, as HELLO reports it), never its address.
fn simulator_lease_name(serial: &str) -> String {
    format!("control:station:{serial}")
}

/// Logs go to stderr through a writer thread (`station_gateway::logs`): request tasks never make
/// the write system call, and an access line does not even wake the thread — they are written
/// in batches; other lines go out at once. Keep the guard until the end of `main`: dropping it
/// writes what is left.
fn init_logging(format: &str) -> anyhow::Result<BatchingWriterGuard> {
    let ansi = std::io::stderr().is_terminal();
    Ok(station_gateway::logs::install(
        format,
        ansi,
        std::io::stderr(),
    )?)
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// it is first awaited, so a signal that arrives while the gateway starts is not lost (nor does
/// it kill the process by its default action).
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        Ok(async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_key_flags_add_control_keys() {
        let args = Args::try_parse_from([
            "station-gateway",
            "--api-key",
            "first-key-0123456789",
            "--api-key=second-key-0123456789",
        ])
        .unwrap();
        let mut config = Config::default();
        add_api_keys(&mut config, args.api_keys);
        if args.standby {
            config.ha.mode = station_gateway::config::HaMode::Standby;
        }
        let keys: Vec<_> = config
            .access
            .keys
            .iter()
            .map(|k| (k.key.as_str(), k.role))
            .collect();
        use station_gateway::config::Role;
        assert_eq!(
            keys,
            [
                ("first-key-0123456789", Role::Control),
                ("second-key-0123456789", Role::Control)
            ]
        );
        config.validate().unwrap();
        let args = Args::try_parse_from(["station-gateway"]).unwrap();
        assert!(args.api_keys.is_empty());
    }
}
