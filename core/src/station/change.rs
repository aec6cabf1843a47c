//! A change to the station as a value: what ([`ChangeWhat`]: writes, a transact, steps of
//! configuration, a bus transaction, an acquisition, a reset), from whom ([`ChangeOrigin`]: the
//! front end, the caller, the lease it was admitted under, what it asked) and under which
//! admission (the send guard). [`Station::change`] runs it on a task of its own to its end —
//! the station's answer or the link's failure, its typed [`ChangeOutcome`], its audit line —
//! and the caller awaits the report with a bound: a caller that goes away changes nothing
//! about what happens to the change or to its line.
//!
//! The bound is twice the request timeout per step plus the acquisition's or UART receive's own
//! time, the read-back's wait and the audit sync; past it the caller gets 504 "still running".
//! A confirmed write is read back (`confirmed_writes`: its readable, non-consuming channels in
//! one READ, awaited at most [`READ_BACK_WAIT`]) so the cache holds the station's value, never
//! the one asked for; a failed read-back is logged, never the change's outcome. Once a change
//! took an HTTP request's origin, the request entry writes no audit line of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use station_protocol::sample::{SampleEnd, SampleRequest};
use station_protocol::{BusRequest, Configure, ConfigureReply, ItemResult, Value};
use tracing::error;

use super::access;
use super::bus::BusLanes;
use crate::access_rules::AccessRules;
use crate::audit::{AuditLog, ChangeFields, Outcome, RequestLine};
use crate::error_kind::ErrorKind;
use crate::lease::Admitted;
use crate::link::{ChannelTable, GuardRefusal, LinkError, LinkHandle};
use crate::rules::Refusal;

/// What a change asks of the station.
#[derive(Debug, Clone)]
pub enum ChangeWhat {
    /// One WRITE frame of these items.
    Write(Vec<(String, Value)>),
    /// Write and read back in one step.
    Transact { name: String, value: Value },
    /// Steps one after another, stopping at the first that fails: a `channels/configure`
    /// list, a configuration load. One change, one audit line.
    Steps(Vec<Step>),
    /// One bus transaction, after every earlier one on the same bus.
    Bus(BusRequest),
    /// A NumericResult acquisition, `expected` to take about this long.
    Sample {
        request: SampleRequest,
        expected: Duration,
    },
    /// Restart the station's application; `requester` goes to the station's log.
    Reset { requester: String },
}

impl ChangeWhat {
    /// The same change with every channel as the station names it: a client's alias or net
    /// name resolved by the channel table ([`ChannelTable::station_name`]), for every front
    /// end alike; a name no channel has stays as given (the station answers with its error).
    pub fn in_station_names(self, table: &ChannelTable) -> ChangeWhat {
        let name = |asked: String| match table.station_name(&asked) {
            station if station == asked => asked,
            station => station.to_owned(),
        };
        match self {
            ChangeWhat::Write(items) => ChangeWhat::Write(
                items
                    .into_iter()
                    .map(|(asked, value)| (name(asked), value))
                    .collect(),
            ),
            ChangeWhat::Transact { name: asked, value } => ChangeWhat::Transact {
                name: name(asked),
                value,
            },
            ChangeWhat::Steps(steps) => ChangeWhat::Steps(
                steps
                    .into_iter()
                    .map(|Step { label, action }| Step {
                        label,
                        action: match action {
                            StepAction::Configure(mut request) => {
                                request.name = name(request.name);
                                StepAction::Configure(request)
                            }
                            StepAction::Write { name: asked, value } => StepAction::Write {
                                name: name(asked),
                                value,
                            },
                        },
                    })
                    .collect(),
            ),
            ChangeWhat::Bus(mut request) => {
                request.channel = name(request.channel);
                ChangeWhat::Bus(request)
            }
            ChangeWhat::Sample {
                mut request,
                expected,
            } => {
                request.channel = name(request.channel);
                request.target = name(request.target);
                ChangeWhat::Sample { request, expected }
            }
            reset @ ChangeWhat::Reset { .. } => reset,
        }
    }
}

