//! The command line of `station-lease` (clap): the subcommands and their flags, and the pure
//! checks that turn them into what to hold ([`Target`]) and which signal `--on-lost` means.

use std::ffi::OsString;
use std::str::FromStr;

use clap::{Args, Parser, Subcommand};
use nix::sys::signal::Signal;

/// Hold a lease of the station gateway (or of a lease backend) around a command.
#[derive(Debug, Parser)]
#[command(
    name = "station-lease",
    version,
    about = "Hold the station gateway's control lease, a named lease or a semaphore slot \
             (through the gateway, or on a lease backend directly) for as long as a command runs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire the lease, run the command while renewing it, release it when the command ends.
    ///
    /// Exit status: the command's own; 75 when the lease was not had within --wait-ms; 70 when
    /// it was lost while the command ran; 64 for bad usage; 69 when the gateway or backend
    /// could not be asked; 77 when the gateway refused the credentials; 126/127 when the
    /// command could not be run.
    Hold(HoldArgs),
    /// Who holds the lease, for how long, and its fence.
    Status(StatusArgs),
    /// Break the gateway's control lease with the admin token (`DELETE api/lease`).
    Break(BreakArgs),
}

/// Where the lease is: a gateway (its control lease, or a named lease or semaphore under
/// `/v1/`), or a lease backend directly.
#[derive(Debug, Args)]
pub struct Place {
    /// The gateway's base URL, with its path prefix if it has one (e.g. http://127.0.0.1:5000).
    #[arg(long, value_name = "URL")]
    pub gateway: Option<String>,
    /// A lease backend used directly, with the engine the gateway uses: sqlite:PATH,
    /// postgres://..., redis://... (needs --name).
    #[arg(long, value_name = "URL")]
    pub backend: Option<String>,
    /// One station of a gateway serving several: its control lease (or --name lease), at
    /// <gateway>/stations/ID, as if that were the gateway's URL (STATION_GATEWAY_URL too).
    #[arg(long, value_name = "ID")]
    pub station: Option<String>,
    /// The gateway's control lease (`POST api/lease`); the default with --gateway.
    #[arg(long)]
    pub control: bool,
    /// A named lease (`/v1/leases/NAME`; in a backend `lease:NAME`).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Make the named lease a semaphore of N slots (`/v1/semaphores/NAME?slots=N`; in a
    /// backend `semaphore:NAME`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub slots: Option<u32>,
    /// The gateway's API key, sent as X-Api-Key (when its access control is on).
    #[arg(
        long,
        value_name = "KEY",
        env = "STATION_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

#[derive(Debug, Args)]
pub struct HoldArgs {
    #[command(flatten)]
    pub place: Place,
    /// Who holds it, as others see it.
    #[arg(long, value_name = "TEXT")]
    pub owner: String,
    /// The lease's time to live; it is renewed every third of it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub ttl_ms: u64,
    /// How long to wait for the lease when someone else holds it.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub wait_ms: u64,
    /// The signal the command gets when the lease is lost: term, kill, or any signal by name
    /// (SIGUSR1, HUP) or number.
    #[arg(long, value_name = "SIGNAL", default_value = "term", value_parser = parse_signal)]
    pub on_lost: Signal,
    /// How long after the --on-lost signal the command is killed (SIGKILL).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub grace_ms: u64,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub place: Place,
}

#[derive(Debug, Args)]
pub struct BreakArgs {
    /// The gateway's base URL.
    #[arg(long, value_name = "URL")]
    pub gateway: String,
    /// The gateway's `lease.admin_token`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "STATION_LEASE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: String,
    /// An API key to send along (the admin token is the authority either way).
    #[arg(
        long,
        value_name = "KEY",
        env = "STATION_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

/// What to hold, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The gateway's control lease.
    GatewayControl { gateway: String },
    /// A named lease (`slots: None`) or semaphore slot through the gateway's `/v1/`.
    GatewayNamed {
        gateway: String,
        name: String,
        slots: Option<u32>,
    },
    /// A named lease or semaphore slot directly on a backend.
    Backend {
        url: String,
        name: String,
        slots: Option<u32>,
    },
}

impl Place {
    /// What the flags name, or what is wrong with them.
    pub fn target(&self) -> Result<Target, String> {
        let name = self.name.clone();
        if self.slots.is_some() && name.is_none() {
            return Err("--slots makes a named lease a semaphore: give --name NAME too".into());
        }
        if self.control && name.is_some() {
            return Err("give --control or --name NAME, not both".into());
        }
        match (&self.gateway, &self.backend) {
            (Some(_), Some(_)) => Err(
                "give --gateway URL or --backend URL, not both (the gateway has a backend of its own)"
                    .into(),
            ),
            (None, None) => Err("give --gateway URL, or --backend URL with --name NAME".into()),
            (Some(gateway), None) => {
                let gateway = gateway.trim().trim_end_matches('/').to_owned();
                if !(gateway.starts_with("http://") || gateway.starts_with("https://")) {
                    return Err(format!(
                        "--gateway must be an http:// or https:// URL; got {gateway:?}"
                    ));
                }
                let gateway = match &self.station {
                    Some(id) => station_url(&gateway, id)?,
                    None => gateway,
                };
                Ok(match name {
                    Some(name) => Target::GatewayNamed {
                        gateway,
                        name,
                        slots: self.slots,
                    },
                    None => Target::GatewayControl { gateway },
                })
            }
            (None, Some(url)) => {
                if self.station.is_some() {
                    return Err(
                        "--station is a station of a gateway: use --gateway URL with it".into(),
                    );
                }
                if self.control {
                    return Err(
                        "the control lease is the gateway's: use --gateway URL for it".into(),
                    );
                }
                let name = name.ok_or(
                    "with --backend, give --name NAME (the control lease is the gateway's)",
                )?;
                Ok(Target::Backend {
                    url: url.clone(),
                    name,
                    slots: self.slots,
                })
            }
        }
    }
}

/// The longest station id (as the gateway's `[[station]] id`).
pub const MAX_STATION_ID_LEN: usize = 64;

/// What is wrong with `id` as a station's id (letters, digits, `-` and `_`, at most
/// [`MAX_STATION_ID_LEN`]: the gateway's own rule, since it goes in a path), `None` if
/// nothing.
pub fn station_id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("--station needs a station's id, e.g. --station st1; got nothing".into());
    }
    if id.len() > MAX_STATION_ID_LEN {
        return Some(format!(
            "--station {id:?} is {} bytes long: a station's id is at most {MAX_STATION_ID_LEN}",
            id.len()
        ));
    }
    id.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        .map(|bad| {
            format!(
                "--station {id:?} has {bad:?}: a station's id has only letters, digits, '-' and '_'"
            )
        })
}

