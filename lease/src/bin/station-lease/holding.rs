//! The decisions of `station-lease hold` while the command runs, pure (every time is passed
//! in): when to renew, what a renewal's answer means for the command, when the grace after
//! `--on-lost` has run out, and the exit status. The shell (`supervise.rs`) carries out the
//! [`Action`]s and owns the child, the signals and the clock.

use std::time::Duration;

use tokio::time::Instant;

/// The exit status when the arguments are wrong (sysexits `EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;
/// The exit status when the gateway or backend could not be asked (`EX_UNAVAILABLE`).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// The exit status when the lease was lost while the command ran (`EX_SOFTWARE`).
pub const EXIT_LOST: u8 = 70;
/// The exit status when the lease was not had within `--wait-ms` (`EX_TEMPFAIL`).
pub const EXIT_NOT_HAD: u8 = 75;
/// The exit status when the gateway refused the credentials (`EX_NOPERM`).
pub const EXIT_DENIED: u8 = 77;
/// The exit status when the command could not be run (as a shell: found but not runnable).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// The exit status when the command was not found (as a shell).
pub const EXIT_NOT_FOUND: u8 = 127;

/// What one renewal was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewalAnswer {
    /// Renewed: it lasts `expires_in` from the moment the renewal was asked.
    Renewed {
        /// Time left as of the answer.
        expires_in: Duration,
    },
    /// The lease is gone (ended, broken by an admin, safe-stopped, or the renewal refused), as
    /// the server said in `why`.
    Gone {
        /// The server's words.
        why: String,
    },
    /// No answer that says either (unreachable, timed out, the store unavailable): asked again
    /// while the lease still lasts.
    Unanswered {
        /// What went wrong.
        why: String,
    },
}

/// What the shell must do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask for a renewal (the answer comes back through [`Holding::on_renewal`]).
    Renew,
    /// The lease is lost: send the command the `--on-lost` signal, saying why.
    SignalLost {
        /// Why it is lost.
        why: String,
    },
    /// The command has exited and processes of its group still run: send them SIGTERM (their
    /// SIGKILL comes `--grace-ms` later, as [`Action::Kill`]).
    EndLeftovers,
    /// The grace after the `--on-lost` signal, or after [`Action::EndLeftovers`], ran out:
    /// SIGKILL the command's process group.
    Kill,
    /// Only tell the user.
    Warn(String),
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it.
    Signalled(i32),
}

impl ChildEnd {
    /// Its status as a shell reports it: the exit status, or 128 + the signal.
    pub fn status(self) -> u8 {
        match self {
            ChildEnd::Exited(code) => (code & 0xff) as u8,
            ChildEnd::Signalled(signal) => 128u8.wrapping_add((signal & 0x7f) as u8),
        }
    }

    /// How it ended, in words.
    pub fn describe(self) -> String {
        match self {
            ChildEnd::Exited(code) => format!("exited with status {code}"),
            ChildEnd::Signalled(signal) => format!("was ended by signal {signal}"),
        }
    }
}

/// What to do once the command has ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// Whether the lease is still ours to release.
    pub release: bool,
    /// The exit status of `station-lease`.
    pub status: u8,
    /// What to tell the user, if anything.
    pub message: Option<String>,
}

/// A lease held while the command runs.
#[derive(Debug)]
pub struct Holding {
    /// Renew this often (a third of the TTL).
    interval: Duration,
    /// The grace between the `--on-lost` signal and SIGKILL.
    grace: Duration,
    /// The lease lasts at least until then: the last confirmed answer's time left, counted
    /// from when it was asked (so never later than the server's own deadline).
    confirmed_until: Instant,
    /// When to renew next; `None` while a renewal is asked or once the lease is lost.
    next_renewal: Option<Instant>,
    /// When the renewal in flight was asked.
    asked_at: Option<Instant>,
    /// Why the lease was lost, once it was.
    lost: Option<String>,
    /// When to SIGKILL the command's process group (after the `--on-lost` signal, or after
    /// the command exited leaving processes of its group); `None` until then and once done.
    kill_at: Option<Instant>,
    /// When the process group was SIGKILLed.
    killed_at: Option<Instant>,
    /// Whether the command itself has ended (its group may still have processes).
    command_ended: bool,
}

/// How long after SIGKILL the process group may take to be gone before `station-lease` stops
/// waiting for it (a process in uninterruptible sleep ends only when its system call does, and
/// does nothing more meanwhile).
pub const KILLED_WAIT: Duration = Duration::from_secs(2);