/// One step of a [`ChangeWhat::Steps`], with the words the audit trail and the answer use for
/// it (`configure NAME`, `write NAME = 10`).
#[derive(Debug, Clone)]
pub struct Step {
    pub label: String,
    pub action: StepAction,
}

#[derive(Debug, Clone)]
pub enum StepAction {
    Configure(Configure),
    /// One item; the station refusing it stops the steps.
    Write {
        name: String,
        value: Value,
    },
}

/// What the station answered to a change that it answered (each kind its own).
#[derive(Debug, Clone)]
pub enum ChangeAnswer {
    Written(Vec<ItemResult<()>>),
    Transacted(Value),
    Stepped(StepsDone),
    Bus(Bytes),
    Sampled { samples: Vec<f64>, end: SampleEnd },
    Reset,
}

impl ChangeAnswer {
    pub fn written(self) -> Option<Vec<ItemResult<()>>> {
        match self {
            ChangeAnswer::Written(results) => Some(results),
            _ => None,
        }
    }

    pub fn transacted(self) -> Option<Value> {
        match self {
            ChangeAnswer::Transacted(value) => Some(value),
            _ => None,
        }
    }

    pub fn stepped(self) -> Option<StepsDone> {
        match self {
            ChangeAnswer::Stepped(done) => Some(done),
            _ => None,
        }
    }

    pub fn bus(self) -> Option<Bytes> {
        match self {
            ChangeAnswer::Bus(received) => Some(received),
            _ => None,
        }
    }

    pub fn sampled(self) -> Option<(Vec<f64>, SampleEnd)> {
        match self {
            ChangeAnswer::Sampled { samples, end } => Some((samples, end)),
            _ => None,
        }
    }
}

/// How far a [`ChangeWhat::Steps`] went.
#[derive(Debug, Clone, Default)]
pub struct StepsDone {
    /// One per step carried out, in order: the CONFIGURE answer for a configure step.
    pub done: Vec<Option<ConfigureReply>>,
    /// The step that failed (its index) and why; the steps after it were not sent.
    pub stopped: Option<(usize, LinkError)>,
}

/// What became of a change, as the audit trail records it and the front ends answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// The station confirmed all of it.
    Applied,
    /// Some of it was applied and some not: the items or steps by name, and why it stopped.
    Partial {
        applied: Vec<String>,
        not_applied: Vec<String>,
        why: String,
    },
    /// Nothing of it was applied: the station or the link's guard said no, or the link was down.
    Refused { why: String },
    /// Sent, and its answer never came (or could not be read): it may or may not have been
    /// applied.
    Unknown { why: String },
}

impl ChangeOutcome {
    /// The audit trail's word for it.
    pub fn word(&self) -> Outcome {
        match self {
            ChangeOutcome::Applied => Outcome::Applied,
            ChangeOutcome::Partial { .. } => Outcome::Partial,
            ChangeOutcome::Refused { .. } => Outcome::Refused,
            ChangeOutcome::Unknown { .. } => Outcome::Unknown,
        }
    }

    /// The outcome of a change that was not carried out at all, or failed as a whole.
    fn of_error(error: &LinkError) -> ChangeOutcome {
        if error.leaves_outcome_unknown() {
            ChangeOutcome::Unknown {
                why: error.to_string(),
            }
        } else {
            ChangeOutcome::Refused {
                why: error.to_string(),
            }
        }
    }

