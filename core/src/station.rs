//! The station service: the one place every front end (REST handlers, the legacy listener, the
//! subscription scheduler) goes through to touch the station. It decides what comes from the
//! value cache and what from the hardware, applies the rule for channels whose read consumes
//! data, says when the station has not been reached, computes ages, and hands each change to
//! the link with the send guard its lease admission gave, bus transactions one bus at a time in
//! arrival order (`station/bus.rs`). Front ends only translate their wire format to and from it.

mod access;
mod bus;
mod change;
mod policy;

use foldhash::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use station_protocol::sample::{SampleEnd, SampleRequest};
use station_protocol::{Configure, ConfigureReply, ItemResult, Value};
use tokio::sync::broadcast;

use crate::access_rules::AccessRules;
use crate::link::{ChannelTable, LinkError, LinkEvent, LinkHandle, StationInfo};
pub use change::{
    Change, ChangeAnswer, ChangeOrigin, ChangeOutcome, ChangeReport, ChangeWhat, FrontEnd, Step,
    StepAction, StepsDone, StillRunning,
};
pub use policy::{
    ConsumingRule, Freshness, ItemError, ItemReading, ReadError, ReadPolicy, UnknownRule,
};
use policy::{ReadPlan, plan_read};

pub use crate::access_rules::channel_facts;

/// The station as every front end sees it. Cheap to clone.
#[derive(Clone)]
pub struct Station {
    link: LinkHandle,
    /// The bus channels' transaction queues (`station/bus.rs`).
    buses: Arc<bus::BusLanes>,
    /// Runs each change to its end on a task of its own, its audit line included
    /// (`station/change.rs`).
    changes: change::ChangeRunner,
    /// The access rules every change and read is admitted by (`station/access.rs`).
    access: AccessRules,
}

impl std::fmt::Debug for Station {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Station").finish_non_exhaustive()
    }
}

/// One value as a read gives it: the value and how long ago the station read it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub value: Value,
    pub age: Duration,
}

impl Reading {
    /// The age in milliseconds with a tenth of a millisecond's precision, as the REST contract
    /// and the event stream give it.
    pub fn age_ms(&self) -> f64 {
        age_ms(self.age)
    }
}

/// Milliseconds with a tenth of a millisecond's precision.
pub fn age_ms(age: Duration) -> f64 {
    (age.as_secs_f64() * 10_000.0).round() / 10.0
}

/// Why the station cannot be asked: it has not been reached (yet, or now).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("station disconnected: {why}")]
pub struct NotReached {
    /// The link's last error, or "connecting".
    pub why: String,
}

impl NotReached {
    fn of(info: &StationInfo) -> NotReached {
        NotReached {
            why: info
                .last_error
                .clone()
                .unwrap_or_else(|| "connecting".into()),
        }
    }
}

impl Station {
    /// The station behind `link`; changes are recorded in `audit`.
    pub fn new(link: LinkHandle, audit: crate::audit::AuditLog) -> Station {
        let buses: Arc<bus::BusLanes> = Arc::default();
        Station {
            changes: change::ChangeRunner::new(link.clone(), buses.clone(), audit),
            link,
            buses,
            access: AccessRules::off(),
        }
    }

    /// The same station with every change and read admitted by `access`.
    pub fn with_access_rules(mut self, access: AccessRules) -> Station {
        self.changes.access = access.clone();
        self.access = access;
        self
    }

    /// The access rules in force.
    pub fn access_rules(&self) -> &AccessRules {
        &self.access
    }

    /// Whether `who` may take the control lease (the rules' `lease` action, over the station).
    pub fn may_take_lease(
        &self,
        who: &crate::access_rules::Who,
    ) -> Result<(), crate::rules::Refusal> {
        self.may_over_station(who, crate::rules::Action::Lease)
    }

    /// Whether `who` may press the safe stop (the rules' `safe_stop` action, over the
    /// station); without a rules file, everyone the endpoint's role lets in may.
    pub fn may_safe_stop(
        &self,
        who: &crate::access_rules::Who,
    ) -> Result<(), crate::rules::Refusal> {
        self.may_over_station(who, crate::rules::Action::SafeStop)
    }

