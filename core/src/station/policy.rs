//! How a front end reads, and the cache-or-hardware decision for every name it asks: the
//! differences between the REST API, the legacy listener and the subscription scheduler are
//! all [`ReadPolicy`] fields, decided here in one pure function.
//!
//! Fresh-enough cached values of the current link generation are served with their age, the
//! rest read from the hardware in one read. How fresh is per front end (`MaxAgeMs`,
//! `legacy.read_max_age_ms` while the lease is held, a fraction of a subscription's interval);
//! a REST non-holder's read while another client holds the lease is cache-only
//! (`Freshness::CacheOnly`); channels whose read consumes data are read under the admission's
//! send guard, or refused, by the policy's `ConsumingRule`.

use std::time::{Duration, Instant};

use station_protocol::StationError;
use tokio_util::sync::CancellationToken;

use super::Reading;
use crate::cache::ValueCache;
use crate::link::{Caller, ChannelTable, LinkError, SendGuard};

/// Why one name of a read has no value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ItemError {
    /// The station answered this name with an error.
    #[error("{}", .0.message)]
    Station(StationError),
    /// The read of the misses did not get the station's answer; every miss carries it.
    #[error("{0}")]
    Link(LinkError),
    /// Reading this channel consumes data, and the policy refuses that ([`ConsumingRule::Refuse`],
    /// or a read with no send guard to carry).
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
    /// [`Freshness::CacheOnly`]: this channel has no value in the cache.
    #[error("{name} has no cached value")]
    NotCached { name: String, consuming: bool },
    /// [`ConsumingRule::NeedsControl`]: this channel's read consumes data, and it would have
    /// been read from the hardware.
    #[error("reading {0} from the hardware consumes its data")]
    NeedsControl(String),
    /// The access rules refuse the caller a channel's read (from the cache or the hardware).
    #[error("{0}")]
    AccessDenied(crate::rules::Refusal),
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
    /// Only from the cache, however old (with its true age) and whatever link generation; a
    /// name with nothing cached refuses the whole read ([`ReadError::NotCached`]). A REST
    /// cached read by a non-holder while someone else holds the lease: never the hardware.
    CacheOnly,
}

/// What to do with channels whose read consumes data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumingRule {
    /// Read them from the hardware when the freshness asks for it, like a change: under the
    /// policy's send guard (the lease holder, or anyone while nobody holds it). With no guard
    /// each is answered [`ItemError::Consuming`].
    Read,
    /// Never read them: each is answered [`ItemError::Consuming`]. Legacy clients while someone
    /// holds the lease, and subscriptions always.
    Refuse,
    /// Fresh-enough cached values serve; one that would be read from the hardware refuses the
    /// whole read ([`ReadError::NeedsControl`]). A REST read with the `read` role.
    NeedsControl,
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
    /// The lease admission's send guard, carried by hardware reads of channels whose read
    /// consumes data (checked by the link at send time, like a change's).
    pub guard: Option<&'a SendGuard>,
    /// Who reads, for the access rules; `None`: the gateway's own reads, never checked.
    pub who: Option<&'a crate::access_rules::Who>,
}

