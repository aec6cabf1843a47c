//! The shell of `station-lease hold`: acquires, runs the command with the lease in its
//! environment, renews on the schedule `holding.rs` decides, signals the command as it says,
//! forwards SIGINT and SIGTERM to it, and releases the lease once it has ended.

use std::ffi::OsString;
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getpgrp, tcgetpgrp};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::cli::{HoldArgs, Target};
use crate::holding::{
    Action, ChildEnd, EXIT_CANNOT_RUN, EXIT_NOT_FOUND, EXIT_NOT_HAD, EXIT_UNAVAILABLE, Holding,
    RenewalAnswer, needs_confirming, renewal_interval,
};
use crate::say;
use crate::source::{self, Had, HeldLease};

/// How long the release after the command may take.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// `station-lease hold`: its exit status.
pub async fn hold(args: HoldArgs, target: Target) -> u8 {
    let (mut interrupts, mut terminations) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(interrupts), Ok(terminations)) => (interrupts, terminations),
        (Err(error), _) | (_, Err(error)) => {
            say(&format!("cannot listen for SIGINT and SIGTERM: {error}"));
            return EXIT_UNAVAILABLE;
        }
    };
    let ttl = Duration::from_millis(args.ttl_ms);
    let wait = Duration::from_millis(args.wait_ms);
    let acquiring = source::acquire(&target, args.place.api_key.clone(), &args.owner, ttl, wait);
    let had = tokio::select! {
        had = acquiring => had,
        _ = interrupts.recv() => {
            say("interrupted (SIGINT) while waiting for the lease; the command did not run");
            return 128 + Signal::SIGINT as u8;
        }
        _ = terminations.recv() => {
            say("terminated (SIGTERM) while waiting for the lease; the command did not run");
            return 128 + Signal::SIGTERM as u8;
        }
    };
    let had = match had {
        Ok(had) => had,
        Err(failure) => {
            say(&failure.message);
            return failure.status;
        }
    };
    let Had {
        held,
        id,
        fence,
        mut expires_in,
        mut asked_at,
    } = had;
    if needs_confirming(ttl, asked_at, Instant::now()) {
        let renewed_at = Instant::now();
        match held.renew(ttl, renewal_interval(ttl)).await {
            RenewalAnswer::Renewed { expires_in: left } => {
                expires_in = left;
                asked_at = renewed_at;
            }
            RenewalAnswer::Gone { why } => {
                say(&format!(
                    "the lease was had after a wait but was gone by its first renewal ({why}); the command did not run"
                ));
                return EXIT_NOT_HAD;
            }
            RenewalAnswer::Unanswered { why } => {
                say(&format!(
                    "the lease was had after a wait, but its first renewal was not answered ({why}); the command did not run"
                ));
                release(held).await;
                return EXIT_UNAVAILABLE;
            }
        }
    }
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("STATION_LEASE_ID", &id)
        .env("STATION_LEASE_FENCE", fence.to_string())
        .env(
            "STATION_LEASE_EXPIRES_MS",
            expires_in.as_millis().to_string(),
        );
    if let Target::GatewayControl { gateway } | Target::GatewayNamed { gateway, .. } = &target {
        command.env("STATION_GATEWAY_URL", gateway);
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            say(&format!("cannot run {}: {error}", shown(&args.command[0])));
            release(held).await;
            return if error.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_RUN
            };
        }
    };
    let holding = Holding::new(
        ttl,
        expires_in,
        asked_at,
        Duration::from_millis(args.grace_ms),
    );
    let run = Run {
        held,
        ttl,
        on_lost: args.on_lost,
    };
    run.supervise(child, holding, &mut interrupts, &mut terminations)
        .await
}

struct Run {
    held: HeldLease,
    ttl: Duration,
    on_lost: Signal,
}

impl Run {
    async fn supervise(
        self,
        mut child: Child,
        mut holding: Holding,
        interrupts: &mut tokio::signal::unix::Signal,
        terminations: &mut tokio::signal::unix::Signal,
    ) -> u8 {
        let pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw);
        let renewal_timeout = renewal_interval(self.ttl);
        let mut renewal: Option<Pin<Box<dyn Future<Output = _> + '_>>> = None;
        let end = loop {
            let wake = holding.next_wake();
            let actions = tokio::select! {
                status = child.wait() => match status {
                    Ok(status) => break child_end(status),
                    Err(error) => {
                        say(&format!("lost track of the command: {error}"));
                        break ChildEnd::Exited(i32::from(EXIT_UNAVAILABLE));
                    }
                },
                answer = async { renewal.as_mut().expect("guarded by is_some").await }, if renewal.is_some() => {
                    renewal = None;
                    holding.on_renewal(answer, Instant::now())
                }
                () = async { sleep_until(wake.expect("guarded by is_some")).await }, if wake.is_some() => {
                    holding.on_time(Instant::now())
                }
                _ = interrupts.recv() => {
                    if !typed_at_the_terminal() {
                        forward(pid, Signal::SIGINT);
                    }
                    Vec::new()
                }
                _ = terminations.recv() => {
                    forward(pid, Signal::SIGTERM);
                    Vec::new()
                }
            };
            for action in actions {
                match action {
                    Action::Renew => {
                        renewal = Some(Box::pin(self.held.renew(self.ttl, renewal_timeout)));
                    }
                    Action::SignalLost { why } => {
                        say(&format!(
                            "the lease is lost ({why}); sending the command {}",
                            self.on_lost
                        ));
                        forward(pid, self.on_lost);
                    }
                    Action::Kill => {
                        say(
                            "the command did not end within --grace-ms after the lease was lost; killing it (SIGKILL)",
                        );
                        forward(pid, Signal::SIGKILL);
                    }
                    Action::Warn(text) => say(&text),
                }
            }
        };
        drop(renewal);
        let ending = holding.end(end);
        if let Some(message) = &ending.message {
            say(message);
        }
        if ending.release {
            release(self.held).await;
        }
        ending.status
    }
}

fn child_end(status: ExitStatus) -> ChildEnd {
    match (status.code(), status.signal()) {
        (Some(code), _) => ChildEnd::Exited(code),
        (None, Some(signal)) => ChildEnd::Signalled(signal),
        (None, None) => ChildEnd::Exited(i32::from(EXIT_UNAVAILABLE)),
    }
}

/// Whether a SIGINT most likely is a Ctrl-C typed at the terminal: `station-lease` is in the
/// terminal's foreground process group, and so is the command, which the terminal has sent it
/// to already (a second one would interrupt its own clean-up). A SIGINT sent by `kill`, a CI
/// runner or a supervisor, or with no terminal, is forwarded.
fn typed_at_the_terminal() -> bool {
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    tcgetpgrp(stdin.as_fd()).is_ok_and(|foreground| foreground == getpgrp())
}

/// Sends `signal` to the command (still running: it has not been waited for).
fn forward(pid: Option<Pid>, signal: Signal) {
    if let Some(pid) = pid
        && let Err(error) = kill(pid, signal)
    {
        say(&format!("could not send the command {signal}: {error}"));
    }
}

async fn release(held: HeldLease) {
    match tokio::time::timeout(RELEASE_TIMEOUT, held.release()).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => say("the lease had already ended when the command was done"),
        Ok(Err(why)) => say(&format!(
            "could not release the lease ({why}); it runs out by itself"
        )),
        Err(_) => say(&format!(
            "the release was not answered within {} s; the lease runs out by itself",
            RELEASE_TIMEOUT.as_secs()
        )),
    }
}

fn shown(program: &OsString) -> String {
    format!("{:?}", program.to_string_lossy())
}
