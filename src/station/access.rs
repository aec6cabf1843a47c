//! The station service's access check, one place for every front end: a change's channels
//! (each with its action and the value it writes) against the rules in force at admission,
//! its interlocks read from the hardware then and checked again by the send guard right before
//! the change goes on the wire; a read's channels by where each value comes from (cache or
//! hardware).

use std::time::{Duration, Instant};

use station_protocol::{Direction, Value};

use super::change::{ChangeOrigin, ChangeWhat, FrontEnd, StepAction};
use crate::access_rules::{AccessRules, Who};
use crate::cache::ValueCache;
use crate::lease::Admitted;
use crate::link::{ChannelTable, GuardRefusal, LinkHandle, SendGuard};
use crate::rules::{Action, ChannelFacts, Interlock, Refusal, Rules};

/// An interlock a change still needs: checked at admission and by the send guard.
#[derive(Debug, Clone)]
pub(crate) struct Needed {
    pub interlock: Interlock,
    pub action: Action,
    pub channel: String,
}

/// The rules' view of `name` from the channel table (only its name when the table lacks it).
pub(crate) fn facts<'a>(table: &'a ChannelTable, name: &'a str) -> ChannelFacts<'a> {
    match table.get(name) {
        Some(channel) => ChannelFacts {
            name: &channel.name,
            alias: &channel.alias,
            direction: Some(match channel.direction {
                Direction::In => "in",
                Direction::Out => "out",
                Direction::InOut => "inout",
            }),
        },
        None => ChannelFacts::named(name),
    }
}

/// Every channel a change touches, with its action and the value it writes. A configuration
/// load (`loads_file`) asks `load_config` of each channel of the file; a reset is over the
/// whole station.
fn asks(what: &ChangeWhat, loads_file: bool) -> Vec<(&str, Action, Option<&Value>)> {
    match what {
        ChangeWhat::Write(items) => items
            .iter()
            .map(|(name, value)| (name.as_str(), Action::Write, Some(value)))
            .collect(),
        ChangeWhat::Transact { name, value } => vec![(name, Action::Transact, Some(value))],
        ChangeWhat::Steps(steps) => steps
            .iter()
            .map(|step| match &step.action {
                StepAction::Configure(configure) => (
                    configure.name.as_str(),
                    if loads_file {
                        Action::LoadConfig
                    } else {
                        Action::Configure
                    },
                    None,
                ),
                StepAction::Write { name, value } => (
                    name.as_str(),
                    if loads_file {
                        Action::LoadConfig
                    } else {
                        Action::Write
                    },
                    Some(value),
                ),
            })
            .collect(),
        ChangeWhat::Bus(request) => vec![(request.channel.as_str(), Action::Bus, None)],
        ChangeWhat::Sample { request, .. } => {
            vec![(request.channel.as_str(), Action::Sample, None)]
        }
        ChangeWhat::Reset { .. } => vec![("", Action::Reset, None)],
    }
}

/// Who a change comes from, as the rules see it.
pub(crate) fn who_of(origin: &ChangeOrigin, admitted: &Admitted, access: &AccessRules) -> Who {
    let legacy = matches!(origin.front, FrontEnd::Legacy { .. });
    Who {
        name: origin.caller.clone(),
        address: Some(origin.peer.ip()),
        group: if legacy {
            access.legacy_group().map(str::to_owned)
        } else {
            None
        },
        holds_lease: admitted.fence.is_some(),
    }
}

/// The rules' decision on every channel of a change, before anything is sent: the first
/// refusal, or the interlocks the change still needs.
pub(crate) fn decide_change(
    rules: &Rules,
    who: &Who,
    what: &ChangeWhat,
    loads_file: bool,
    table: &ChannelTable,
) -> Result<Vec<Needed>, Refusal> {
    let principal = rules.principal(&who.subject());
    let mut needed = Vec::new();
    for (name, action, written) in asks(what, loads_file) {
        let decision = rules.decide(&principal, &facts(table, name), action, written);
        if !decision.allowed {
            return Err(Refusal::of(&decision, action, name));
        }
        needed.extend(decision.interlocks.into_iter().map(|interlock| Needed {
            interlock,
            action,
            channel: name.to_owned(),
        }));
    }
    Ok(needed)
}

