//! The station service's access check, one place for every front end: a change's channels
//! (each with its action and the value it writes) against the rules in force at admission,
//! its interlocks checked on a recent cached value (read from the hardware when there is none,
//! or when it says no) and checked again by the send guard right before the change goes on
//! the wire; a read's channels by where each value comes from (cache or hardware).

use std::time::{Duration, Instant};

use station_protocol::Value;

use super::change::{ChangeOrigin, ChangeWhat, FrontEnd, StepAction};
use crate::access_rules::{AccessRules, Who, channel_facts};
use crate::cache::ValueCache;
use crate::lease::Admitted;
use crate::link::{
    ChannelTable, Interlock as LinkInterlock, InterlockBroken, Interlocks, SendGuard,
};
use crate::rules::{Action, Interlock, Refusal, Rules};

/// An interlock a change still needs: checked at admission and by the send guard.
#[derive(Debug, Clone)]
pub(crate) struct Needed {
    pub interlock: Interlock,
    pub action: Action,
    pub channel: String,
}

/// One thing a change does to one channel, as the rules judge it: the action and, for a
/// write, the value.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ask<'a> {
    pub channel: &'a str,
    pub action: Action,
    pub written: Option<&'a Value>,
}

impl<'a> Ask<'a> {
    fn of(channel: &'a str, action: Action, written: Option<&'a Value>) -> Ask<'a> {
        Ask {
            channel,
            action,
            written,
        }
    }
}

/// Everything a change will do to the station's channels, judged by what goes on the wire,
/// not by the door it came through: every value written to a channel is a `write` of that
/// value (a `values/set`, a transact, a write step of `channels/configure` or of a
/// configuration load, a legacy WRITE alike), so the write rules and their interlocks hold at
/// every door; each door adds its own action (`transact`, `configure`, `load_config` for
/// every step of a file, `bus`, `sample`). An acquisition reads its target from the hardware
/// (`read_hardware`); a reset is over the whole station.
fn asks(what: &ChangeWhat, loads_file: bool) -> Vec<Ask<'_>> {
    let mut asks = Vec::new();
    match what {
        ChangeWhat::Write(items) => {
            for (name, value) in items {
                asks.push(Ask::of(name, Action::Write, Some(value)));
            }
        }
        ChangeWhat::Transact { name, value } => {
            asks.push(Ask::of(name, Action::Transact, Some(value)));
            asks.push(Ask::of(name, Action::Write, Some(value)));
        }
        ChangeWhat::Steps(steps) => {
            for step in steps {
                let (name, sent) = match &step.action {
                    StepAction::Configure(configure) => (
                        configure.name.as_str(),
                        Ask::of(&configure.name, Action::Configure, None),
                    ),
                    StepAction::Write { name, value } => {
                        (name.as_str(), Ask::of(name, Action::Write, Some(value)))
                    }
                };
                if loads_file {
                    asks.push(Ask::of(name, Action::LoadConfig, sent.written));
                }
                asks.push(sent);
            }
        }
        ChangeWhat::Bus(request) => asks.push(Ask::of(&request.channel, Action::Bus, None)),
        ChangeWhat::Sample { request, .. } => {
            asks.push(Ask::of(&request.channel, Action::Sample, None));
            asks.push(Ask::of(&request.target, Action::ReadHardware, None));
        }
        ChangeWhat::Reset { .. } => asks.push(Ask::of("", Action::Reset, None)),
    }
    asks
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
    for ask in asks(what, loads_file) {
        let decision = rules.decide(
            &principal,
            &channel_facts(table, ask.channel),
            ask.action,
            ask.written,
        );
        if !decision.allowed {
            return Err(Refusal::of(&decision, ask.action, ask.channel));
        }
        needed.extend(decision.interlocks.into_iter().map(|interlock| Needed {
            interlock,
            action: ask.action,
            channel: ask.channel.to_owned(),
        }));
    }
    Ok(needed)
}

/// The interlocks `needed` as the link's send guard checks them, in the same order.
fn interlocks_of(needed: &[Needed], max_age: Duration) -> Interlocks {
    Interlocks {
        conditions: needed
            .iter()
            .map(|need| LinkInterlock {
                channel: need.interlock.channel.clone(),
                value: need.interlock.value.clone(),
            })
            .collect(),
        max_age,
    }
}

/// Whether every interlock holds by the cache: a value of the current link generation, read
/// at most `max_age` ago, equal to the one the interlock needs. The same decision as the send
/// guard's ([`Interlocks::first_broken`]).
pub(crate) fn interlocks_hold(
    needed: &[Needed],
    cache: &ValueCache,
    generation: u64,
    now: Instant,
    max_age: Duration,
) -> Result<(), Refusal> {
    match interlocks_of(needed, max_age).first_broken(cache, generation, now) {
        None => Ok(()),
        // The conditions are `needed`'s, in order: the index is one of them.
        Some(broken) => Err(rendered(&needed[broken.index], &broken)),
    }
}

/// The rules' words for an interlock of `needed` that the link found broken (`None`: not one
/// of these).
pub(crate) fn interlock_refusal(needed: &[Needed], broken: &InterlockBroken) -> Option<Refusal> {
    needed.get(broken.index).map(|need| rendered(need, broken))
}

fn rendered(need: &Needed, broken: &InterlockBroken) -> Refusal {
    Refusal::interlock(
        &need.interlock,
        need.action,
        &need.channel,
        broken.seen.clone(),
    )
}