    /// Whether `who` may do the station-wide `action`: a refusal names the rule, counted.
    fn may_over_station(
        &self,
        who: &crate::access_rules::Who,
        action: crate::rules::Action,
    ) -> Result<(), crate::rules::Refusal> {
        let Some(rules) = self.access.current() else {
            return Ok(());
        };
        let principal = rules.principal(&who.subject());
        let decision = rules.decide(
            &principal,
            &crate::rules::ChannelFacts::named(""),
            action,
            None,
        );
        if decision.allowed {
            return Ok(());
        }
        self.access.count_refusal(&decision.rule);
        Err(crate::rules::Refusal::of(&decision, action, "the station"))
    }

    /// Whether `who` may read `names` (from the cache, as a subscription's values are served):
    /// the first channel refused, with the rule, counted like every refusal.
    pub fn may_read(
        &self,
        who: &crate::access_rules::Who,
        names: &[String],
    ) -> Result<(), crate::rules::Refusal> {
        self.may(who, names, crate::rules::Action::ReadCache)
    }

    /// Whether `who` may do `action` to every channel of `names` (a configuration save's
    /// `save_config`): the first channel refused, with the rule, counted.
    pub fn may(
        &self,
        who: &crate::access_rules::Who,
        names: &[String],
        action: crate::rules::Action,
    ) -> Result<(), crate::rules::Refusal> {
        let Some(rules) = self.access.current() else {
            return Ok(());
        };
        let info = self.link.info();
        access::decide_all(&rules, who, names, action, &info.channels)
            .inspect_err(|refusal| self.access.count_refusal(&refusal.rule))
    }

    /// Runs `change` to its end on a task of its own — sent under its admission's send guard,
    /// answered or failed, its audit line on disk — and reports what became of it; a caller
    /// that goes away changes nothing about that. Waits at most a bound of the change's size
    /// (past it, [`StillRunning`]: the change goes on).
    pub async fn change(&self, change: Change) -> Result<ChangeReport, StillRunning> {
        self.changes.change(change).await
    }

    /// The audit line of a change refused before it was run (a legacy client's while the
    /// lease is held), on disk when this returns.
    pub async fn record_refused(&self, origin: ChangeOrigin, why: &str) {
        self.changes.record_refused(origin, why).await;
    }

    /// Waits (at most `limit`) until every change submitted so far has ended, its line written.
    pub async fn changes_ended(&self, limit: Duration) {
        self.changes.changes_ended(limit).await;
    }

    /// Where work that must finish runs (the gateway's own runtime): a change, and a sequence
    /// of changes a request starts (a configuration file's load).
    pub fn runtime(&self) -> &crate::gateway_runtime::GatewayRuntime {
        self.changes.runtime()
    }

    /// What the gateway knows of the station now.
    pub fn info(&self) -> Arc<StationInfo> {
        self.link.info()
    }

    /// The station's info once it has said hello on some connection (the link may be down
    /// now: what it said is kept).
    pub fn reached(&self) -> Result<Arc<StationInfo>, NotReached> {
        self.reached_now().map(arc_swap::Guard::into_inner)
    }

    /// [`Station::reached`] to look at without keeping it: the read path's way.
    pub fn reached_now(&self) -> Result<arc_swap::Guard<Arc<StationInfo>>, NotReached> {
        let info = self.link.info_now();
        if info.hello.is_none() {
            return Err(NotReached::of(&info));
        }
        Ok(info)
    }

    /// The station's info while the link is up.
    pub fn connected(&self) -> Result<Arc<StationInfo>, NotReached> {
        let info = self.link.info();
        if !info.connected {
            return Err(NotReached::of(&info));
        }
        Ok(info)
    }

    /// The station's NOTIFY frames and the link's connection and configuration changes.
    pub fn subscribe_events(&self) -> broadcast::Receiver<LinkEvent> {
        self.link.subscribe_events()
    }

