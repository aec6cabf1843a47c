//! `station-cli`: a client of the station byte protocol for people and scripts.
//!
//! Prints values in the station format, one per line. Every error goes to stderr as one line
//! `station-cli: ...`: a station error with the station's message and exit status 1, a link or
//! usage problem with exit status 2.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use station_protocol::{ChannelDescriptor, Value};
use station_simulator::{ClientError, StationClient};
use tokio::io::{AsyncRead, AsyncWrite};

/// Talk to a station (or the gateway's legacy listener) over the station byte protocol.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The station's TCP address.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "serial")]
    connect: Option<String>,
    /// A serial device instead (e.g. a pty from `station-sim --pty`).
    #[arg(long, value_name = "DEVICE")]
    serial: Option<String>,
    /// Serial line speed.
    #[arg(long, default_value_t = 115_200)]
    baud: u32,
    /// How long to wait for each answer, in seconds.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Who the station is.
    Hello,
    /// The station's modules.
    System,
    /// Every channel: name, value type, access, unit.
    List,
    /// Read channels; one value per line.
    Read {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Write one channel (the text is read as the channel's type: 500, True, Red, *IDN?\n).
    Write { name: String, value: String },
    /// Write then read one channel as one step; prints what was read.
    Transact { name: String, value: String },
}

/// What went wrong, and which exit status it gets.
enum Failure {
    /// The station said no: its message.
    Station(String),
    /// The link or the command line.
    Other(String),
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        match error {
            ClientError::Station(error) => Failure::Station(error.message),
            other => Failure::Other(other.to_string()),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = match (&args.connect, &args.serial) {
        (Some(address), None) => match resolve(address).await {
            Ok(addr) => match StationClient::connect(addr).await {
                Ok(client) => run(client, &args).await,
                Err(error) => Err(Failure::Other(format!(
                    "cannot connect to {address}: {error}"
                ))),
            },
            Err(error) => Err(error),
        },
        (None, Some(device)) => {
            let opened =
                tokio_serial::SerialStream::open(&tokio_serial::new(device.as_str(), args.baud));
            match opened {
                Ok(port) => run(StationClient::new(port), &args).await,
                Err(error) => Err(Failure::Other(format!("cannot open {device}: {error}"))),
            }
        }
        _ => Err(Failure::Other(
            "say where the station is: --connect HOST:PORT or --serial DEVICE".to_owned(),
        )),
    };
    match outcome {
        Ok(status) => status,
        Err(Failure::Station(message)) => {
            eprintln!("station-cli: {message}");
            ExitCode::from(1)
        }
        Err(Failure::Other(message)) => {
            eprintln!("station-cli: {message}");
            ExitCode::from(2)
        }
    }
}

async fn resolve(address: &str) -> Result<SocketAddr, Failure> {
    tokio::net::lookup_host(address)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| Failure::Other(format!("cannot resolve {address}")))
}

/// Prints a value on its own line (a value ending in a newline gets no second one).
fn print_value(value: &Value) {
    let text = value.render();
    if text.ends_with('\n') {
        print!("{text}");
    } else {
        println!("{text}");
    }
}

async fn channel<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut StationClient<S>,
    name: &str,
) -> Result<ChannelDescriptor, Failure> {
    let channels = client.list_all().await?;
    channels
        .into_iter()
        .find(|c| c.name == name)
        .ok_or_else(|| Failure::Station(format!("no such channel: {name}")))
}

async fn parse_for<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut StationClient<S>,
    name: &str,
    text: &str,
) -> Result<Value, Failure> {
    let descriptor = channel(client, name).await?;
    Value::parse_as(descriptor.value_type, text, &descriptor.options)
        .map_err(|error| Failure::Other(format!("{name}: {error}")))
}

async fn run<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: StationClient<S>,
    args: &Args,
) -> Result<ExitCode, Failure> {
    if args.timeout.is_finite() && args.timeout > 0.0 {
        client.set_timeout(Duration::from_secs_f64(args.timeout));
    }
    let hello = client.hello("station-cli").await?;
    match &args.command {
        Command::Hello => {
            println!("station: {}", hello.station);
            println!("firmware: {}", hello.firmware);
            println!("serial: {}", hello.serial);
            println!("protocol: {}", hello.version);
            println!("window: {}", hello.window);
        }
        Command::System => {
            for module in client.system().await? {
                println!(
                    "{}\t{}\t{}\trev {}\t{}",
                    module.index, module.name, module.product_id, module.revision, module.serial
                );
            }
        }
        Command::List => {
            for c in client.list_all().await? {
                let access = match (c.readable, c.writable) {
                    (true, true) => "rw",
                    (true, false) => "r",
                    (false, true) => "w",
                    (false, false) => "-",
                };
                println!("{}\t{}\t{}\t{}", c.name, c.value_type, access, c.unit);
            }
        }
        Command::Read { names } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut failed = false;
            for result in client.read(&names).await? {
                match result {
                    Ok(value) => print_value(&value),
                    Err(error) => {
                        eprintln!("station-cli: {}", error.message);
                        failed = true;
                    }
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Write { name, value } => {
            let value = parse_for(&mut client, name, value).await?;
            client.write_one(name, value).await?;
        }
        Command::Transact { name, value } => {
            let value = parse_for(&mut client, name, value).await?;
            print_value(&client.transact(name, value).await?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