impl Holding {
    /// Just acquired (asked at `asked_at`) for `ttl`, with `expires_in` left as of the answer.
    pub fn new(ttl: Duration, expires_in: Duration, asked_at: Instant, grace: Duration) -> Holding {
        let interval = renewal_interval(ttl);
        Holding {
            interval,
            grace,
            confirmed_until: asked_at + expires_in,
            next_renewal: Some(asked_at + interval),
            asked_at: None,
            lost: None,
            kill_at: None,
            killed_at: None,
            command_ended: false,
        }
    }

    /// Why the lease was lost, once it was.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// The next moment [`Holding::on_time`] has something to do (`None`: nothing until an
    /// answer comes or the command ends).
    pub fn next_wake(&self) -> Option<Instant> {
        if self.lost.is_some() {
            return self.kill_at;
        }
        [self.next_renewal, Some(self.confirmed_until), self.kill_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// The clock reached `now`.
    pub fn on_time(&mut self, now: Instant) -> Vec<Action> {
        if self.kill_at.is_some_and(|at| now >= at) {
            self.kill_at = None;
            self.killed_at = Some(now);
            return vec![Action::Kill];
        }
        if self.lost.is_some() {
            return Vec::new();
        }
        if now >= self.confirmed_until {
            let why = match self.asked_at {
                Some(_) => "it ran out while a renewal was still unanswered",
                None => "it ran out before a renewal was confirmed",
            };
            return self.lose(why.to_owned(), now);
        }
        match self.next_renewal {
            Some(at) if now >= at => {
                self.next_renewal = None;
                self.asked_at = Some(now);
                vec![Action::Renew]
            }
            _ => Vec::new(),
        }
    }

    /// The renewal asked for by the last [`Action::Renew`] was answered at `now`.
    pub fn on_renewal(&mut self, answer: RenewalAnswer, now: Instant) -> Vec<Action> {
        let asked_at = self.asked_at.take().unwrap_or(now);
        if self.lost.is_some() {
            return Vec::new();
        }
        match answer {
            RenewalAnswer::Renewed { expires_in } => {
                self.confirmed_until = self.confirmed_until.max(asked_at + expires_in);
                self.next_renewal = Some((asked_at + self.interval).max(now));
                Vec::new()
            }
            RenewalAnswer::Gone { why } => self.lose(why, now),
            RenewalAnswer::Unanswered { why } => {
                if now >= self.confirmed_until {
                    return self.lose(format!("it ran out while renewals failed ({why})"), now);
                }
                let left = self.confirmed_until - now;
                let retry = (self.interval / 4).max(Duration::from_millis(50));
                self.next_renewal = Some((now + retry).min(self.confirmed_until));
                vec![Action::Warn(format!(
                    "renewal failed ({why}); trying again in {} ms, the lease lasts another {} ms",
                    retry.min(left).as_millis(),
                    left.as_millis()
                ))]
            }
        }
    }

    fn lose(&mut self, why: String, now: Instant) -> Vec<Action> {
        self.lost = Some(why.clone());
        self.next_renewal = None;
        if self.killed_at.is_none() {
            let at = now + self.grace;
            self.kill_at = Some(self.kill_at.map_or(at, |earlier| earlier.min(at)));
        }
        vec![Action::SignalLost { why }]
    }

    /// The command itself ended at `now`. Processes it started in its group may still run
    /// (a background job): they must not go on working on the station once the lease is
    /// released or lost, so they get SIGTERM now and SIGKILL `--grace-ms` later, and the lease
    /// is renewed meanwhile. After a loss they already got the `--on-lost` signal, and the
    /// SIGKILL it set stands.
    pub fn on_command_ended(&mut self, now: Instant) -> Vec<Action> {
        if self.command_ended {
            return Vec::new();
        }
        self.command_ended = true;
        if self.lost.is_some() {
            return Vec::new();
        }
        self.kill_at = Some(now + self.grace);
        vec![Action::EndLeftovers]
    }

    /// Whether the command has ended (the rest of its group may still be ending).
    #[cfg(test)]
    pub fn command_ended(&self) -> bool {
        self.command_ended
    }

    /// Whether to stop waiting for the process group at `now`: it was SIGKILLed at least
    /// [`KILLED_WAIT`] ago.
    pub fn gives_up_on_the_group(&self, now: Instant) -> bool {
        self.killed_at
            .is_some_and(|killed| now >= killed + KILLED_WAIT)
    }

    /// The command ended: release or not, and with which status `station-lease` exits.
    pub fn end(&self, child: ChildEnd) -> Ending {
        match &self.lost {
            Some(why) => Ending {
                release: false,
                status: EXIT_LOST,
                message: Some(format!(
                    "the lease was lost while the command ran ({why}); the command {}",
                    child.describe()
                )),
            },
            None => Ending {
                release: true,
                status: child.status(),
                message: None,
            },
        }
    }
}

/// A third of the TTL, never less than 10 ms.
pub fn renewal_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(10))
}

