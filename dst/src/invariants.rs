//! The lease's promises, checked against the simulated station's own write log (the ground
//! truth: what the "hardware" applied, when, through which gateway's connection) and what the
//! clients were told:
//!
//! 1. a write lands inside a lease only if it was admitted under that lease;
//! 2. a lease that ends unreleased leaves the safe state at the station before the next
//!    holder's tenure, and no late change of it lands after that safe state;
//! 3. every answer tells the truth: a write answered done was applied, one refused never
//!    lands, a safe stop answered done left the safe state at the station;
//! 4. at most one gateway's writes land at the station at a time: no write of an older
//!    link-owner epoch after the first write of a newer one;
//! 5. every client's write applied at the station is in a gateway's audit trail with its
//!    lease's fence;
//! 6. (checked by the world) once the faults heal, a waiting acquirer is served in a bounded
//!    time, and no request is left unanswered.
//!
//! A lease's tenure, as the checks see it, runs from the moment its client was told it holds
//! it to the earliest it can have ended: the last confirmed acquisition or renewal's sending
//! plus its TTL, or the moment its end was asked for (release, break, safe stop).

use station_core::audit::AuditLog;
use station_protocol::Value;
use station_simulator::WriteRecord;
use tokio::time::Instant;

use crate::assembly::{SAFE_VALUE, SETPOINT};
use crate::naming::OTHER_LEASE_FENCES;
use crate::store::OwnerEpoch;

/// A client's write, as the client knows it.
#[derive(Debug, Clone)]
pub struct WriteIntent {
    pub value: f64,
    pub client: usize,
    /// The fence of the lease it was sent under.
    pub fence: Option<u64>,
    pub gateway: usize,
    pub sent: Instant,
    pub answer: WriteAnswer,
}

/// What a client was told of its write.
#[derive(Debug, Clone)]
pub enum WriteAnswer {
    Pending,
    /// Done, answered then.
    Applied(Instant),
    /// Refused: it must never land.
    Refused(String),
    /// May or may not have been applied.
    Unknown(String),
    /// The client hung up, or the gateway's process went away, before the answer.
    HungUp,
}

impl WriteAnswer {
    pub fn word(&self) -> String {
        match self {
            WriteAnswer::Pending => "pending".into(),
            WriteAnswer::Applied(_) => "applied".into(),
            WriteAnswer::Refused(why) => format!("refused ({})", clip(why)),
            WriteAnswer::Unknown(why) => format!("unknown ({})", clip(why)),
            WriteAnswer::HungUp => "hung up".into(),
        }
    }
}

fn clip(text: &str) -> &str {
    match text.char_indices().nth(80) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// A lease as its holder knows it.
#[derive(Debug, Clone)]
pub struct Tenure {
    pub client: usize,
    pub fence: u64,
    /// When the client was told it holds it.
    pub start: Instant,
    /// The last confirmed acquisition or renewal's sending, plus its TTL.
    pub ends_by: Instant,
    /// When its end was asked for.
    pub ended_at: Option<Instant>,
    pub released: bool,
    /// It ran out or was safe-stopped: the safe state is owed.
    pub unreleased_end: bool,
}

impl Tenure {
    /// Its end was asked for at `at` (the first ask counts).
    pub fn end_asked(&mut self, at: Instant) {
        self.ended_at = Some(self.ended_at.map_or(at, |before| before.min(at)));
    }

    /// It ran out (or its holder learnt it had): the safe state is owed, unless a press had
    /// ended it before.
    pub fn ran_out(&mut self) {
        if self.ended_at.is_none() {
            self.unreleased_end = true;
        }
    }

    pub fn end(&self) -> Instant {
        match self.ended_at {
            Some(at) => at.min(self.ends_by),
            None => self.ends_by,
        }
    }
}

/// A safe stop answered done (confirmed, or already safe).
#[derive(Debug, Clone)]
pub struct SafeStopRecord {
    pub gateway: usize,
    pub sent: Instant,
    pub answered: Instant,
}

/// Everything the clients did and were told.
#[derive(Default)]
pub struct Records {
    pub writes: Vec<WriteIntent>,
    pub tenures: Vec<Tenure>,
    pub safe_stops: Vec<SafeStopRecord>,
    /// When an admin break was sent: a lease ended by one owes no safe state, and its answer
    /// (naming only the owner) may be lost.
    pub breaks: Vec<Instant>,
    /// The last value written: each write's value is its own (1, 2, 3...), never the safe one.
    pub next_value: f64,
}

impl Records {
    pub fn add_write(&mut self, intent: WriteIntent) -> usize {
        self.writes.push(intent);
        self.writes.len() - 1
    }

    pub fn add_tenure(&mut self, tenure: Tenure) -> usize {
        self.tenures.push(tenure);
        self.tenures.len() - 1
    }

    /// A break or a safe stop sent at `sent` ended the lease `which` picks (the latest such):
    /// from `sent`, or from its start when it began after the press was sent.
    pub fn ended_by_press(
        &mut self,
        sent: Instant,
        owes_safe_state: bool,
        which: impl Fn(&Tenure) -> bool,
    ) {
        if let Some(tenure) = self.tenures.iter_mut().rev().find(|t| which(t)) {
            tenure.end_asked(sent.max(tenure.start));
            tenure.unreleased_end = owes_safe_state;
        }
    }

    /// A break or a safe stop is sent at `sent`: whatever lease is held then may end from
    /// now, whether or not its answer ever comes back.
    pub fn press_sent(&mut self, sent: Instant) {
        for tenure in &mut self.tenures {
            if tenure.start <= sent && sent < tenure.end() {
                tenure.end_asked(sent);
            }
        }
    }

    fn intent_of(&self, value: f64) -> Option<&WriteIntent> {
        let index = (value as usize).checked_sub(1)?;
        self.writes.get(index).filter(|w| w.value == value)
    }
}

/// One look at the log.
pub struct Checker<'a> {
    pub log: &'a [WriteRecord],
    pub records: &'a Records,
    pub epochs: Vec<OwnerEpoch>,
    pub start: Instant,
    pub now: Instant,
    /// The last look: also the audit trails (invariant 5).
    pub last: bool,
    /// Every gateway process's audit trail, with its gateway's index.
    pub audits: &'a [(usize, AuditLog)],
}

fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Float(v) => Some(*v),
        Value::Integer(v) => Some(*v as f64),
        _ => None,
    }
}

impl Checker<'_> {
    fn ms(&self, at: Instant) -> String {
        let since = at.saturating_duration_since(self.start);
        format!("{}.{:03} s", since.as_secs(), since.subsec_millis())
    }

    /// The setpoint's writes: (time, value, gateway index).
    fn setpoint_writes(&self) -> Vec<(Instant, f64, usize)> {
        self.log
            .iter()
            .filter(|record| record.channel == SETPOINT)
            .filter_map(|record| {
                let value = number(&record.value)?;
                let gateway = record.peer.strip_prefix("gw")?.parse().ok()?;
                Some((record.at, value, gateway))
            })
            .collect()
    }

    pub fn check(&self) -> Result<(), String> {
        let writes = self.setpoint_writes();
        self.inside_leases(&writes)?;
        self.answers(&writes)?;
        self.safe_state_between_leases(&writes)?;
        self.one_gateway_at_a_time(&writes)?;
        if self.last {
            self.audited(&writes)?;
        }
        Ok(())
    }

    /// Invariant 1, and 3's "a change refused never lands".
    fn inside_leases(&self, writes: &[(Instant, f64, usize)]) -> Result<(), String> {
        for &(at, value, gateway) in writes {
            if value == SAFE_VALUE {
                continue;
            }
            let Some(intent) = self.records.intent_of(value) else {
                return Err(format!(
                    "invariant 1: write {value} landed at {} through gw{gateway}, and no client sent it",
                    self.ms(at)
                ));
            };
            if let WriteAnswer::Refused(why) = &intent.answer {
                return Err(format!(
                    "invariant 3: write {value} (client{}) was answered refused ({}), yet landed at {}",
                    intent.client,
                    clip(why),
                    self.ms(at)
                ));
            }
            for tenure in &self.records.tenures {
                if tenure.start < at && at < tenure.end() && intent.fence != Some(tenure.fence) {
                    return Err(format!(
                        "invariant 1: write {value} (client{}, {}) landed at {} inside client{}'s lease (fence {}, held {} to {})",
                        intent.client,
                        match intent.fence {
                            Some(fence) => format!("admitted under fence {fence}"),
                            None => "admitted without a lease".into(),
                        },
                        self.ms(at),
                        tenure.client,
                        tenure.fence,
                        self.ms(tenure.start),
                        self.ms(tenure.end())
                    ));
                }
            }
        }
        Ok(())
    }

    /// Invariant 3: a write answered done was applied before its answer; a safe stop answered
    /// done left the safe state.
    fn answers(&self, writes: &[(Instant, f64, usize)]) -> Result<(), String> {
        for intent in &self.records.writes {
            if let WriteAnswer::Applied(answered) = intent.answer
                && !writes
                    .iter()
                    .any(|&(at, value, _)| value == intent.value && at <= answered)
            {
                return Err(format!(
                    "invariant 3: write {} (client{}) was answered done at {}, and the station never applied it",
                    intent.value,
                    intent.client,
                    self.ms(answered)
                ));
            }
        }
        // The safe state was at the station at some instant between the press and its answer (a
        // change admitted after it was read back may follow it: nobody held the lease).
        for stop in &self.records.safe_stops {
            let value_at_press = writes
                .iter()
                .rev()
                .find(|&&(at, _, _)| at <= stop.sent)
                .map_or(SAFE_VALUE, |&(_, value, _)| value);
            let written = writes.iter().any(|&(at, value, _)| {
                value == SAFE_VALUE && stop.sent <= at && at <= stop.answered
            });
            if value_at_press != SAFE_VALUE && !written {
                return Err(format!(
                    "invariant 3: a safe stop sent at {} to gw{} was answered done at {}, and the station's setpoint stayed {value_at_press}",
                    self.ms(stop.sent),
                    stop.gateway,
                    self.ms(stop.answered)
                ));
            }
        }
        Ok(())
    }

    /// Invariant 2.
    fn safe_state_between_leases(&self, writes: &[(Instant, f64, usize)]) -> Result<(), String> {
        let safe: Vec<Instant> = writes
            .iter()
            .filter(|w| w.1 == SAFE_VALUE)
            .map(|w| w.0)
            .collect();
        for tenure in self.records.tenures.iter().filter(|t| t.unreleased_end) {
            let end = tenure.end();
            if end > self.now {
                continue;
            }
            let next = self
                .records
                .tenures
                .iter()
                .filter(|t| t.start > end)
                .min_by_key(|t| t.start);
            // The safe state after its last change that landed (its end may have come earlier
            // than its holder learnt: a press whose answer was lost).
            let last_change = writes
                .iter()
                .filter(|&&(_, value, _)| {
                    value != SAFE_VALUE
                        && self
                            .records
                            .intent_of(value)
                            .is_some_and(|w| w.fence == Some(tenure.fence))
                })
                .map(|&(at, _, _)| at)
                .max()
                .unwrap_or(tenure.start)
                .max(tenure.start);
            // A break sent meanwhile may have ended it (no safe state is owed after a break).
            let broken = next.is_some_and(|next| {
                self.records
                    .breaks
                    .iter()
                    .any(|&at| tenure.start <= at && at <= next.start)
            });
            if let Some(next) = next
                && !broken
                && !safe.iter().any(|&at| last_change <= at && at <= next.start)
            {
                return Err(format!(
                    "invariant 2: client{}'s lease (fence {}) ended unreleased at {}, and client{}'s lease (fence {}) began at {} with no safe state written between",
                    tenure.client,
                    tenure.fence,
                    self.ms(end),
                    next.client,
                    next.fence,
                    self.ms(next.start)
                ));
            }
            // No late change of it after the safe state that followed its end.
            if let Some(&first_safe) = safe.iter().find(|&&at| at >= end) {
                for &(at, value, _) in writes {
                    if at > first_safe
                        && value != SAFE_VALUE
                        && self
                            .records
                            .intent_of(value)
                            .is_some_and(|w| w.fence == Some(tenure.fence))
                    {
                        return Err(format!(
                            "invariant 2: write {value} of client{}'s lease (fence {}) landed at {}, after the safe state written at {} once that lease had ended",
                            tenure.client,
                            tenure.fence,
                            self.ms(at),
                            self.ms(first_safe)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Invariant 4: each write belongs to its gateway's latest link-owner epoch; none of an
    /// older epoch lands after a write of a newer one.
    fn one_gateway_at_a_time(&self, writes: &[(Instant, f64, usize)]) -> Result<(), String> {
        let mut newest: Option<(u64, usize, Instant)> = None;
        for &(at, value, gateway) in writes {
            let Some(epoch) = self
                .epochs
                .iter()
                .filter(|e| e.gateway == gateway && e.at <= at)
                .max_by_key(|e| e.fence)
            else {
                return Err(format!(
                    "invariant 4: write {value} landed at {} through gw{gateway}, which never held the link-owner lease",
                    self.ms(at)
                ));
            };
            if let Some((fence, other, since)) = newest
                && other != gateway
                && fence > epoch.fence
            {
                return Err(format!(
                    "invariant 4: write {value} of gw{gateway} (link-owner fence {}) landed at {}, after gw{other}'s writes (fence {fence}) began at {}",
                    epoch.fence,
                    self.ms(at),
                    self.ms(since)
                ));
            }
            if newest.is_none_or(|(fence, _, _)| epoch.fence > fence) {
                newest = Some((epoch.fence, gateway, at));
            }
        }
        Ok(())
    }

    /// Invariant 5.
    fn audited(&self, writes: &[(Instant, f64, usize)]) -> Result<(), String> {
        let lines: Vec<(usize, String)> = self
            .audits
            .iter()
            .flat_map(|(gateway, audit)| {
                let lines = audit.tail(0).unwrap_or_default();
                lines.into_iter().map(move |line| (*gateway, line))
            })
            .collect();
        for &(at, value, _) in writes {
            if value == SAFE_VALUE {
                continue;
            }
            let Some(intent) = self.records.intent_of(value) else {
                continue;
            };
            let asked = format!("asked=VSET1={value}");
            // The audit trail of the gateway it was sent to says the fence of that gateway's
            // control lease (the records add OTHER_LEASE_FENCES for a lease named otherwise).
            let fence = match intent.fence {
                Some(fence) => format!(" fence={} ", fence % OTHER_LEASE_FENCES),
                None => " fence=- ".into(),
            };
            if !lines.iter().any(|(gateway, line)| {
                *gateway == intent.gateway
                    && (line.ends_with(&asked) || line.contains(&format!("{asked} ")))
                    && line.contains(&fence)
            }) {
                return Err(format!(
                    "invariant 5: write {value} (client{}) landed at {}, and no audit line records it with{}",
                    intent.client,
                    self.ms(at),
                    fence.trim_end()
                ));
            }
        }
        Ok(())
    }
}