/// The base URL of station `id` of the gateway at `gateway` (without a trailing `/`):
/// `<gateway>/stations/<id>`, where every path of that station is as the gateway's own.
pub fn station_url(gateway: &str, id: &str) -> Result<String, String> {
    if let Some(problem) = station_id_problem(id) {
        return Err(problem);
    }
    Ok(format!("{}/stations/{id}", gateway.trim_end_matches('/')))
}

/// `term`, `kill`, a name with or without `SIG` in any case (`SIGUSR1`, `hup`), or a number.
pub fn parse_signal(text: &str) -> Result<Signal, String> {
    let text = text.trim();
    if let Ok(number) = text.parse::<i32>() {
        return Signal::try_from(number).map_err(|_| format!("{number} is not a signal number"));
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&name)
        .map_err(|_| format!("{text:?} is not a signal: give term, kill, SIGUSR1, HUP, 15, ..."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(args: &[&str]) -> Place {
        let mut all = vec!["station-lease", "status"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).unwrap().command {
            Command::Status(status) => status.place,
            _ => unreachable!(),
        }
    }

    #[test]
    fn signals_parse_by_short_name_full_name_or_number() {
        assert_eq!(parse_signal("term").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("kill").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("SIGUSR1").unwrap(), Signal::SIGUSR1);
        assert_eq!(parse_signal("hup").unwrap(), Signal::SIGHUP);
        assert_eq!(parse_signal("2").unwrap(), Signal::SIGINT);
        for bad in ["", "nope", "0", "999"] {
            assert!(parse_signal(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_flags_name_one_lease_or_say_what_is_wrong() {
        assert_eq!(
            place(&["--gateway", "http://h:5000/"]).target().unwrap(),
            Target::GatewayControl {
                gateway: "http://h:5000".into()
            }
        );
        assert_eq!(
            place(&["--gateway", "http://h", "--control"])
                .target()
                .unwrap(),
            Target::GatewayControl {
                gateway: "http://h".into()
            }
        );
        assert_eq!(
            place(&["--gateway", "http://h", "--name", "ramp", "--slots", "2"])
                .target()
                .unwrap(),
            Target::GatewayNamed {
                gateway: "http://h".into(),
                name: "ramp".into(),
                slots: Some(2)
            }
        );
        assert_eq!(
            place(&["--backend", "sqlite:/tmp/l.db", "--name", "x"])
                .target()
                .unwrap(),
            Target::Backend {
                url: "sqlite:/tmp/l.db".into(),
                name: "x".into(),
                slots: None
            }
        );
        for (args, says) in [
            (&[][..], "give --gateway URL"),
            (
                &["--gateway", "http://h", "--backend", "memory"][..],
                "not both",
            ),
            (&["--gateway", "h:5000"][..], "http:// or https://"),
            (
                &["--gateway", "http://h", "--control", "--name", "x"][..],
                "not both",
            ),
            (
                &["--gateway", "http://h", "--slots", "2"][..],
                "--name NAME too",
            ),
            (&["--backend", "memory"][..], "give --name NAME"),
            (&["--backend", "memory", "--control"][..], "the gateway's"),
        ] {
            let error = place(args).target().unwrap_err();
            assert!(error.contains(says), "{args:?}: {error}");
        }
    }

    #[test]
    fn a_stations_url_is_the_gateways_with_the_station_after_it() {
        assert_eq!(
            station_url("http://h:5000", "st1").unwrap(),
            "http://h:5000/stations/st1"
        );
        assert_eq!(
            station_url("https://h/gw/", "St-2_b").unwrap(),
            "https://h/gw/stations/St-2_b"
        );
        let longest = "s".repeat(MAX_STATION_ID_LEN);
        assert_eq!(
            station_url("http://h", &longest).unwrap(),
            format!("http://h/stations/{longest}")
        );
    }

    #[test]
    fn a_station_id_has_letters_digits_dashes_and_underscores_only() {
        for good in ["st1", "ST_1", "a-b", "0", &"x".repeat(64)] {
            assert_eq!(station_id_problem(good), None, "{good}");
        }
        for (bad, says) in [
            ("", "got nothing"),
            ("st 1", "' '"),
            ("st/1", "'/'"),
            ("st1?x=1", "'?'"),
            ("..", "'.'"),
            ("stä", "'ä'"),
            (&"x".repeat(65), "at most 64"),
        ] {
            let problem = station_id_problem(bad).expect(bad);
            assert!(problem.contains(says), "{bad:?}: {problem}");
            assert!(problem.contains("--station"), "{problem}");
            assert!(station_url("http://h", bad).is_err());
        }
    }

    #[test]
    fn station_makes_the_gateway_that_stations() {
        assert_eq!(
            place(&["--gateway", "http://h:5000/", "--station", "st1"])
                .target()
                .unwrap(),
            Target::GatewayControl {
                gateway: "http://h:5000/stations/st1".into()
            }
        );
        assert_eq!(
            place(&["--gateway", "http://h/gw", "--station", "st2", "--control"])
                .target()
                .unwrap(),
            Target::GatewayControl {
                gateway: "http://h/gw/stations/st2".into()
            }
        );
        assert_eq!(
            place(&[
                "--gateway",
                "http://h",
                "--station",
                "st2",
                "--name",
                "ramp"
            ])
            .target()
            .unwrap(),
            Target::GatewayNamed {
                gateway: "http://h/stations/st2".into(),
                name: "ramp".into(),
                slots: None
            }
        );
        for (args, says) in [
            (&["--gateway", "http://h", "--station", "st/1"][..], "'/'"),
            (
                &["--gateway", "http://h", "--station", ""][..],
                "got nothing",
            ),
            (
                &["--backend", "memory", "--name", "x", "--station", "st1"][..],
                "use --gateway URL",
            ),
        ] {
            let error = place(args).target().unwrap_err();
            assert!(error.contains(says), "{args:?}: {error}");
        }
        let parsed = Cli::try_parse_from([
            "station-lease",
            "hold",
            "--gateway",
            "http://h",
            "--station",
            "st1",
            "--owner",
            "me",
            "--ttl-ms",
            "3000",
            "--",
            "true",
        ])
        .unwrap();
        let Command::Hold(hold) = parsed.command else {
            panic!("not hold")
        };
        assert_eq!(
            hold.place.target().unwrap(),
            Target::GatewayControl {
                gateway: "http://h/stations/st1".into()
            }
        );
    }

    #[test]
    fn hold_needs_an_owner_a_ttl_and_a_command() {
        let parsed = Cli::try_parse_from([
            "station-lease",
            "hold",
            "--gateway",
            "http://h",
            "--owner",
            "me",
            "--ttl-ms",
            "3000",
            "--on-lost",
            "kill",
            "--",
            "sh",
            "-c",
            "true",
        ])
        .unwrap();
        let Command::Hold(hold) = parsed.command else {
            panic!("not hold")
        };
        assert_eq!(hold.on_lost, Signal::SIGKILL);
        assert_eq!(hold.command, ["sh", "-c", "true"]);
        assert_eq!((hold.wait_ms, hold.grace_ms), (0, 10_000));
        for missing in [
            &[
                "hold",
                "--gateway",
                "http://h",
                "--ttl-ms",
                "3000",
                "--",
                "true",
            ][..],
            &[
                "hold",
                "--gateway",
                "http://h",
                "--owner",
                "me",
                "--",
                "true",
            ][..],
            &[
                "hold",
                "--gateway",
                "http://h",
                "--owner",
                "me",
                "--ttl-ms",
                "3000",
            ][..],
            &["hold", "--owner", "me", "--ttl-ms", "0", "--", "true"][..],
        ] {
            let all = std::iter::once("station-lease").chain(missing.iter().copied());
            assert!(Cli::try_parse_from(all).is_err(), "{missing:?}");
        }
    }
}
