//! The shell of `station-lease hold`: acquires, runs the command in a process group of its
//! own (`group.rs`) with the lease in its environment, renews on the schedule `holding.rs`
//! decides, signals the command's group as it says, passes SIGINT, SIGTERM, SIGHUP, SIGQUIT
//! and SIGTSTP on to the group, and releases the lease once the command and its group have
//! ended.

use std::future::Future;
use std::pin::Pin;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::cli::{HoldArgs, Target};
use crate::group::{self, CommandEvent, Group, shown};
use crate::holding::{
    Action, ChildEnd, EXIT_CANNOT_RUN, EXIT_NOT_FOUND, EXIT_NOT_HAD, EXIT_UNAVAILABLE, Holding,
    KILLED_WAIT, RenewalAnswer, needs_confirming, renewal_interval,
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
    // Listening before the command starts: none of its ends or stops is missed.
    let signals = match Signals::listen(interrupts, terminations) {
        Ok(signals) => signals,
        Err(error) => {
            say(&format!(
                "cannot listen for signals: {error}; the command did not run"
            ));
            release(held).await;
            return EXIT_UNAVAILABLE;
        }
    };
    group::become_subreaper();
    let group = match Group::spawn(command) {
        Ok(group) => group,
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
    run.supervise(group, holding, signals).await
}

/// The signals `station-lease` listens for while the command runs.
struct Signals {
    interrupts: UnixSignal,
    terminations: UnixSignal,
    hangups: UnixSignal,
    quits: UnixSignal,
    stops: UnixSignal,
    children: UnixSignal,
}

impl Signals {
    fn listen(interrupts: UnixSignal, terminations: UnixSignal) -> std::io::Result<Signals> {
        Ok(Signals {
            interrupts,
            terminations,
            hangups: signal(SignalKind::hangup())?,
            quits: signal(SignalKind::quit())?,
            stops: signal(SignalKind::from_raw(Signal::SIGTSTP as i32))?,
            children: signal(SignalKind::child())?,
        })
    }
}

/// How often the process group is looked at once the command has ended and the rest of its
/// group is still ending (processes that are not `station-lease`'s children end unannounced).
const LEFTOVERS_POLL: Duration = Duration::from_millis(10);

struct Run {
    held: HeldLease,
    ttl: Duration,
    on_lost: Signal,
}

impl Run {
    async fn supervise(self, group: Group, mut holding: Holding, mut signals: Signals) -> u8 {
        let renewal_timeout = renewal_interval(self.ttl);
        let mut renewal: Option<Pin<Box<dyn Future<Output = _> + '_>>> = None;
        let mut command_end: Option<ChildEnd> = None;
        let end = loop {
            if let Some(end) = command_end {
                if group.is_empty() {
                    break end;
                }
                if holding.gives_up_on_the_group(Instant::now()) {
                    say(&format!(
                        "processes of the command's group still had not ended {} ms after SIGKILL; no longer waiting for them",
                        KILLED_WAIT.as_millis()
                    ));
                    break end;
                }
            }
            let wake = holding.next_wake();
            let mut actions = Vec::new();
            let mut reap = false;
            tokio::select! {
                _ = signals.children.recv() => reap = true,
                () = tokio::time::sleep(LEFTOVERS_POLL), if command_end.is_some() => reap = true,
                answer = async { renewal.as_mut().expect("guarded by is_some").await }, if renewal.is_some() => {
                    renewal = None;
                    actions = holding.on_renewal(answer, Instant::now());
                }
                () = async { sleep_until(wake.expect("guarded by is_some")).await }, if wake.is_some() => {
                    actions = holding.on_time(Instant::now());
                }
                // A Ctrl-C typed at the terminal reaches the command's group straight from the
                // terminal when station-lease gave it the terminal; any SIGINT that comes
                // here was sent to station-lease (by kill, a CI runner, or the terminal when
                // its stdin is not the terminal) and is passed on.
                _ = signals.interrupts.recv() => forward(&group, Signal::SIGINT),
                _ = signals.terminations.recv() => forward(&group, Signal::SIGTERM),
                _ = signals.hangups.recv() => forward(&group, Signal::SIGHUP),
                _ = signals.quits.recv() => forward(&group, Signal::SIGQUIT),
                _ = signals.stops.recv() => {
                    if command_end.is_none() {
                        group.suspend(true);
                    }
                }
            }
            if reap {
                for event in group.reap() {
                    match event {
                        CommandEvent::Ended(end) => {
                            command_end = Some(end);
                            group.take_terminal_back();
                            actions.extend(holding.on_command_ended(Instant::now()));
                        }
                        CommandEvent::Stopped if command_end.is_none() => group.suspend(false),
                        CommandEvent::Stopped => {}
                    }
                }
            }
            for action in actions {
                match action {
                    Action::Renew => {
                        renewal = Some(Box::pin(self.held.renew(self.ttl, renewal_timeout)));
                    }
                    Action::SignalLost { why } => {
                        say(&format!(
                            "the lease is lost ({why}); sending the command's process group {}",
                            self.on_lost
                        ));
                        forward(&group, self.on_lost);
                    }
                    Action::EndLeftovers => {
                        if group.signal(Signal::SIGTERM) {
                            let end = command_end.expect("ends first").describe();
                            say(&format!(
                                "the command {end} and left processes of its group running; sending them SIGTERM (SIGKILL after --grace-ms) before the lease is released"
                            ));
                        }
                    }
                    Action::Kill => {
                        let running = group.signal(Signal::SIGKILL);
                        if command_end.is_none() {
                            say(
                                "the command did not end within --grace-ms after the lease was lost; killing it (SIGKILL), with its process group",
                            );
                        } else if running {
                            let after = if holding.lost().is_some() {
                                "the lease was lost"
                            } else {
                                "the command ended"
                            };
                            say(&format!(
                                "processes of the command's group still ran --grace-ms after {after}; killing them (SIGKILL)"
                            ));
                        }
                    }
                    Action::Warn(text) => say(&text),
                }
            }
        };
        group.take_terminal_back();
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

/// Passes a signal `station-lease` got on to the command's process group.
fn forward(group: &Group, signal: Signal) {
    group.signal(signal);
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