    /// What became of `what`, given the station's answer or the link's failure.
    pub fn of(what: &ChangeWhat, answer: &Result<ChangeAnswer, LinkError>) -> ChangeOutcome {
        let answer = match answer {
            Err(error) => return ChangeOutcome::of_error(error),
            Ok(answer) => answer,
        };
        match (what, answer) {
            (ChangeWhat::Write(items), ChangeAnswer::Written(results)) => {
                let mut applied = Vec::new();
                let mut not_applied = Vec::new();
                let mut why = Vec::new();
                for ((name, _), result) in items.iter().zip(results) {
                    match result {
                        Ok(()) => applied.push(name.clone()),
                        Err(refused) => {
                            not_applied.push(name.clone());
                            why.push(format!("{name}: {}", refused.message));
                        }
                    }
                }
                match (applied.is_empty(), not_applied.is_empty()) {
                    (_, true) => ChangeOutcome::Applied,
                    (true, false) => ChangeOutcome::Refused {
                        why: why.join("; "),
                    },
                    (false, false) => ChangeOutcome::Partial {
                        applied,
                        not_applied,
                        why: why.join("; "),
                    },
                }
            }
            (ChangeWhat::Steps(steps), ChangeAnswer::Stepped(done)) => match &done.stopped {
                None => ChangeOutcome::Applied,
                Some((0, error)) => ChangeOutcome::of_error(error),
                Some((index, error)) => {
                    let (applied, not_applied) = steps.split_at((*index).min(steps.len()));
                    let labels = |steps: &[Step]| steps.iter().map(|s| s.label.clone()).collect();
                    ChangeOutcome::Partial {
                        applied: labels(applied),
                        not_applied: labels(not_applied),
                        why: format!("stopped at {}: {error}", steps[*index].label),
                    }
                }
            },
            _ => ChangeOutcome::Applied,
        }
    }
}

/// Which front end a change came through, and what its audit line says of it.
#[derive(Debug, Clone)]
pub enum FrontEnd {
    /// A REST request: its method and path (lease ids hidden). Its line's status is the one its
    /// answer has: [`ChangeReport::error_kind`]'s [`ErrorKind::http_status`].
    Http { method: String, path: String },
    /// The legacy byte-protocol port: `write`, `transact`, `configure`, `reset`, `bus`.
    Legacy { operation: &'static str },
}

/// Who asked for a change, for its audit line.
#[derive(Debug, Clone)]
pub struct ChangeOrigin {
    pub front: FrontEnd,
    pub peer: SocketAddr,
    /// The API key's name or the user; `None` with access control off.
    pub caller: Option<String>,
    /// The lease (owner, fence) it was admitted under; `None`: nobody held it.
    pub lease: Option<(String, u64)>,
    /// What was asked, e.g. `VSET1=100`.
    pub asked: Option<String>,
    /// When the request came in (the line's duration counts from here).
    pub started: Instant,
    /// The configuration file this change loads, if it is a load: the access rules then ask
    /// `load_config` of every channel of the file.
    pub loads_file: Option<String>,
    /// Set once a change took this origin: its line is the change's to write, and the front
    /// end writes none.
    line_taken: Arc<AtomicBool>,
}

impl ChangeOrigin {
    pub fn new(front: FrontEnd, peer: SocketAddr, started: Instant) -> ChangeOrigin {
        ChangeOrigin {
            front,
            peer,
            caller: None,
            lease: None,
            asked: None,
            started,
            loads_file: None,
            line_taken: Arc::default(),
        }
    }

    /// True once a change was submitted with this origin (or a clone of it): the change writes
    /// the audit line.
    pub fn line_taken(&self) -> bool {
        self.line_taken.load(Ordering::Acquire)
    }

    /// The status the front end answers `report` with (`None`: the legacy port has none).
    fn status(&self, report: &ChangeReport) -> Option<u16> {
        match &self.front {
            FrontEnd::Http { .. } => Some(report.error_kind().map_or(200, ErrorKind::http_status)),
            FrontEnd::Legacy { .. } => None,
        }
    }

