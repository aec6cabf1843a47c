//! The station service: the one place every front end (REST handlers, the legacy listener, the
//! subscription scheduler) goes through to touch the station. It decides what comes from the
//! value cache and what from the hardware, applies the rule for channels whose read consumes
//! data, says when the station has not been reached, computes ages, and hands each change to
//! the link with the send guard its lease admission gave. Front ends only translate their wire
//! format to and from it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use station_protocol::{ItemResult, StationError, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::cache::ValueCache;
use crate::lease::Admitted;
use crate::link::{Caller, ChannelTable, LinkError, LinkEvent, LinkHandle, StationInfo};

/// The station as every front end sees it. Cheap to clone.
#[derive(Clone)]
pub struct Station {
    link: LinkHandle,
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

/// Why one name of a read has no value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ItemError {
    /// The station answered this name with an error.
    #[error("{}", .0.message)]
    Station(StationError),
    /// The read of the misses did not get the station's answer; every miss carries it.
    #[error("{0}")]
    Link(LinkError),
    /// Reading this channel consumes data, and the policy refuses that ([`ConsumingRule::Refuse`]).
    #[error("reading this channel consumes data")]
    Consuming,
    /// The channel is not in the station's channel list ([`UnknownRule::Refuse`]).
    #[error("no such channel")]
    UnknownChannel,
    /// The policy's `cancel` token fired before the station answered.
    #[error("not read: the gateway is shutting down")]
    Cancelled,
}

/// The outcome of one asked name.
pub type ItemReading = Result<Reading, ItemError>;

/// A read refused as a whole.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// [`ConsumingRule::CachedOnly`]: this consuming channel has no value in the cache.
    #[error("{0} consumes data on read and has no cached value")]
    ConsumingNotCached(String),
}

/// Where values may come from.
#[derive(Clone, Copy)]
pub enum Freshness<'a> {
    /// Always from the hardware.
    Hardware,
    /// From the cache when read under the current link generation at most this long ago.
    Within(Duration),
    /// Like `Within`, with a maximum age per channel (the subscription scheduler's: a fraction
    /// of the shortest interval any subscription asks of the channel).
    PerChannel(&'a (dyn Fn(&str) -> Duration + Sync)),
}

/// What to do with channels whose read consumes data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumingRule {
    /// Read them like any other channel (the lease holder, or anyone while nobody holds it).
    Read,
    /// Serve any cached value however old, with its true age; with nothing cached the whole
    /// read is refused ([`ReadError::ConsumingNotCached`]). A REST cached read while someone
    /// else holds the lease.
    CachedOnly,
    /// Never read them: each is answered [`ItemError::Consuming`]. Legacy clients while someone
    /// holds the lease, and subscriptions always.
    Refuse,
}

/// What to do with names the channel list does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownRule {
    /// Ask the station anyway: it answers with its own error.
    AskStation,
    /// Answer [`ItemError::UnknownChannel`] without asking.
    Refuse,
}

/// How one front end reads. The differences between front ends are all here.
#[derive(Clone, Copy)]
pub struct ReadPolicy<'a> {
    pub freshness: Freshness<'a>,
    pub consuming: ConsumingRule,
    pub unknown: UnknownRule,
    /// Who asked, for the link's burst gathering; `None` for the gateway's own reads.
    pub caller: Option<Caller>,
    /// Stops waiting for the hardware when cancelled (the scheduler at shutdown).
    pub cancel: Option<&'a CancellationToken>,
}

impl<'a> ReadPolicy<'a> {
    /// Everything from the hardware: what the station itself does.
    pub fn hardware(caller: Option<Caller>) -> ReadPolicy<'a> {
        ReadPolicy {
            freshness: Freshness::Hardware,
            consuming: ConsumingRule::Read,
            unknown: UnknownRule::AskStation,
            caller,
            cancel: None,
        }
    }
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

/// Where each asked name's answer comes from, decided before anything is sent.
#[derive(Debug)]
struct ReadPlan {
    /// One per asked name: decided now, or `None` for a name read from the hardware.
    decided: Vec<Option<ItemReading>>,
    /// The names to read from the hardware, in the order first asked.
    misses: Vec<String>,
}