    /// Reads `names` by `policy`: one answer per asked name, in order. Fresh-enough values
    /// come from the cache; the rest are read from the hardware: ordinary channels in one
    /// merged read, channels whose read consumes data in one READ under the policy's send
    /// guard, like a change (refused at the link once the lease it was admitted under ended).
    pub async fn read(
        &self,
        names: &[String],
        policy: ReadPolicy<'_>,
    ) -> Result<Vec<ItemReading>, ReadError> {
        // Looked at, not kept: a cached read writes nothing the other worker threads share;
        // a read that goes to the hardware keeps it below.
        let info = self.link.info_now();
        let plan = plan_read(
            names,
            &policy,
            &info.channels,
            info.generation,
            self.link.cache(),
            Instant::now(),
        )?;
        let ReadPlan {
            decided,
            misses,
            guarded_misses,
        } = plan;
        if let (Some(who), Some(rules)) = (policy.who, self.access.current()) {
            // Every channel by where its value comes from, before anything is read.
            let from_cache = decided
                .iter()
                .zip(names)
                .filter(|(slot, _)| matches!(slot, Some(Ok(_))))
                .map(|(_, name)| (name.as_str(), true));
            let from_hardware = misses
                .iter()
                .chain(&guarded_misses)
                .map(|n| (n.as_str(), false));
            if let Err(refusal) =
                access::decide_read(&rules, who, from_cache.chain(from_hardware), &info.channels)
            {
                self.access.count_refusal(&refusal.rule);
                return Err(ReadError::AccessDenied(refusal));
            }
        }
        if misses.is_empty() && guarded_misses.is_empty() {
            return Ok(decided.into_iter().flatten().collect());
        }
        let info = arc_swap::Guard::into_inner(info);
        // Boxed: a cached read never comes here, and inline the hardware read's state (about
        // 1 KB) would make every read's future, and every handler's, that much larger.
        Box::pin(self.read_misses(
            names,
            &policy,
            &info.channels,
            ReadPlan {
                decided,
                misses,
                guarded_misses,
            },
        ))
        .await
    }

    /// The hardware part of [`Station::read`]: the plan's misses read, and every name's reading
    /// in the order asked.
    async fn read_misses(
        &self,
        names: &[String],
        policy: &ReadPolicy<'_>,
        channels: &ChannelTable,
        plan: ReadPlan,
    ) -> Result<Vec<ItemReading>, ReadError> {
        let ReadPlan {
            mut decided,
            misses,
            guarded_misses,
        } = plan;
        let read = async {
            if guarded_misses.is_empty() {
                // The common case: no guarded read to run beside the plain one.
                let plain = self.link_read(policy, misses.clone()).await;
                return (plain, Ok(Vec::new()));
            }
            tokio::join!(
                self.link_read(policy, misses.clone()),
                self.guarded_read(policy, guarded_misses.clone())
            )
        };
        let read = match policy.cancel {
            Some(cancel) => tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                read = read => Some(read),
            },
            None => Some(read.await),
        };
        let now = Instant::now();
        let (plain, guarded) = match read {
            None => (None, None),
            Some((plain, guarded)) => (Some(plain), Some(guarded)),
        };
        let mut answered: Vec<ItemReading> = self.answers(&misses, plain, now);
        answered.extend(self.answers(&guarded_misses, guarded, now));
        if let ([None], [_]) = (decided.as_slice(), answered.as_slice()) {
            // One name, read from the hardware: its answer as it is.
            return Ok(answered);
        }
        // A name asked twice was read once: both positions get its answer.
        let by_name: HashMap<&str, &ItemReading> = misses
            .iter()
            .chain(&guarded_misses)
            .map(String::as_str)
            .zip(&answered)
            .collect();
        for (slot, name) in decided.iter_mut().zip(names) {
            if slot.is_none() {
                let name = channels.station_name(name);
                *slot = by_name.get(name).map(|answer| (*answer).clone());
            }
        }
        Ok(decided
            .into_iter()
            .map(|slot| slot.unwrap_or(Err(ItemError::Cancelled)))
            .collect())
    }

    /// One answer per name of a hardware read: `None` when it was cancelled.
    fn answers(
        &self,
        names: &[String],
        read: Option<Result<Vec<ItemResult<Value>>, LinkError>>,
        now: Instant,
    ) -> Vec<ItemReading> {
        match read {
            None => vec![Err(ItemError::Cancelled); names.len()],
            Some(Err(error)) => vec![Err(ItemError::Link(error)); names.len()],
            Some(Ok(results)) => results
                .into_iter()
                .zip(names)
                .map(|(result, name)| self.reading(name, result, now))
                .collect(),
        }
    }

    /// Reads of ordinary channels: merged with other reads, unguarded.
    async fn link_read(
        &self,
        policy: &ReadPolicy<'_>,
        names: Vec<String>,
    ) -> Result<Vec<ItemResult<Value>>, LinkError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        match policy.caller {
            Some(caller) => self.link.read_for(caller, names).await,
            None => self.link.read(names).await,
        }
    }

    /// Reads of channels whose read consumes data: like a change, under the policy's guard
    /// (the plan reads them only when there is one).
    async fn guarded_read(
        &self,
        policy: &ReadPolicy<'_>,
        names: Vec<String>,
    ) -> Result<Vec<ItemResult<Value>>, LinkError> {
        match policy.guard {
            _ if names.is_empty() => Ok(Vec::new()),
            Some(guard) => self.link.read_guarded(names, guard.clone()).await,
            None => Err(LinkError::Refused(crate::link::GuardRefusal::NoLeaseCheck)),
        }
    }

    /// A hardware answer with its age: the cached entry's when it holds this very value (the
    /// link stamps it with the time the READ was sent), else 0.
    fn reading(&self, name: &str, result: ItemResult<Value>, now: Instant) -> ItemReading {
        let value = result.map_err(ItemError::Station)?;
        let age = self
            .link
            .cache()
            .get(name)
            .filter(|cached| cached.value == value)
            .map(|cached| cached.age(now))
            .unwrap_or(Duration::ZERO);
        Ok(Reading { value, age })
    }

    /// CONFIGURE without settings: what a channel's configuration is; changes nothing.
    pub async fn channel_config(&self, name: &str) -> Result<ConfigureReply, LinkError> {
        let request = Configure {
            name: self.info().channels.station_name(name).to_owned(),
            settings: Vec::new(),
        };
        self.link.configure(request, None).await
    }

    /// False once the station, on its current connection, answered a bus transaction with
    /// `unsupported` (firmware without BUS); true until then.
    pub fn bus_supported(&self) -> bool {
        self.buses.supported(self.link.info().generation)
    }

    /// What a NumericResult channel says of itself without acquiring: its rate and the
    /// target's unit (a SAMPLE of 0 samples), and its default sample count (a READ of it).
    pub async fn sampler_info(
        &self,
        channel: &str,
        target: &str,
    ) -> Result<(SampleEnd, Option<i64>), LinkError> {
        let ask = SampleRequest {
            channel: channel.to_owned(),
            target: target.to_owned(),
            count: 0,
            frame_samples: 0,
        };
        let (_, end) = self.link.sample(ask, None, Duration::ZERO).await?;
        let default = match self.link.read(vec![channel.to_owned()]).await?.pop() {
            Some(Ok(Value::Integer(n))) => Some(n),
            _ => None,
        };
        Ok((end, default))
    }
}