    /// The audit line of a change with this origin, its `outcome` and its answer's `status`.
    fn line(&self, outcome: &ChangeOutcome, status: Option<u16>) -> String {
        let (method, path) = match &self.front {
            FrontEnd::Http { method, path, .. } => (method.as_str(), path.as_str()),
            FrontEnd::Legacy { operation } => ("LEGACY", *operation),
        };
        let line = RequestLine {
            at: SystemTime::now(),
            ip: Some(self.peer.ip()),
            method,
            path,
            status,
            duration: Some(self.started.elapsed()),
        };
        let (applied, not_applied, why) = match outcome {
            ChangeOutcome::Applied => (None, None, None),
            ChangeOutcome::Partial {
                applied,
                not_applied,
                why,
            } => (
                Some(applied.join("; ")),
                Some(not_applied.join("; ")),
                Some(why.clone()),
            ),
            ChangeOutcome::Refused { why } | ChangeOutcome::Unknown { why } => {
                (None, None, Some(why.clone()))
            }
        };
        let fields = ChangeFields {
            caller: self.caller.clone(),
            lease: self.lease.clone(),
            outcome: Some(outcome.word()),
            asked: self.asked.clone(),
            applied,
            not_applied,
            why,
        };
        line.render(Some(&fields))
    }
}

/// A change: what, from whom, under which admission.
#[derive(Clone)]
pub struct Change {
    pub what: ChangeWhat,
    pub origin: ChangeOrigin,
    pub admitted: Admitted,
}

/// What the station service reports of a change it ran to its end.
#[derive(Debug, Clone)]
pub struct ChangeReport {
    pub answer: Result<ChangeAnswer, LinkError>,
    pub outcome: ChangeOutcome,
}

impl ChangeReport {
    /// What went wrong, if anything: the link's failure, or the first item or step the station
    /// refused. A REST answer's status and the change's audit line are this kind's.
    pub fn error_kind(&self) -> Option<ErrorKind> {
        match &self.answer {
            Err(error) => Some(error.kind()),
            Ok(ChangeAnswer::Written(results)) => results
                .iter()
                .find_map(|result| result.as_ref().err())
                .map(|refused| ErrorKind::StationRefused(refused.code)),
            Ok(ChangeAnswer::Stepped(done)) => done.stopped.as_ref().map(|(_, error)| error.kind()),
            Ok(_) => None,
        }
    }
}

/// The caller stopped waiting for a change that is still running (past its bound); it goes on
/// to its end and its audit line says what became of it.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the change is still running after {} ms; it may or may not be applied: its outcome will be in the audit trail, or read the channel to find out",
    .0.as_millis()
)]
pub struct StillRunning(pub Duration);

impl StillRunning {
    /// A station that has not answered yet: a timeout (its outcome is in the audit trail once
    /// it has one).
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::StationTimeout
    }
}

/// The longest a change's answer waits for the read-back of what it wrote (normally one round
/// trip, the READ coalesced with others). Past it the change is answered all the same and the
/// read-back goes on, feeding the cache when the station answers; a failed read-back changes
/// nothing about the write's outcome.
pub const READ_BACK_WAIT: Duration = Duration::from_millis(250);