/// The cache-or-hardware decision for every asked name; pure, so every branch is testable.
fn plan_read(
    names: &[String],
    policy: &ReadPolicy<'_>,
    channels: &ChannelTable,
    generation: u64,
    cache: &ValueCache,
    now: Instant,
) -> Result<ReadPlan, ReadError> {
    let mut decided: Vec<Option<ItemReading>> = Vec::with_capacity(names.len());
    let mut misses: Vec<String> = Vec::new();
    for name in names {
        let channel = channels.get(name);
        if channel.is_none() && policy.unknown == UnknownRule::Refuse {
            decided.push(Some(Err(ItemError::UnknownChannel)));
            continue;
        }
        let consuming = channel.is_some_and(|channel| channel.consuming);
        if consuming {
            match policy.consuming {
                ConsumingRule::Read => {}
                ConsumingRule::Refuse => {
                    decided.push(Some(Err(ItemError::Consuming)));
                    continue;
                }
                ConsumingRule::CachedOnly => {
                    let cached = cache
                        .get(name)
                        .ok_or_else(|| ReadError::ConsumingNotCached(name.clone()))?;
                    decided.push(Some(Ok(Reading {
                        age: cached.age(now),
                        value: cached.value,
                    })));
                    continue;
                }
            }
        }
        let max_age = match policy.freshness {
            Freshness::Hardware => None,
            Freshness::Within(max_age) => Some(max_age),
            Freshness::PerChannel(max_age_of) => Some(max_age_of(name)),
        };
        if let Some(cached) =
            max_age.and_then(|max_age| cache.get_fresh(name, max_age, generation, now))
        {
            decided.push(Some(Ok(Reading {
                age: cached.age(now),
                value: cached.value,
            })));
            continue;
        }
        decided.push(None);
        if !misses.contains(name) {
            misses.push(name.clone());
        }
    }
    Ok(ReadPlan { decided, misses })
}

impl Station {
    pub fn new(link: LinkHandle) -> Station {
        Station { link }
    }

    /// What the gateway knows of the station now.
    pub fn info(&self) -> Arc<StationInfo> {
        self.link.info()
    }

    /// The station's info once it has said hello on some connection (the link may be down
    /// now: what it said is kept).
    pub fn reached(&self) -> Result<Arc<StationInfo>, NotReached> {
        let info = self.link.info();
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
    /// come from the cache; all the rest are read from the hardware in one call.
    pub async fn read(
        &self,
        names: &[String],
        policy: ReadPolicy<'_>,
    ) -> Result<Vec<ItemReading>, ReadError> {
        let info = self.link.info();
        let plan = plan_read(
            names,
            &policy,
            &info.channels,
            info.generation,
            self.link.cache(),
            Instant::now(),
        )?;
        let ReadPlan {
            mut decided,
            misses,
        } = plan;
        if misses.is_empty() {
            return Ok(decided.into_iter().flatten().collect());
        }
        let read = self.link_read(&policy, misses.clone());
        let read = match policy.cancel {
            Some(cancel) => tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                read = read => Some(read),
            },
            None => Some(read.await),
        };
        let now = Instant::now();
        let answered: Vec<ItemReading> = match read {
            None => vec![Err(ItemError::Cancelled); misses.len()],
            Some(Err(error)) => vec![Err(ItemError::Link(error)); misses.len()],
            Some(Ok(results)) => results
                .into_iter()
                .zip(&misses)
                .map(|(result, name)| self.reading(name, result, now))
                .collect(),
        };
        // A name asked twice was read once: both positions get its answer.
        let by_name: HashMap<&str, &ItemReading> =
            misses.iter().map(String::as_str).zip(&answered).collect();
        for (slot, name) in decided.iter_mut().zip(names) {
            if slot.is_none() {
                *slot = by_name.get(name.as_str()).map(|answer| (*answer).clone());
            }
        }
        Ok(decided
            .into_iter()
            .map(|slot| slot.unwrap_or(Err(ItemError::Cancelled)))
            .collect())
    }

