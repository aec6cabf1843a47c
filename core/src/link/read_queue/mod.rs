//! Every decision about forced reads, without I/O: which reads wait, which are held to gather
//! a burst, what goes in the next READ frame, and when the next held READ is due. The clock is
//! passed in, so the rules are unit-tested below without sockets or a runtime.
//!
//! The rules:
//! - Reads of a channel not yet sent are merged: every reader of it gets the one answer, and
//!   one READ carries many channels (up to `max_names` and a payload budget).
//! - A reader never joins a READ already on the wire (its value must be read after it asked):
//!   it joins the next one, sent as soon as the wire is free.
//! - The next READ is held back to gather the rest of a burst only while a burst is
//!   measurably under way: a reader that is new to the channel (no answer of it within
//!   `quiet`) arrives while it is on the wire, held, or answered to others within `quiet`.
//! - A client reading in a loop, back within `quiet` after its own answer, is no burst: alone
//!   or taking turns with other looping clients on the same channel, it is never held (it
//!   still joins a hold a burst started).
//! - A hold lasts until no new reader came for `quiet`, and at most `max` after it began; it
//!   ends at once when nobody is left to come: every reader waiting is a client connection
//!   answered on the channel within `max`, and every such connection is back (waiting or on
//!   the wire). Clients reading one channel in turn, slower than `quiet`, are then not held.
//! - A hold that has ended is released even when it ended between a dispatch and the wait.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::time::Duration;