/// The channels a change's confirmed writes set, to read back into the value cache (SPEC.md:
/// a station may clamp or refuse part of a write, so the cache takes the station's value,
/// never the one asked for): every write item and write step the station confirmed, each
/// once, but never a channel whose read consumes data, nor one the table does not know.
pub fn confirmed_writes(
    what: &ChangeWhat,
    answer: &Result<ChangeAnswer, LinkError>,
    table: &ChannelTable,
) -> Vec<String> {
    let confirmed: Vec<&str> = match (what, answer) {
        (ChangeWhat::Write(items), Ok(ChangeAnswer::Written(results))) => items
            .iter()
            .zip(results)
            .filter(|(_, result)| result.is_ok())
            .map(|((name, _), _)| name.as_str())
            .collect(),
        (ChangeWhat::Steps(steps), Ok(ChangeAnswer::Stepped(done))) => {
            let carried_out = done.stopped.as_ref().map_or(steps.len(), |(at, _)| *at);
            steps[..carried_out.min(steps.len())]
                .iter()
                .filter_map(|step| match &step.action {
                    StepAction::Write { name, .. } => Some(name.as_str()),
                    StepAction::Configure(_) => None,
                })
                .collect()
        }
        _ => Vec::new(),
    };
    let mut names: Vec<String> = Vec::new();
    for name in confirmed {
        let readable = table
            .get(name)
            .is_some_and(|channel| channel.readable && !channel.consuming);
        if readable && !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    names
}

/// The most a caller waits for a change: every step its request timeout (twice: the link may
/// wait for a slot), the acquisition's own time, the read-back's wait and the audit trail's
/// sync.
fn bound(what: &ChangeWhat, request_timeout: Duration) -> Duration {
    let (steps, extra) = match what {
        ChangeWhat::Steps(steps) => (steps.len().max(1), Duration::ZERO),
        ChangeWhat::Sample { expected, .. } => (1, *expected),
        // A UART receive's own time, which the link adds to the request's.
        ChangeWhat::Bus(request) => (
            1,
            request.line.map_or(Duration::ZERO, |line| {
                Duration::from_millis(u64::from(line.timeout_ms))
            }),
        ),
        _ => (1, Duration::ZERO),
    };
    let steps = u32::try_from(steps).unwrap_or(u32::MAX);
    request_timeout
        .saturating_mul(2)
        .saturating_mul(steps)
        .saturating_add(extra)
        .saturating_add(READ_BACK_WAIT)
        .saturating_add(crate::audit::RECORD_LIMIT)
}

/// The station service's side of changes: what runs each one to its end. Cheap to clone.
#[derive(Clone)]
pub(super) struct ChangeRunner {
    link: LinkHandle,
    buses: Arc<BusLanes>,
    /// Where every change's line goes, written by the change's own task.
    pub(super) audit: AuditLog,
    /// The changes still running, each on a task of its own; shutdown waits for them.
    pub(super) changes: tokio_util::task::TaskTracker,
    /// The access rules each change is admitted by, before anything of it is sent.
    pub(super) access: AccessRules,
    /// Where each change runs: the gateway's own runtime, not a request's connection thread.
    runtime: crate::gateway_runtime::GatewayRuntime,
}

impl ChangeRunner {
    pub(super) fn new(link: LinkHandle, buses: Arc<BusLanes>, audit: AuditLog) -> ChangeRunner {
        ChangeRunner {
            link,
            buses,
            audit,
            changes: tokio_util::task::TaskTracker::new(),
            access: AccessRules::off(),
            runtime: crate::gateway_runtime::GatewayRuntime::current(),
        }
    }

    /// Runs `change` to its end on a task of its own — sent under its admission's send guard,
    /// answered or failed, its audit line on disk — and reports what became of it. Waits for
    /// the report at most a bound of the change's size; past it the change goes on and the
    /// caller gets [`StillRunning`].
    pub(super) async fn change(&self, mut change: Change) -> Result<ChangeReport, StillRunning> {
        change.origin.line_taken.store(true, Ordering::Release);
        change.what = change.what.in_station_names(&self.link.info().channels);
        let limit = bound(&change.what, self.link.request_timeout());
        let (report_to, report) = tokio::sync::oneshot::channel();
        let runner = self.clone();
        self.runtime.spawn_tracked(&self.changes, async move {
            let report_ = runner.run_to_its_end(change).await;
            // The caller may have gone: the change and its line are done all the same.
            let _ = report_to.send(report_);
        });
        match tokio::time::timeout(limit, report).await {
            Ok(Ok(report)) => Ok(report),
            // The task panicked (a bug): its outcome is not known.
            Ok(Err(_)) | Err(_) => Err(StillRunning(limit)),
        }
    }

    pub(super) fn runtime(&self) -> &crate::gateway_runtime::GatewayRuntime {
        &self.runtime
    }

    /// Waits (at most `limit`) until every change submitted so far has ended, its line written.
    pub(super) async fn changes_ended(&self, limit: Duration) {
        self.changes.close();
        let _ = tokio::time::timeout(limit, self.changes.wait()).await;
        self.changes.reopen();
    }

    async fn run_to_its_end(&self, change: Change) -> ChangeReport {
        let Change {
            what,
            origin,
            admitted,
        } = change;
        let answer = match self.admit(&what, &origin, admitted).await {
            Ok((admitted, needed)) => {
                let answer = self.carry_out(&what, &admitted).await;
                self.in_rules_words(answer, &needed)
            }
            Err(refusal) => Err(LinkError::Refused(GuardRefusal::from(refusal))),
        };
        let read_back =
            self.read_back(confirmed_writes(&what, &answer, &self.link.info().channels));
        let outcome = ChangeOutcome::of(&what, &answer);
        let report = ChangeReport { answer, outcome };
        let line = origin.line(&report.outcome, origin.status(&report));
        self.record(line, &origin).await;
        if let Some(read_back) = read_back {
            // Mostly done by now (it ran beside the audit line's sync); never waited for long.
            let _ = tokio::time::timeout(READ_BACK_WAIT, read_back).await;
        }
        report
    }

    /// Reads `names` back from the station (one READ, merged with other reads) on a task of
    /// its own: the link puts the station's values in the cache, aged from that READ. Its
    /// failure is only logged: the write's outcome is the write's answer.
    fn read_back(&self, names: Vec<String>) -> Option<tokio::task::JoinHandle<()>> {
        if names.is_empty() {
            return None;
        }
        let link = self.link.clone();
        Some(self.runtime.spawn(async move {
            if let Err(error) = link.read(names.clone()).await {
                tracing::debug!(
                    "reading back {} after a write failed ({error}); the cache has no value of them until the next read",
                    names.join(", ")
                );
            }
        }))
    }

    /// The access rules' admission: every channel of the change decided before anything is
    /// sent; its interlocks checked on a value read within half `interlock_max_age_ms` (read
    /// now when there is none), and again by the send guard right before sending. Returns the
    /// admission with that guard, and the interlocks it checks (for the refusal's words).
    pub(super) async fn admit(
        &self,
        what: &ChangeWhat,
        origin: &ChangeOrigin,
        admitted: Admitted,
    ) -> Result<(Admitted, Vec<access::Needed>), Refusal> {
        let Some(rules) = self.access.current() else {
            return Ok((admitted, Vec::new()));
        };
        let who = access::who_of(origin, &admitted, &self.access);
        let table = self.link.info().channels.clone();
        let needed = access::decide_change(&rules, &who, what, origin.loads_file.is_some(), &table)
            .inspect_err(|refusal| self.access.count_refusal(&refusal.rule))?;
        if needed.is_empty() {
            return Ok((admitted, needed));
        }
        let max_age = rules.interlock_max_age();
        // A value the watcher read within half the trusted age serves; else it is read now,
        // from the hardware (the answer lands in the cache the checks read).
        let cache = self.link.cache();
        let generation = self.link.info().generation;
        let now = Instant::now();
        let mut stale: Vec<String> = needed
            .iter()
            .map(|n| n.interlock.channel.to_string())
            .filter(|channel| {
                !cache
                    .get(channel)
                    .is_some_and(|c| c.generation == generation && c.age(now) <= max_age / 2)
            })
            .collect();
        stale.dedup();
        let read_now = !stale.is_empty();
        if read_now {
            let _ = self.link.read(stale).await;
        }
        let generation = self.link.info().generation;
        let held = access::interlocks_hold(&needed, cache, generation, Instant::now(), max_age);
        if held.is_err() && !read_now {
            // A cached value that says no is read again from the hardware before refusing:
            // a door closed since the last poll lets the change through.
            let mut channels: Vec<String> = needed
                .iter()
                .map(|n| n.interlock.channel.to_string())
                .collect();
            channels.dedup();
            let _ = self.link.read(channels).await;
        }
        let generation = self.link.info().generation;
        access::interlocks_hold(&needed, cache, generation, Instant::now(), max_age)
            .inspect_err(|refusal| self.access.count_refusal(&refusal.rule))?;
        let guard = access::interlocked_guard(admitted.guard.clone(), &needed, max_age);
        Ok((
            Admitted {
                guard: Some(guard),
                ..admitted
            },
            needed,
        ))
    }

    /// `answer` with an interlock the link found broken at send time (the whole change's, or
    /// the step's that stopped) in the access rules' words, and counted against its rule.
    fn in_rules_words(
        &self,
        answer: Result<ChangeAnswer, LinkError>,
        needed: &[access::Needed],
    ) -> Result<ChangeAnswer, LinkError> {
        let words = |error: LinkError| match error {
            LinkError::Refused(GuardRefusal::Interlock(broken)) => {
                match access::interlock_refusal(needed, &broken) {
                    Some(refusal) => {
                        self.access.count_refusal(&refusal.rule);
                        LinkError::Refused(GuardRefusal::from(refusal))
                    }
                    None => LinkError::Refused(GuardRefusal::Interlock(broken)),
                }
            }
            other => other,
        };
        match answer {
            Err(error) => Err(words(error)),
            Ok(ChangeAnswer::Stepped(mut done)) => {
                done.stopped = done.stopped.map(|(index, error)| (index, words(error)));
                Ok(ChangeAnswer::Stepped(done))
            }
            Ok(answer) => Ok(answer),
        }
    }

    /// The audit line of a change refused before it was run (the lease, for a legacy client),
    /// written before its answer goes out.
    pub(super) async fn record_refused(&self, origin: ChangeOrigin, why: &str) {
        let outcome = ChangeOutcome::Refused {
            why: why.to_owned(),
        };
        let line = origin.line(&outcome, None);
        self.record(line, &origin).await;
    }

    async fn record(&self, line: String, origin: &ChangeOrigin) {
        if let Err(why) = self.audit.record(line).await {
            // The change happened (or not) as reported; only its record failed: say so loudly.
            error!(
                "{why}; a change from {} is answered without its audit line",
                origin.peer
            );
        }
    }

    async fn carry_out(
        &self,
        what: &ChangeWhat,
        admitted: &Admitted,
    ) -> Result<ChangeAnswer, LinkError> {
        let guard = || admitted.guard.clone();
        Ok(match what {
            ChangeWhat::Write(items) => {
                ChangeAnswer::Written(self.link.write(items.clone(), guard()).await?)
            }
            ChangeWhat::Transact { name, value } => ChangeAnswer::Transacted(
                self.link
                    .transact(name.clone(), value.clone(), guard())
                    .await?,
            ),
            ChangeWhat::Steps(steps) => ChangeAnswer::Stepped(self.steps(steps, admitted).await),
            ChangeWhat::Bus(request) => ChangeAnswer::Bus(
                self.buses
                    .run(&self.link, request.clone(), admitted)
                    .await?,
            ),
            ChangeWhat::Sample { request, expected } => {
                let (samples, end) = self
                    .link
                    .sample(request.clone(), guard(), *expected)
                    .await?;
                ChangeAnswer::Sampled { samples, end }
            }
            ChangeWhat::Reset { requester } => {
                self.link.reset(requester.clone(), guard()).await?;
                ChangeAnswer::Reset
            }
        })
    }

    /// Runs the steps one after another; the first that fails stops them.
    async fn steps(&self, steps: &[Step], admitted: &Admitted) -> StepsDone {
        let mut done = StepsDone::default();
        for (index, step) in steps.iter().enumerate() {
            let result = match &step.action {
                StepAction::Configure(request) => self
                    .link
                    .configure(request.clone(), admitted.guard.clone())
                    .await
                    .map(Some),
                StepAction::Write { name, value } => {
                    let items = vec![(name.clone(), value.clone())];
                    match self.link.write(items, admitted.guard.clone()).await {
                        Ok(mut results) => match results.pop() {
                            Some(Err(refused)) => Err(LinkError::Station(refused)),
                            _ => Ok(None),
                        },
                        Err(error) => Err(error),
                    }
                }
            };
            match result {
                Ok(reply) => done.done.push(reply),
                Err(error) => {
                    done.stopped = Some((index, error));
                    break;
                }
            }
        }
        done
    }
}

#[cfg(test)]
mod tests;