/// Keeps the interlock channels the access rules name fresh in the cache, reading them from
/// the hardware every `interlock_poll_ms` while the link is up, so that the send guard of an
/// interlocked change sees a door opened after its admission. Runs until `shutdown`.
pub async fn watch_interlocks(station: Station, shutdown: tokio_util::sync::CancellationToken) {
    loop {
        let rules = station.access.current();
        let poll = rules
            .as_ref()
            .map_or(Duration::from_secs(1), |rules| rules.interlock_poll());
        let channels = rules
            .map(|rules| rules.interlock_channels())
            .unwrap_or_default();
        if !channels.is_empty() && station.link.info().connected {
            let read = station.link.read(channels);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = read => {}
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use station_protocol::{ErrorCode, StationError};
    use tokio_util::sync::CancellationToken;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    fn policy(freshness: Freshness<'_>) -> ReadPolicy<'_> {
        ReadPolicy {
            freshness,
            consuming: ConsumingRule::Read,
            unknown: UnknownRule::AskStation,
            caller: None,
            cancel: None,
            guard: None,
            who: None,
        }
    }

    #[test]
    fn ages_have_a_tenth_of_a_millisecond_precision() {
        assert_eq!(age_ms(Duration::from_micros(1_234)), 1.2);
        assert_eq!(age_ms(Duration::from_micros(1_250)), 1.3);
        assert_eq!(age_ms(Duration::ZERO), 0.0);
        let reading = Reading {
            value: Value::Float(0.0),
            age: Duration::from_millis(5),
        };
        assert_eq!(reading.age_ms(), 5.0);
    }

    /// A station service on a link task that is never run: every hardware read times out.
    fn unanswered_station() -> Station {
        let (_task, link) = crate::link::LinkTask::new(link_settings("tcp://127.0.0.1:1"));
        Station::new(link, crate::audit::AuditLog::memory_only())
    }

    fn link_settings(url: &str) -> crate::link::LinkSettings {
        crate::link::LinkSettings {
            url: crate::link::StationUrl::parse(url).unwrap(),
            request_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(500),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(100),
            max_names_per_read: 64,
            coalesce_quiet: Duration::ZERO,
            coalesce_max: Duration::ZERO,
            queue_depth: 8,
            client_name: "station service test".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_hardware_read_fails_each_miss_and_keeps_the_cached_values() {
        let station = unanswered_station();
        station
            .link
            .cache()
            .insert("V", Value::Float(1.0), Instant::now(), 0);
        let asked = names(&["W", "V", "W"]);
        let readings = station
            .read(&asked, policy(Freshness::Within(Duration::from_secs(1))))
            .await
            .unwrap();
        assert_eq!(readings.len(), 3);
        assert!(matches!(readings[0], Err(ItemError::Link(_))));
        assert_eq!(readings[1].as_ref().unwrap().value, Value::Float(1.0));
        assert!(matches!(readings[2], Err(ItemError::Link(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_read_answers_its_misses_cancelled_and_keeps_the_cached_values() {
        let station = unanswered_station();
        station
            .link
            .cache()
            .insert("V", Value::Float(1.0), Instant::now(), 0);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let mut with_cancel = policy(Freshness::Within(Duration::from_secs(1)));
        with_cancel.cancel = Some(&cancel);
        let readings = station
            .read(&names(&["V", "W"]), with_cancel)
            .await
            .unwrap();
        assert!(readings[0].is_ok());
        assert!(matches!(readings[1], Err(ItemError::Cancelled)));
    }

    #[tokio::test]
    async fn hardware_answers_reach_every_position_asked_with_the_age_of_their_read() {
        use station_simulator::{Profile, Simulator};
        let sim = Simulator::start(Profile::default_station(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let url = format!("tcp://{}", sim.local_addr());
        let (task, link) = crate::link::LinkTask::new(link_settings(&url));
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(task.run(shutdown.clone()));
        let station = Station::new(link, crate::audit::AuditLog::memory_only());
        let mut info = station.link.watch_info();
        tokio::time::timeout(Duration::from_secs(5), info.wait_for(|i| i.connected))
            .await
            .expect("the link never reached the simulator")
            .unwrap();
        let known = station.info().channels.channels[0].name.clone();
        let asked = vec![known.clone(), "NO.SUCH.CHANNEL".to_owned(), known.clone()];
        let readings = station
            .read(&asked, ReadPolicy::hardware(None, None))
            .await
            .unwrap();
        assert_eq!(sim.reads_of(&known), 1, "a name asked twice is read once");
        let first = readings[0].as_ref().unwrap();
        assert_eq!(Some(first), readings[2].as_ref().ok());
        assert!(first.age < Duration::from_secs(5), "{first:?}");
        assert!(matches!(&readings[1], Err(ItemError::Station(_))));
        // A fresh-enough read of it now comes from the cache.
        let cached = station
            .read(
                &asked[..1],
                policy(Freshness::Within(Duration::from_secs(60))),
            )
            .await
            .unwrap();
        assert_eq!(cached[0].as_ref().unwrap().value, first.value);
        assert_eq!(sim.reads_of(&known), 1);
        assert!(station.reached().is_ok() && station.connected().is_ok());
        shutdown.cancel();
        running.await.unwrap();
    }

    #[test]
    fn a_station_never_reached_says_why() {
        let station = unanswered_station();
        let not_reached = station.reached().unwrap_err();
        assert_eq!(not_reached.to_string(), "station disconnected: connecting");
        assert!(station.connected().is_err());
    }

    #[test]
    fn a_hardware_value_has_the_age_of_its_cache_entry_only_when_that_entry_holds_it() {
        let station = unanswered_station();
        let t0 = Instant::now();
        let now = t0 + Duration::from_millis(30);
        station.link.cache().insert("V", Value::Float(1.0), t0, 0);
        let same = station.reading("V", Ok(Value::Float(1.0)), now).unwrap();
        assert_eq!(same.age, Duration::from_millis(30));
        let replaced = station.reading("V", Ok(Value::Float(2.0)), now).unwrap();
        assert_eq!(replaced.age, Duration::ZERO);
        let uncached = station.reading("W", Ok(Value::Float(2.0)), now).unwrap();
        assert_eq!(uncached.age, Duration::ZERO);
        let refused = station.reading("V", Err(StationError::new(ErrorCode::ReadOnly, "no")), now);
        assert!(matches!(refused, Err(ItemError::Station(_))));
    }
}

#[cfg(test)]
mod change_tests;