use station_protocol::{ErrorCode, ItemResult, StationError, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::command::Caller;
use super::error::LinkError;

/// Payload bytes a READ may fill with names; leaves room under the frame limit.
pub const READ_PAYLOAD_BUDGET: usize = 60_000;

/// Where a read call's answer goes.
pub type ReadReply = oneshot::Sender<Result<Vec<ItemResult<Value>>, LinkError>>;

/// Where a name's result goes: which call, which position in it.
pub type Waiter = (u64, usize);

/// How reads are gathered; from `station.coalesce_quiet_us`, `coalesce_max_us` and
/// `max_names_per_read`. A zero `max` never holds a READ back.
#[derive(Debug, Clone, Copy)]
pub struct CoalescePolicy {
    pub quiet: Duration,
    pub max: Duration,
    pub max_names: usize,
}

/// A forced read call waiting for one or more names.
struct ReadCall {
    results: Vec<Option<ItemResult<Value>>>,
    remaining: usize,
    caller: Option<Caller>,
    reply: ReadReply,
}

/// A READ's worth of names, and who waits for each; handed out by [`ReadQueue::next_batch`]
/// and given back with its answer.
#[derive(Debug)]
pub struct ReadBatch {
    pub names: Vec<String>,
    waiters: Vec<Vec<Waiter>>,
}

/// How the station answered a READ.
pub enum ReadAnswer {
    /// One result per name, in order.
    Values(Vec<ItemResult<Value>>),
    /// The READ as a whole failed: every name gets this error.
    Refused(StationError),
}

/// A hold on a channel's next READ: since when, and until when.
#[derive(Debug, Clone, Copy)]
struct Hold {
    first: Instant,
    until: Instant,
}

/// The forced reads of one session.
pub struct ReadQueue {
    policy: CoalescePolicy,
    next_call: u64,
    calls: HashMap<u64, ReadCall>,
    /// Names waiting for a READ not yet sent, in the order first asked.
    order: VecDeque<String>,
    waiting: HashMap<String, Vec<Waiter>>,
    /// Channels on the wire, each with the client connections its READ answers.
    on_wire: HashMap<String, Vec<Caller>>,
    held: HashMap<String, Hold>,
    /// Channels whose READ was answered less than `quiet` ago (and some answered before).
    answered: HashMap<String, RecentAnswers>,
    /// When `answered` was last rid of answers older than `quiet`.
    pruned_at: Option<Instant>,
}

/// A channel's answers of the last `quiet`: the latest one's time, and each client
/// connection answered with the time of its answer.
#[derive(Debug, Default)]
struct RecentAnswers {
    latest: Option<Instant>,
    callers: Vec<(Caller, Instant)>,
}

impl ReadQueue {
    pub fn new(policy: CoalescePolicy) -> ReadQueue {
        ReadQueue {
            policy,
            next_call: 1,
            calls: HashMap::new(),
            order: VecDeque::new(),
            waiting: HashMap::new(),
            on_wire: HashMap::new(),
            held: HashMap::new(),
            answered: HashMap::new(),
            pruned_at: None,
        }
    }

    /// Takes a read call of `names` by `caller`, made at `now`.
    pub fn enqueue(
        &mut self,
        names: Vec<String>,
        caller: Option<Caller>,
        reply: ReadReply,
        now: Instant,
    ) {
        if names.is_empty() {
            let _ = reply.send(Ok(Vec::new()));
            return;
        }
        let call = self.next_call;
        self.next_call += 1;
        let count = names.len();
        for (index, name) in names.into_iter().enumerate() {
            if self.starts_or_extends_hold(&name, caller, now) {
                let until = |first: Instant| (now + self.policy.quiet).min(first + self.policy.max);
                match self.held.get_mut(&name) {
                    Some(hold) => hold.until = until(hold.first),
                    None => {
                        let hold = Hold {
                            first: now,
                            until: until(now),
                        };
                        self.held.insert(name.clone(), hold);
                    }
                }
            }
            match self.waiting.get_mut(&name) {
                Some(waiting) if !waiting.is_empty() => waiting.push((call, index)),
                _ => {
                    self.waiting.insert(name.clone(), vec![(call, index)]);
                    self.order.push_back(name);
                }
            }
        }
        self.calls.insert(
            call,
            ReadCall {
                results: vec![None; count],
                remaining: count,
                caller,
                reply,
            },
        );
    }

    /// A reader new to the channel that finds it on the wire (or already held), or answered a
    /// moment ago to other clients, is part of a burst. A client reading in a loop comes back
    /// just after its own answer: that is no burst, even when other looping clients share the
    /// channel and the READ on the wire is theirs.
    fn starts_or_extends_hold(&self, name: &str, caller: Option<Caller>, now: Instant) -> bool {
        if self.policy.max.is_zero() {
            return false;
        }
        let quiet = self.policy.quiet;
        let recent = |at: &Instant| now.saturating_duration_since(*at) < quiet;
        let answers = self.answered.get(name);
        if let Some(caller) = caller
            && answers.is_some_and(|answers| {
                answers
                    .callers
                    .iter()
                    .any(|(answered, at)| *answered == caller && recent(at))
            })
        {
            return false;
        }
        let just_answered_to_others = caller.is_some()
            && answers.is_some_and(|answers| answers.latest.as_ref().is_some_and(recent));
        self.on_wire.contains_key(name) || self.held.contains_key(name) || just_answered_to_others
    }

    /// How long a client connection answered on a channel is expected back (it reads in a
    /// loop): the longest a hold may last, at least `quiet`.
    fn memory(&self) -> Duration {
        self.policy.max.max(self.policy.quiet)
    }

    /// The client connections of `waiters`, each once.
    fn callers_of(&self, waiters: &[Waiter]) -> Vec<Caller> {
        let mut callers: Vec<Caller> = Vec::with_capacity(waiters.len());
        for caller in waiters
            .iter()
            .filter_map(|(call, _)| self.calls.get(call).and_then(|c| c.caller))
        {
            if !callers.contains(&caller) {
                callers.push(caller);
            }
        }
        callers
    }

    /// A hold gathers the readers still to come. When every reader waiting for `name` is a
    /// client connection answered on it within [`memory`](Self::memory), and every such
    /// connection is back (waiting, or in the READ on the wire), nobody is left to come: the
    /// hold would only make them wait (8 dashboards reading one monitor in turn). A reader
    /// unknown to the channel (a new client, a reader without a connection) keeps the hold.
    fn everyone_expected_is_back(&self, name: &str, waiting: &[Waiter], now: Instant) -> bool {
        let Some(answers) = self.answered.get(name) else {
            return false;
        };
        let memory = self.memory();
        let expected: HashSet<Caller> = answers
            .callers
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(*at) < memory)
            .map(|(caller, _)| *caller)
            .collect();
        if expected.is_empty() {
            return false;
        }
        let mut back: HashSet<Caller> = HashSet::with_capacity(expected.len());
        for (call, _) in waiting {
            match self.calls.get(call).and_then(|c| c.caller) {
                Some(caller) if expected.contains(&caller) => {
                    back.insert(caller);
                }
                _ => return false,
            }
        }
        if let Some(on_wire) = self.on_wire.get(name) {
            back.extend(on_wire.iter().filter(|caller| expected.contains(*caller)));
        }
        back.len() == expected.len()
    }

    /// The next READ to send at `now`: waiting names not on the wire and not held, in the order
    /// first asked, within the name and payload limits. Marks them on the wire. Readers who gave
    /// up are dropped; a name too long for any frame is answered with an error.
    pub fn next_batch(&mut self, now: Instant) -> Option<ReadBatch> {
        if self.order.is_empty() {
            // Nothing waits: only holds that have ended are forgotten.
            if !self.held.is_empty() {
                self.held.retain(|_, hold| hold.until > now);
            }
            return None;
        }
        let mut names = Vec::new();
        let mut waiters = Vec::new();
        let mut budget = READ_PAYLOAD_BUDGET;
        let mut kept = VecDeque::with_capacity(self.order.len());
        while let Some(name) = self.order.pop_front() {
            let mut live: Vec<Waiter> = self.waiting.remove(&name).unwrap_or_default();
            live.retain(|(call, _)| self.calls.get(call).is_some_and(|c| !c.reply.is_closed()));
            if live.is_empty() {
                continue;
            }
            let cost = name.len() + 2;
            if cost > READ_PAYLOAD_BUDGET {
                let error = StationError::new(
                    ErrorCode::BadValue,
                    format!(
                        "a channel name of {} bytes does not fit in a frame",
                        name.len()
                    ),
                );
                self.deliver(&live, Err(error));
                continue;
            }
            let gathering = self.held.get(&name).is_some_and(|hold| hold.until > now)
                && !self.everyone_expected_is_back(&name, &live, now);
            if self.on_wire.contains_key(&name)
                || gathering
                || names.len() >= self.policy.max_names
                || cost > budget
            {
                self.waiting.insert(name.clone(), live);
                kept.push_back(name);
                continue;
            }
            budget -= cost;
            self.held.remove(&name);
            names.push(name);
            waiters.push(live);
        }
        self.order = kept;
        let waiting = &self.waiting;
        self.held
            .retain(|name, hold| hold.until > now || waiting.contains_key(name));
        if names.is_empty() {
            return None;
        }
        for (name, group) in names.iter().zip(&waiters) {
            let callers = self.callers_of(group);
            self.on_wire.insert(name.clone(), callers);
        }
        Some(ReadBatch { names, waiters })
    }

    /// When a held READ is due: the earliest hold of a channel not on the wire (its answer
    /// wakes the task anyway), and only while the window has room (a freed slot wakes it).
    /// A hold that has already ended is due at once, even if it ended after the last dispatch.
    pub fn next_release(&self, window_has_room: bool) -> Option<Instant> {
        if !window_has_room {
            return None;
        }
        self.held
            .iter()
            .filter(|(name, _)| !self.on_wire.contains_key(*name))
            .map(|(_, hold)| hold.until)
            .min()
    }

    /// The station answered `batch` at `now`: every reader gets its result.
    pub fn answered(&mut self, batch: ReadBatch, answer: ReadAnswer, now: Instant) {
        self.off_wire(&batch);
        self.note_answered(&batch, now);
        match answer {
            ReadAnswer::Values(results) => {
                for (group, result) in batch.waiters.iter().zip(results) {
                    self.deliver(group, result);
                }
            }
            ReadAnswer::Refused(error) => {
                for group in &batch.waiters {
                    self.deliver(group, Err(error.clone()));
                }
            }
        }
    }

    /// The station answered `batch`, but not with values for it: its readers get `error`.
    pub fn answered_wrongly(&mut self, batch: ReadBatch, error: LinkError, now: Instant) {
        self.off_wire(&batch);
        self.note_answered(&batch, now);
        self.fail_waiters(&batch.waiters, &error);
    }

    /// `batch` got no usable answer (timed out, unreadable): its readers get `error`.
    pub fn lost(&mut self, batch: ReadBatch, error: LinkError) {
        self.off_wire(&batch);
        self.fail_waiters(&batch.waiters, &error);
    }

    /// The session ended: every waiting reader gets `error`, and nothing is remembered.
    pub fn fail_all(&mut self, error: &LinkError) {
        for (_, call) in self.calls.drain() {
            let _ = call.reply.send(Err(error.clone()));
        }
        self.order.clear();
        self.waiting.clear();
        self.held.clear();
        self.answered.clear();
        self.pruned_at = None;
        self.on_wire.clear();
    }

    fn off_wire(&mut self, batch: &ReadBatch) {
        for name in &batch.names {
            self.on_wire.remove(name);
        }
    }

    /// Remembers, for `quiet`, that a READ of `batch` was answered and to which callers.
    fn note_answered(&mut self, batch: &ReadBatch, now: Instant) {
        let quiet = self.policy.quiet;
        if quiet.is_zero() {
            return;
        }
        let recent = |at: &Instant| now.saturating_duration_since(*at) < quiet;
        // Answers older than `quiet` count for nothing (every use checks the time); they are
        // forgotten at most once per `quiet`, not at every answer.
        // Callers are kept for `memory`: who is expected back (see `everyone_expected_is_back`).
        let memory = self.memory();
        let remembered = |at: &Instant| now.saturating_duration_since(*at) < memory;
        if self.pruned_at.is_none_or(|at| !recent(&at)) {
            self.pruned_at = Some(now);
            self.answered.retain(|_, answers| {
                answers.callers.retain(|(_, at)| remembered(at));
                answers.latest.as_ref().is_some_and(remembered)
            });
        }
        for (name, group) in batch.names.iter().zip(&batch.waiters) {
            if !self.answered.contains_key(name) {
                self.answered.insert(name.clone(), RecentAnswers::default());
            }
            let Some(answers) = self.answered.get_mut(name) else {
                continue;
            };
            answers.latest = Some(now);
            for caller in group
                .iter()
                .filter_map(|(call, _)| self.calls.get(call).and_then(|c| c.caller))
            {
                match answers
                    .callers
                    .iter_mut()
                    .find(|(known, _)| *known == caller)
                {
                    Some((_, at)) => *at = now,
                    None => answers.callers.push((caller, now)),
                }
            }
        }
    }

    /// Gives one name's result to every call waiting for it; answers calls that are complete.
    fn deliver(&mut self, waiters: &[Waiter], result: ItemResult<Value>) {
        let mut result = Some(result);
        for (i, &(call_id, index)) in waiters.iter().enumerate() {
            let Some(call) = self.calls.get_mut(&call_id) else {
                continue;
            };
            if call.results[index].is_none() {
                // The last waiter takes the result itself; the others a copy.
                call.results[index] = if i + 1 == waiters.len() {
                    result.take()
                } else {
                    result.clone()
                };
                call.remaining -= 1;
            }
            if call.remaining == 0
                && let Some(call) = self.calls.remove(&call_id)
            {
                let results = call.results.into_iter().flatten().collect();
                let _ = call.reply.send(Ok(results));
            }
        }
    }

    fn fail_waiters(&mut self, groups: &[Vec<Waiter>], error: &LinkError) {
        for group in groups {
            for &(call_id, _) in group {
                if let Some(call) = self.calls.remove(&call_id) {
                    let _ = call.reply.send(Err(error.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