/// The admission's guard with the interlocks checked again right before sending.
pub(crate) fn interlocked_guard(
    original: Option<SendGuard>,
    needed: &[Needed],
    max_age: Duration,
) -> SendGuard {
    SendGuard::with_interlocks(original, interlocks_of(needed, max_age))
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
        let decision = rules.decide(&principal, &channel_facts(table, name), action, None);
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
        let decision = rules.decide(&principal, &channel_facts(table, name), action, None);
        if !decision.allowed {
            return Err(Refusal::of(&decision, action, name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::change::Step;
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

    fn asked(what: &ChangeWhat, loads_file: bool) -> Vec<(String, Action, Option<String>)> {
        asks(what, loads_file)
            .into_iter()
            .map(|ask| {
                (
                    ask.channel.to_owned(),
                    ask.action,
                    ask.written.map(Value::render),
                )
            })
            .collect()
    }

    fn ask(
        channel: &str,
        action: Action,
        written: Option<&str>,
    ) -> (String, Action, Option<String>) {
        (channel.to_owned(), action, written.map(str::to_owned))
    }

    const ON1: &str = "0.4.ESH10000662.ON1";

    #[test]
    fn every_value_a_change_sends_is_asked_as_a_write_of_that_value_whatever_the_door() {
        let on = Value::Bool(true);
        let write = ChangeWhat::Write(vec![
            (ON1.into(), on.clone()),
            ("LED".into(), Value::Integer(3)),
        ]);
        assert_eq!(
            asked(&write, false),
            [
                ask(ON1, Action::Write, Some("True")),
                ask("LED", Action::Write, Some("3"))
            ]
        );
        let transact = ChangeWhat::Transact {
            name: ON1.into(),
            value: on.clone(),
        };
        assert_eq!(
            asked(&transact, false),
            [
                ask(ON1, Action::Transact, Some("True")),
                ask(ON1, Action::Write, Some("True"))
            ]
        );
        let steps = ChangeWhat::Steps(vec![
            Step {
                label: "configure VSET1".into(),
                action: StepAction::Configure(station_protocol::Configure {
                    name: "VSET1".into(),
                    settings: Vec::new(),
                }),
            },
            Step {
                label: "write ON1".into(),
                action: StepAction::Write {
                    name: ON1.into(),
                    value: on,
                },
            },
        ]);
        // `channels/configure`: each step as what it sends.
        assert_eq!(
            asked(&steps, false),
            [
                ask("VSET1", Action::Configure, None),
                ask(ON1, Action::Write, Some("True"))
            ]
        );
        // A configuration file's load: the same, each step also asking `load_config`.
        assert_eq!(
            asked(&steps, true),
            [
                ask("VSET1", Action::LoadConfig, None),
                ask("VSET1", Action::Configure, None),
                ask(ON1, Action::LoadConfig, Some("True")),
                ask(ON1, Action::Write, Some("True"))
            ]
        );
    }

    #[test]
    fn a_bus_transaction_an_acquisition_and_a_reset_ask_their_own_actions() {
        let bus = ChangeWhat::Bus(station_protocol::BusRequest {
            channel: "0.ESH10000023.I2C09".into(),
            action: station_protocol::BusAction::Receive,
            address: 0x50,
            retries: 0,
            receive: 1,
            data: bytes::Bytes::new(),
            line: None,
        });
        assert_eq!(
            asked(&bus, false),
            [ask("0.ESH10000023.I2C09", Action::Bus, None)]
        );
        let sample = ChangeWhat::Sample {
            request: station_protocol::sample::SampleRequest {
                channel: "NR".into(),
                target: "VMON1".into(),
                count: 10,
                frame_samples: 0,
            },
            expected: Duration::from_millis(1),
        };
        assert_eq!(
            asked(&sample, false),
            [
                ask("NR", Action::Sample, None),
                ask("VMON1", Action::ReadHardware, None)
            ]
        );
        let reset = ChangeWhat::Reset {
            requester: "me".into(),
        };
        assert_eq!(asked(&reset, false), [ask("", Action::Reset, None)]);
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

    #[test]
    fn an_interlock_the_link_found_broken_is_refused_in_the_rules_words() {
        let needed = door_needed();
        let guard = interlocked_guard(None, &needed, Duration::from_millis(500));
        let cache = ValueCache::new();
        let at = Instant::now();
        cache.insert("Interlock.DOOR_CLOSED", Value::Bool(false), at, 1);
        let broken = guard
            .interlocks()
            .and_then(|interlocks| interlocks.first_broken(&cache, 1, at))
            .unwrap();
        let refusal = interlock_refusal(&needed, &broken).unwrap();
        assert_eq!(
            refusal.message,
            "forbidden: access rule \"door\" allows write on 0.4.ESH10000662.ON1 only while Interlock.DOOR_CLOSED is True, and it reads False; it was not sent"
        );
        assert_eq!(
            Err(refusal),
            interlocks_hold(&needed, &cache, 1, at, Duration::from_millis(500))
        );
        let carried = crate::link::GuardRefusal::from(interlock_refusal(&needed, &broken).unwrap());
        assert_eq!(
            carried.to_string(),
            interlock_refusal(&needed, &broken).unwrap().message
        );
        let elsewhere = InterlockBroken { index: 1, ..broken };
        assert_eq!(interlock_refusal(&needed, &elsewhere), None);
    }
}