/// Whether every interlock holds by the cache: a value of the current link generation, read
/// at most `max_age` ago, equal to the one the interlock needs.
pub(crate) fn interlocks_hold(
    needed: &[Needed],
    cache: &ValueCache,
    generation: u64,
    now: Instant,
    max_age: Duration,
) -> Result<(), Refusal> {
    for need in needed {
        let seen = cache
            .get(&need.interlock.channel)
            .filter(|cached| cached.generation == generation && cached.age(now) <= max_age);
        match seen {
            Some(cached) if need.interlock.holds(&cached.value) => {}
            Some(cached) => {
                return Err(Refusal::interlock(
                    &need.interlock,
                    need.action,
                    &need.channel,
                    Some(cached.value.render()),
                ));
            }
            None => {
                return Err(Refusal::interlock(
                    &need.interlock,
                    need.action,
                    &need.channel,
                    None,
                ));
            }
        }
    }
    Ok(())
}

/// The admission's guard with the interlocks checked again right before sending.
pub(crate) fn interlocked_guard(
    original: Option<SendGuard>,
    needed: Vec<Needed>,
    link: LinkHandle,
    max_age: Duration,
) -> SendGuard {
    let fence = original.as_ref().and_then(SendGuard::fence);
    SendGuard::new(fence, move || {
        if let Some(original) = &original {
            original.check()?;
        }
        let generation = link.info().generation;
        interlocks_hold(&needed, link.cache(), generation, Instant::now(), max_age)
            .map_err(|refusal| GuardRefusal::Access(Box::new(refusal)))
    })
}

/// The first of `names` the rules refuse `action`.
pub(crate) fn decide_all(
    rules: &Rules,
    who: &Who,
    names: &[String],
    action: Action,
    table: &ChannelTable,
) -> Result<(), Refusal> {
    let principal = rules.principal(&who.subject());
    for name in names {
        let decision = rules.decide(&principal, &facts(table, name), action, None);
        if !decision.allowed {
            return Err(Refusal::of(&decision, action, name));
        }
    }
    Ok(())
}

/// The first channel of a read the rules refuse: `from_cache` says where each value comes from.
pub(crate) fn decide_read<'a>(
    rules: &Rules,
    who: &Who,
    names: impl Iterator<Item = (&'a str, bool)>,
    table: &ChannelTable,
) -> Result<(), Refusal> {
    let principal = rules.principal(&who.subject());
    for (name, from_cache) in names {
        let action = if from_cache {
            Action::ReadCache
        } else {
            Action::ReadHardware
        };
        let decision = rules.decide(&principal, &facts(table, name), action, None);
        if !decision.allowed {
            return Err(Refusal::of(&decision, action, name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn door_needed() -> Vec<Needed> {
        vec![Needed {
            interlock: Interlock {
                rule: Arc::from("door"),
                channel: Arc::from("Interlock.DOOR_CLOSED"),
                value: Arc::from("True"),
            },
            action: Action::Write,
            channel: "0.4.ESH10000662.ON1".into(),
        }]
    }

    #[test]
    fn an_interlock_holds_only_on_a_recent_equal_value_of_this_generation() {
        let needed = door_needed();
        let cache = ValueCache::new();
        let max_age = Duration::from_millis(500);
        let read_at = Instant::now();
        let later = read_at + Duration::from_millis(100);
        let refused = interlocks_hold(&needed, &cache, 1, later, max_age).unwrap_err();
        assert_eq!(
            refused.interlock,
            Some(Box::new(("Interlock.DOOR_CLOSED".into(), None)))
        );
        cache.insert("Interlock.DOOR_CLOSED", Value::Bool(true), read_at, 1);
        assert!(interlocks_hold(&needed, &cache, 1, later, max_age).is_ok());
        // The door opened, and a read since says so: what the send guard sees.
        cache.insert("Interlock.DOOR_CLOSED", Value::Bool(false), later, 1);
        let refused = interlocks_hold(&needed, &cache, 1, later, max_age).unwrap_err();
        assert_eq!(refused.rule.as_ref(), "door");
        assert!(
            refused.message.contains("reads False"),
            "{}",
            refused.message
        );
        assert!(refused.message.contains("0.4.ESH10000662.ON1"));
        cache.insert("Interlock.DOOR_CLOSED", Value::Bool(true), later, 1);
        // Too old to trust, or of an earlier connection: refused.
        let too_late = later + max_age + Duration::from_millis(1);
        assert!(interlocks_hold(&needed, &cache, 1, too_late, max_age).is_err());
        assert!(interlocks_hold(&needed, &cache, 2, later, max_age).is_err());
    }
}