/// Whether a lease just had must be renewed before the command runs. Its time left counts
/// from no earlier than when the acquisition was asked, since the grant came at some moment
/// before the answer; an acquisition that waited (in the gateway's queue, or through its
/// lock-delay) may have been asked longer ago than the lease lasts. A renewal's time left
/// counts from when the renewal was asked: a bound worth having.
pub fn needs_confirming(ttl: Duration, asked_at: Instant, answered_at: Instant) -> bool {
    answered_at.saturating_duration_since(asked_at) > renewal_interval(ttl) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_millis(3000);
    const GRACE: Duration = Duration::from_millis(500);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn held(start: Instant) -> Holding {
        Holding::new(TTL, TTL, start, GRACE)
    }

    #[test]
    fn a_lease_had_after_a_wait_is_confirmed_by_a_renewal_first() {
        let ttl = Duration::from_millis(3000);
        let asked = Instant::now();
        // The renewal interval is 1 s: an answer within half of it is fresh enough.
        assert!(!needs_confirming(ttl, asked, asked));
        assert!(!needs_confirming(
            ttl,
            asked,
            asked + Duration::from_millis(500)
        ));
        assert!(needs_confirming(
            ttl,
            asked,
            asked + Duration::from_millis(501)
        ));
        assert!(needs_confirming(ttl, asked, asked + Duration::from_secs(9)));
    }

    #[test]
    fn it_renews_every_third_of_the_ttl_and_carries_on_while_renewed() {
        let start = Instant::now();
        let mut holding = held(start);
        assert_eq!(holding.next_wake(), Some(start + ms(1000)));
        assert!(holding.on_time(start + ms(999)).is_empty());
        assert_eq!(holding.on_time(start + ms(1000)), vec![Action::Renew]);
        // Asked: no second renewal while it is in flight; the expiry is the only wake.
        assert_eq!(holding.next_wake(), Some(start + TTL));
        assert!(holding.on_time(start + ms(1500)).is_empty());
        let answer = RenewalAnswer::Renewed { expires_in: TTL };
        assert!(holding.on_renewal(answer, start + ms(1010)).is_empty());
        assert_eq!(holding.next_wake(), Some(start + ms(2000)));
        assert_eq!(holding.on_time(start + ms(2000)), vec![Action::Renew]);
        let ending = holding.end(ChildEnd::Exited(3));
        assert_eq!(
            ending,
            Ending {
                release: true,
                status: 3,
                message: None
            }
        );
    }

    #[test]
    fn a_renewal_saying_gone_signals_the_command_then_kills_it_after_the_grace() {
        let start = Instant::now();
        let mut holding = held(start);
        holding.on_time(start + ms(1000));
        let gone = RenewalAnswer::Gone {
            why: "broken by an admin".into(),
        };
        assert_eq!(
            holding.on_renewal(gone, start + ms(1005)),
            vec![Action::SignalLost {
                why: "broken by an admin".into()
            }]
        );
        assert_eq!(holding.lost(), Some("broken by an admin"));
        // No more renewals; the next wake is the kill.
        assert_eq!(holding.next_wake(), Some(start + ms(1505)));
        assert!(holding.on_time(start + ms(1504)).is_empty());
        assert_eq!(holding.on_time(start + ms(1505)), vec![Action::Kill]);
        assert_eq!(holding.next_wake(), None);
        assert!(holding.on_time(start + ms(9000)).is_empty());
        let ending = holding.end(ChildEnd::Signalled(15));
        assert!(!ending.release);
        assert_eq!(ending.status, EXIT_LOST);
        assert!(ending.message.unwrap().contains("broken by an admin"));
    }

    #[test]
    fn a_lost_lease_exits_70_even_when_the_command_exits_zero() {
        let start = Instant::now();
        let mut holding = held(start);
        holding.on_time(start + ms(1000));
        holding.on_renewal(
            RenewalAnswer::Gone {
                why: "ended".into(),
            },
            start + ms(1001),
        );
        assert_eq!(holding.end(ChildEnd::Exited(0)).status, EXIT_LOST);
    }

    #[test]
    fn unanswered_renewals_are_retried_until_the_lease_runs_out_then_it_is_lost() {
        let start = Instant::now();
        let mut holding = held(start);
        holding.on_time(start + ms(1000));
        let unanswered = || RenewalAnswer::Unanswered {
            why: "connection refused".into(),
        };
        let actions = holding.on_renewal(unanswered(), start + ms(1100));
        assert!(
            matches!(&actions[..], [Action::Warn(text)] if text.contains("connection refused"))
        );
        // Retried after a quarter of the interval.
        assert_eq!(holding.next_wake(), Some(start + ms(1350)));
        assert_eq!(holding.on_time(start + ms(1350)), vec![Action::Renew]);
        holding.on_renewal(unanswered(), start + ms(2700));
        assert_eq!(holding.on_time(start + ms(2950)), vec![Action::Renew]);
        // Still in flight when it runs out: lost at the confirmed end, not at the answer.
        assert_eq!(holding.next_wake(), Some(start + TTL));
        let actions = holding.on_time(start + TTL);
        assert!(matches!(&actions[..], [Action::SignalLost { why }] if why.contains("unanswered")));
        assert!(
            holding
                .on_renewal(unanswered(), start + ms(3200))
                .is_empty()
        );
        assert_eq!(holding.end(ChildEnd::Exited(0)).status, EXIT_LOST);
    }

    #[test]
    fn the_confirmed_end_counts_from_when_the_renewal_was_asked() {
        let start = Instant::now();
        let mut holding = held(start);
        holding.on_time(start + ms(1000));
        // A slow answer: the lease lasts TTL from the ask, not from the answer.
        holding.on_renewal(RenewalAnswer::Renewed { expires_in: TTL }, start + ms(1800));
        assert_eq!(holding.next_wake(), Some(start + ms(2000)));
        holding.on_time(start + ms(2000));
        assert_eq!(holding.next_wake(), Some(start + ms(4000)));
        assert!(matches!(
            &holding.on_time(start + ms(4000))[..],
            [Action::SignalLost { .. }]
        ));
    }

    #[test]
    fn a_command_that_exits_leaving_its_group_running_has_it_ended_while_the_lease_is_renewed() {
        let start = Instant::now();
        let mut holding = held(start);
        assert!(!holding.command_ended());
        assert_eq!(
            holding.on_command_ended(start + ms(100)),
            vec![Action::EndLeftovers]
        );
        assert!(holding.command_ended());
        // Told once.
        assert!(holding.on_command_ended(start + ms(150)).is_empty());
        // SIGKILL after the grace, the renewals going on meanwhile.
        assert_eq!(holding.next_wake(), Some(start + ms(600)));
        assert!(holding.on_time(start + ms(599)).is_empty());
        assert_eq!(holding.on_time(start + ms(600)), vec![Action::Kill]);
        assert_eq!(holding.next_wake(), Some(start + ms(1000)));
        assert_eq!(holding.on_time(start + ms(1000)), vec![Action::Renew]);
        assert!(!holding.gives_up_on_the_group(start + ms(600) + KILLED_WAIT - ms(1)));
        assert!(holding.gives_up_on_the_group(start + ms(600) + KILLED_WAIT));
        // Released, with the command's own status.
        assert_eq!(
            holding.end(ChildEnd::Exited(4)),
            Ending {
                release: true,
                status: 4,
                message: None
            }
        );
    }

    #[test]
    fn a_loss_while_the_group_ends_keeps_the_earlier_sigkill() {
        let start = Instant::now();
        let mut holding = held(start);
        holding.on_command_ended(start + ms(900));
        holding.on_time(start + ms(1000));
        let gone = RenewalAnswer::Gone {
            why: "ended".into(),
        };
        assert!(matches!(
            &holding.on_renewal(gone, start + ms(1010))[..],
            [Action::SignalLost { .. }]
        ));
        // SIGKILL stays due at 1400 (900 + the grace), not 1510.
        assert_eq!(holding.next_wake(), Some(start + ms(1400)));
        assert_eq!(holding.on_time(start + ms(1400)), vec![Action::Kill]);
        assert_eq!(holding.end(ChildEnd::Exited(0)).status, EXIT_LOST);
    }

    #[test]
    fn after_a_loss_the_end_of_the_command_sends_nothing_more_and_the_sigkill_stands() {
        let start = Instant::now();
        let mut holding = held(start);
        holding.on_time(start + ms(1000));
        holding.on_renewal(
            RenewalAnswer::Gone {
                why: "ended".into(),
            },
            start + ms(1001),
        );
        assert!(holding.on_command_ended(start + ms(1100)).is_empty());
        assert_eq!(holding.next_wake(), Some(start + ms(1501)));
        assert_eq!(holding.on_time(start + ms(1501)), vec![Action::Kill]);
    }

    #[test]
    fn exit_statuses_are_the_commands_own_or_128_plus_its_signal() {
        assert_eq!(ChildEnd::Exited(0).status(), 0);
        assert_eq!(ChildEnd::Exited(42).status(), 42);
        assert_eq!(ChildEnd::Signalled(2).status(), 130);
        assert_eq!(ChildEnd::Signalled(9).status(), 137);
        assert_eq!(renewal_interval(ms(30_000)), ms(10_000));
        assert_eq!(renewal_interval(ms(1)), ms(10));
    }
}