impl<'a> ReadPolicy<'a> {
    /// Everything from the hardware: what the station itself does; channels whose read
    /// consumes data only under `guard`.
    pub fn hardware(caller: Option<Caller>, guard: Option<&'a SendGuard>) -> ReadPolicy<'a> {
        ReadPolicy {
            freshness: Freshness::Hardware,
            consuming: ConsumingRule::Read,
            unknown: UnknownRule::AskStation,
            caller,
            cancel: None,
            guard,
            who: None,
        }
    }
}

/// Where each asked name's answer comes from, decided before anything is sent.
#[derive(Debug)]
pub(super) struct ReadPlan {
    /// One per asked name: decided now, or `None` for a name read from the hardware (under
    /// its station name, [`ChannelTable::station_name`]).
    pub(super) decided: Vec<Option<ItemReading>>,
    /// The station names to read from the hardware, in the order first asked.
    pub(super) misses: Vec<String>,
    /// The names of channels whose read consumes data to read from the hardware under the
    /// policy's send guard, in the order first asked.
    pub(super) guarded_misses: Vec<String>,
}

/// The cache-or-hardware decision for every asked name; pure, so every branch is testable.
pub(super) fn plan_read(
    names: &[String],
    policy: &ReadPolicy<'_>,
    channels: &ChannelTable,
    generation: u64,
    cache: &ValueCache,
    now: Instant,
) -> Result<ReadPlan, ReadError> {
    let mut decided: Vec<Option<ItemReading>> = Vec::with_capacity(names.len());
    let mut misses: Vec<String> = Vec::new();
    let mut guarded_misses: Vec<String> = Vec::new();
    for asked in names {
        // Every name as the station knows it (an alias or net name resolved once, here, for
        // every front end): the cache and the READ use the station's name.
        // One lookup for both, not one each (a cached read's hot path).
        let channel = channels.get(asked);
        let name: &str = channel.map_or(asked.as_str(), |channel| &channel.name);
        if channel.is_none() && policy.unknown == UnknownRule::Refuse {
            decided.push(Some(Err(ItemError::UnknownChannel)));
            continue;
        }
        let consuming = channel.is_some_and(|channel| channel.consuming);
        if consuming && policy.consuming == ConsumingRule::Refuse {
            decided.push(Some(Err(ItemError::Consuming)));
            continue;
        }
        let max_age = match policy.freshness {
            Freshness::Hardware => None,
            Freshness::Within(max_age) => Some(max_age),
            Freshness::PerChannel(max_age_of) => Some(max_age_of(asked)),
            Freshness::CacheOnly => {
                let cached = cache.get(name).ok_or_else(|| ReadError::NotCached {
                    name: name.to_owned(),
                    consuming,
                })?;
                decided.push(Some(Ok(Reading {
                    age: cached.age(now),
                    value: cached.value,
                })));
                continue;
            }
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
        if consuming {
            if policy.consuming == ConsumingRule::NeedsControl {
                return Err(ReadError::NeedsControl(name.to_owned()));
            }
            if policy.guard.is_none() {
                decided.push(Some(Err(ItemError::Consuming)));
                continue;
            }
        }
        decided.push(None);
        let to_read = if consuming {
            &mut guarded_misses
        } else {
            &mut misses
        };
        if !to_read.iter().any(|read| read == name) {
            to_read.push(name.to_owned());
        }
    }
    Ok(ReadPlan {
        decided,
        misses,
        guarded_misses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use station_protocol::{ChannelDescriptor, Direction, Value, ValueType};

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
            guard: None,
            who: None,
        }
    }

    /// A guard that always lets the read through.
    fn open_guard() -> SendGuard {
        SendGuard::passing(None)
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
        let guard = open_guard();
        let plan = plan(
            &asked,
            &ReadPolicy::hardware(None, Some(&guard)),
            &cache,
            t0,
        );
        assert!(plan.decided.iter().all(Option::is_none));
        assert_eq!(plan.misses, names(&["V", "NOPE"]));
        assert_eq!(plan.guarded_misses, names(&["UART"]));
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
    fn consuming_channels_are_read_under_the_guard_or_refused() {
        let t0 = Instant::now();
        let cache = cache(t0);
        let long_after = t0 + Duration::from_secs(3600);
        let within = Freshness::Within(Duration::from_millis(10));
        let guard = open_guard();
        let mut guarded = policy(within, ConsumingRule::Read);
        guarded.guard = Some(&guard);
        let read = plan(&names(&["UART", "V"]), &guarded, &cache, long_after);
        assert_eq!(read.guarded_misses, names(&["UART"]));
        assert_eq!(read.misses, names(&["V"]));
        // Without a guard to carry, a consuming channel is never read from the hardware...
        let unguarded = plan(
            &names(&["UART", "V"]),
            &policy(within, ConsumingRule::Read),
            &cache,
            long_after,
        );
        assert!(matches!(
            unguarded.decided[0],
            Some(Err(ItemError::Consuming))
        ));
        assert!(unguarded.guarded_misses.is_empty());
        assert_eq!(unguarded.misses, names(&["V"]));
        // ... but a fresh-enough cached value serves, guard or not.
        let fresh = plan(
            &names(&["UART"]),
            &policy(
                Freshness::Within(Duration::from_secs(1)),
                ConsumingRule::Read,
            ),
            &cache,
            t0,
        );
        assert_eq!(
            value_of(&fresh.decided[0]),
            Some((Value::Float(2.0), Duration::ZERO))
        );
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
        assert!(refused.guarded_misses.is_empty());
    }

    #[test]
    fn cache_only_serves_every_channel_however_old_and_never_reads() {
        let t0 = Instant::now();
        let cache = cache(t0);
        let long_after = t0 + Duration::from_secs(3600);
        let cached = plan(
            &names(&["UART", "V"]),
            &policy(Freshness::CacheOnly, ConsumingRule::Read),
            &cache,
            long_after,
        );
        assert_eq!(
            value_of(&cached.decided[0]),
            Some((Value::Float(2.0), Duration::from_secs(3600)))
        );
        assert_eq!(
            value_of(&cached.decided[1]),
            Some((Value::Float(1.0), Duration::from_secs(3600)))
        );
        assert!(cached.misses.is_empty() && cached.guarded_misses.is_empty());
        // Not even an older generation's value is refused: its true age says how old it is.
        let other_generation = plan_read(
            &names(&["UART", "V"]),
            &policy(Freshness::CacheOnly, ConsumingRule::Read),
            &table(),
            GENERATION + 1,
            &cache,
            long_after,
        )
        .unwrap();
        assert!(value_of(&other_generation.decided[0]).is_some());
        assert!(value_of(&other_generation.decided[1]).is_some());
    }

    #[test]
    fn a_channel_with_nothing_cached_refuses_the_whole_cache_only_read() {
        let refused = plan_read(
            &names(&["V", "UART"]),
            &policy(Freshness::CacheOnly, ConsumingRule::Read),
            &table(),
            GENERATION,
            &ValueCache::new(),
            Instant::now(),
        );
        assert!(
            matches!(&refused, Err(ReadError::NotCached { name, consuming: false }) if name == "V"),
            "{refused:?}"
        );
        let t0 = Instant::now();
        let only_v = ValueCache::new();
        only_v.insert("V", Value::Float(1.0), t0, GENERATION);
        let refused = plan_read(
            &names(&["V", "UART"]),
            &policy(Freshness::CacheOnly, ConsumingRule::Read),
            &table(),
            GENERATION,
            &only_v,
            t0,
        );
        assert!(
            matches!(&refused, Err(ReadError::NotCached { name, consuming: true }) if name == "UART"),
            "{refused:?}"
        );
    }

    #[test]
    fn the_read_role_gets_fresh_cached_consuming_values_and_never_reads_them() {
        let t0 = Instant::now();
        let cache = cache(t0);
        let guard = open_guard();
        let mut read_role = policy(
            Freshness::Within(Duration::from_millis(100)),
            ConsumingRule::NeedsControl,
        );
        read_role.guard = Some(&guard);
        let fresh = plan(&names(&["UART", "V"]), &read_role, &cache, t0);
        assert!(value_of(&fresh.decided[0]).is_some());
        let later = t0 + Duration::from_secs(1);
        let refused = plan_read(
            &names(&["V", "UART"]),
            &read_role,
            &table(),
            GENERATION,
            &cache,
            later,
        );
        assert!(
            matches!(&refused, Err(ReadError::NeedsControl(name)) if name == "UART"),
            "{refused:?}"
        );
        read_role.freshness = Freshness::Hardware;
        let forced = plan_read(
            &names(&["UART"]),
            &read_role,
            &table(),
            GENERATION,
            &cache,
            t0,
        );
        assert!(matches!(forced, Err(ReadError::NeedsControl(_))));
        // Ordinary channels are read as usual.
        let ordinary = plan(&names(&["V"]), &read_role, &cache, t0);
        assert_eq!(ordinary.misses, names(&["V"]));
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
}