    async fn link_read(
        &self,
        policy: &ReadPolicy<'_>,
        names: Vec<String>,
    ) -> Result<Vec<ItemResult<Value>>, LinkError> {
        match policy.caller {
            Some(caller) => self.link.read_for(caller, names).await,
            None => self.link.read(names).await,
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

    /// Writes `items` in one WRITE frame under the admission's send guard; one status per item.
    pub async fn write(
        &self,
        items: Vec<(String, Value)>,
        admitted: &Admitted,
    ) -> Result<Vec<ItemResult<()>>, LinkError> {
        self.link.write(items, admitted.guard.clone()).await
    }

    /// Writes `value` to `name` and reads it back in one step, under the admission's send guard.
    pub async fn transact(
        &self,
        name: String,
        value: Value,
        admitted: &Admitted,
    ) -> Result<Value, LinkError> {
        self.link
            .transact(name, value, admitted.guard.clone())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use station_protocol::{ChannelDescriptor, Direction, ValueType};

    fn channel(name: &str, consuming: bool) -> ChannelDescriptor {
        ChannelDescriptor {
            name: name.into(),
            alias: String::new(),
            net_name: String::new(),
            type_flags: 1,
            direction: Direction::In,
            unit: String::new(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable: false,
            consuming,
            value_type: ValueType::Float,
            options: Vec::new(),
        }
    }

    fn table() -> ChannelTable {
        ChannelTable::new(vec![channel("V", false), channel("UART", true)])
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| (*name).to_owned()).collect()
    }

    fn policy<'a>(freshness: Freshness<'a>, consuming: ConsumingRule) -> ReadPolicy<'a> {
        ReadPolicy {
            freshness,
            consuming,
            unknown: UnknownRule::AskStation,
            caller: None,
            cancel: None,
        }
    }

    const GENERATION: u64 = 7;

    /// A cache holding V = 1.0 and UART = 2.0, both read at `t0` under [`GENERATION`].
    fn cache(t0: Instant) -> ValueCache {
        let cache = ValueCache::new();
        cache.insert("V", Value::Float(1.0), t0, GENERATION);
        cache.insert("UART", Value::Float(2.0), t0, GENERATION);
        cache
    }

    fn plan(
        names: &[String],
        policy: &ReadPolicy<'_>,
        cache: &ValueCache,
        now: Instant,
    ) -> ReadPlan {
        plan_read(names, policy, &table(), GENERATION, cache, now).unwrap()
    }

    fn value_of(slot: &Option<ItemReading>) -> Option<(Value, Duration)> {
        match slot {
            Some(Ok(reading)) => Some((reading.value.clone(), reading.age)),
            _ => None,
        }
    }

    #[test]
    fn hardware_reads_every_name_and_never_looks_at_the_cache() {
        let t0 = Instant::now();
        let cache = cache(t0);
        let asked = names(&["V", "UART", "NOPE"]);
        let plan = plan(&asked, &ReadPolicy::hardware(None), &cache, t0);
        assert!(plan.decided.iter().all(Option::is_none));
        assert_eq!(plan.misses, asked);
        assert_eq!(cache.hits_and_misses(), (0, 0));
    }

    #[test]
    fn a_name_asked_twice_is_read_once() {
        let t0 = Instant::now();
        let plan = plan(
            &names(&["V", "NOPE", "V"]),
            &policy(Freshness::Hardware, ConsumingRule::Read),
            &ValueCache::new(),
            t0,
        );
        assert_eq!(plan.misses, names(&["V", "NOPE"]));
        assert_eq!(plan.decided.len(), 3);
    }

    #[test]
    fn a_fresh_enough_value_comes_from_the_cache_with_its_age_and_an_older_one_is_read() {
        let t0 = Instant::now();
        let cache = cache(t0);
        let now = t0 + Duration::from_millis(100);
        let fresh = plan(
            &names(&["V"]),
            &policy(
                Freshness::Within(Duration::from_millis(100)),
                ConsumingRule::Read,
            ),
            &cache,
            now,
        );
        assert_eq!(
            value_of(&fresh.decided[0]),
            Some((Value::Float(1.0), Duration::from_millis(100)))
        );
        assert!(fresh.misses.is_empty());
        let stale = plan(
            &names(&["V"]),
            &policy(
                Freshness::Within(Duration::from_millis(99)),
                ConsumingRule::Read,
            ),
            &cache,
            now,
        );
        assert!(stale.decided[0].is_none());
        assert_eq!(stale.misses, names(&["V"]));
    }

    #[test]
    fn a_value_of_an_older_link_generation_is_never_fresh() {
        let t0 = Instant::now();
        let cache = ValueCache::new();
        cache.insert("V", Value::Float(1.0), t0, GENERATION - 1);
        let plan = plan(
            &names(&["V"]),
            &policy(
                Freshness::Within(Duration::from_secs(60)),
                ConsumingRule::Read,
            ),
            &cache,
            t0,
        );
        assert_eq!(plan.misses, names(&["V"]));
    }

    #[test]
    fn per_channel_freshness_asks_each_channel_its_own_maximum_age() {
        let t0 = Instant::now();
        let cache = cache(t0);
        let max_age = |name: &str| {
            if name == "V" {
                Duration::from_millis(50)
            } else {
                Duration::from_millis(500)
            }
        };
        let now = t0 + Duration::from_millis(100);
        let plan = plan(
            &names(&["V", "UART"]),
            &policy(Freshness::PerChannel(&max_age), ConsumingRule::Read),
            &cache,
            now,
        );
        assert!(plan.decided[0].is_none());
        assert_eq!(
            value_of(&plan.decided[1]),
            Some((Value::Float(2.0), Duration::from_millis(100)))
        );
        assert_eq!(plan.misses, names(&["V"]));
    }

    #[test]
    fn consuming_channels_are_read_refused_or_served_from_the_cache_however_old() {
        let t0 = Instant::now();
        let cache = cache(t0);
        let long_after = t0 + Duration::from_secs(3600);
        let within = Freshness::Within(Duration::from_millis(10));
        let read = plan(
            &names(&["UART"]),
            &policy(within, ConsumingRule::Read),
            &cache,
            long_after,
        );
        assert_eq!(read.misses, names(&["UART"]));
        let refused = plan(
            &names(&["UART", "V"]),
            &policy(within, ConsumingRule::Refuse),
            &cache,
            long_after,
        );
        assert!(matches!(
            refused.decided[0],
            Some(Err(ItemError::Consuming))
        ));
        assert_eq!(refused.misses, names(&["V"]));
        let cached = plan(
            &names(&["UART"]),
            &policy(within, ConsumingRule::CachedOnly),
            &cache,
            long_after,
        );
        assert_eq!(
            value_of(&cached.decided[0]),
            Some((Value::Float(2.0), Duration::from_secs(3600)))
        );
        assert!(cached.misses.is_empty());
        // Not even an older generation's value is refused: its true age says how old it is.
        let other_generation = plan_read(
            &names(&["UART"]),
            &policy(within, ConsumingRule::CachedOnly),
            &table(),
            GENERATION + 1,
            &cache,
            long_after,
        )
        .unwrap();
        assert!(value_of(&other_generation.decided[0]).is_some());
    }

    #[test]
    fn a_consuming_channel_with_nothing_cached_refuses_the_whole_cached_only_read() {
        let refused = plan_read(
            &names(&["V", "UART"]),
            &policy(
                Freshness::Within(Duration::from_secs(1)),
                ConsumingRule::CachedOnly,
            ),
            &table(),
            GENERATION,
            &ValueCache::new(),
            Instant::now(),
        );
        assert!(matches!(refused, Err(ReadError::ConsumingNotCached(name)) if name == "UART"));
    }

    #[test]
    fn unknown_names_are_refused_or_left_to_the_station() {
        let t0 = Instant::now();
        let mut refuse = policy(Freshness::Hardware, ConsumingRule::Read);
        refuse.unknown = UnknownRule::Refuse;
        let refused = plan(&names(&["NOPE", "V"]), &refuse, &ValueCache::new(), t0);
        assert!(matches!(
            refused.decided[0],
            Some(Err(ItemError::UnknownChannel))
        ));
        assert_eq!(refused.misses, names(&["V"]));
        let asked = plan(
            &names(&["NOPE"]),
            &policy(Freshness::Hardware, ConsumingRule::Refuse),
            &ValueCache::new(),
            t0,
        );
        assert_eq!(asked.misses, names(&["NOPE"]));
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
        Station::new(link)
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
            .read(
                &asked,
                policy(
                    Freshness::Within(Duration::from_secs(1)),
                    ConsumingRule::Read,
                ),
            )
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
        let mut with_cancel = policy(
            Freshness::Within(Duration::from_secs(1)),
            ConsumingRule::Read,
        );
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
        let station = Station::new(link);
        let mut info = station.link.watch_info();
        tokio::time::timeout(Duration::from_secs(5), info.wait_for(|i| i.connected))
            .await
            .expect("the link never reached the simulator")
            .unwrap();
        let known = station.info().channels.channels[0].name.clone();
        let asked = vec![known.clone(), "NO.SUCH.CHANNEL".to_owned(), known.clone()];
        let readings = station
            .read(&asked, ReadPolicy::hardware(None))
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
                policy(
                    Freshness::Within(Duration::from_secs(60)),
                    ConsumingRule::Read,
                ),
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
}
