//! `station-lease`: holds a lease of the station gateway (its control lease, or a named lease
//! or semaphore slot under `/v1/`), or of a lease backend directly, around a command, as
//! `flock(1)` holds a file lock; `status` says who holds it and `break` is the admin break.
//! The decisions are in `holding.rs` (pure), the process and signals in `supervise.rs`.

mod cli;
mod group;
mod holding;
mod source;
mod supervise;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use cli::{Cli, Command};
use holding::EXIT_USAGE;

/// One line on stderr, starting `station-lease:`.
pub fn say(text: &str) {
    eprintln!("station-lease: {text}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = error.print();
                    return ExitCode::SUCCESS;
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = error.print();
                    return ExitCode::from(EXIT_USAGE);
                }
                _ => {}
            }
            let text = error.render().to_string();
            say(text.trim().trim_start_matches("error: "));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    ExitCode::from(run(cli).await)
}

async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Hold(args) => match args.place.target() {
            Ok(target) => supervise::hold(args, target).await,
            Err(why) => usage(&why),
        },
        Command::Status(args) => match args.place.target() {
            Ok(target) => match source::status(&target, args.place.api_key.clone()).await {
                Ok(text) => {
                    println!("{text}");
                    0
                }
                Err(failure) => {
                    say(&failure.message);
                    failure.status
                }
            },
            Err(why) => usage(&why),
        },
        Command::Break(args) => {
            let gateway = args.gateway.trim();
            if !(gateway.starts_with("http://") || gateway.starts_with("https://")) {
                return usage(&format!(
                    "--gateway must be an http:// or https:// URL; got {gateway:?}"
                ));
            }
            let gateway = source::Gateway::new(gateway, args.api_key.clone());
            match gateway.break_control(&args.admin_token).await {
                Ok(text) => {
                    say(&text);
                    0
                }
                Err(failure) => {
                    say(&failure.message);
                    failure.status
                }
            }
        }
    }
}

fn usage(why: &str) -> u8 {
    say(&format!("{why} (see station-lease --help)"));
    EXIT_USAGE
}
