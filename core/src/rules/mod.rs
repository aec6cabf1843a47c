//! Per-channel access rules: who (user and host groups) may do what (an [`Action`]) to which
//! channels (channel groups by glob, module serial or direction), under which conditions (the
//! control lease held, an interlock channel's value). Pure: a rules file's text in, a compiled,
//! immutable [`Rules`] out (`file.rs` parses and names the line and key of every mistake,
//! `compile.rs` builds the matchers); decisions take no I/O and no lock beyond the per-channel
//! cache of which rules apply. Deny wins over allow; what no rule names gets the file's
//! default; every [`Decision`] names the rule that made it.
//!
//! A gateway reads one rules file for all its stations, one or several: a rule with
//! `stations = ["st1", ...]` (ids as the gateway gives its stations: a `[[station]]` table's,
//! or a one-station file's `station.id`) is in force only on those stations, a rule without
//! it on every one ([`Rules::compile_for_station`]). A
//! `stations` entry that cannot be a station id is a mistake of the file, named by line and key
//! as every other. A rule whose `stations` name none of the stations a gateway serves is in
//! force nowhere there; [`Rules::unserved`] lists it, so the gateway can say so.

mod compile;
mod file;

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use station_protocol::Value;

pub use compile::Rules;
pub use file::RulesError;

/// What a caller asks to do with a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A value served from the gateway's cache.
    ReadCache,
    /// A value read from the hardware.
    ReadHardware,
    Write,
    Transact,
    /// A channel's settings (`channels/configure`).
    Configure,
    /// A bus transaction through a bus channel.
    Bus,
    /// A NumericResult acquisition.
    Sample,
    /// Loading a configuration file that names the channel.
    LoadConfig,
    /// Saving a configuration file that names the channel.
    SaveConfig,
    /// Taking the control lease (decided over the station, not a channel: a rule naming it
    /// applies whatever its channel groups).
    Lease,
    /// Restarting the station's application (over the station, like `Lease`).
    Reset,
    /// Pressing the safe stop (`POST /v1/safe-stop`): ends whoever's lease and applies the
    /// safe state (over the station, like `Lease`).
    SafeStop,
}

impl Action {
    pub const ALL: [Action; 12] = [
        Action::ReadCache,
        Action::ReadHardware,
        Action::Write,
        Action::Transact,
        Action::Configure,
        Action::Bus,
        Action::Sample,
        Action::LoadConfig,
        Action::SaveConfig,
        Action::Lease,
        Action::Reset,
        Action::SafeStop,
    ];

    /// The word a rules file and `access/explain` use for it.
    pub fn word(self) -> &'static str {
        match self {
            Action::ReadCache => "read_cache",
            Action::ReadHardware => "read_hardware",
            Action::Write => "write",
            Action::Transact => "transact",
            Action::Configure => "configure",
            Action::Bus => "bus",
            Action::Sample => "sample",
            Action::LoadConfig => "load_config",
            Action::SaveConfig => "save_config",
            Action::Lease => "lease",
            Action::Reset => "reset",
            Action::SafeStop => "safe_stop",
        }
    }

    pub fn from_word(word: &str) -> Option<Action> {
        Action::ALL
            .into_iter()
            .find(|action| action.word().eq_ignore_ascii_case(word))
    }

    /// Whether the action is over the whole station rather than one channel.
    pub fn station_wide(self) -> bool {
        matches!(self, Action::Lease | Action::Reset | Action::SafeStop)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

/// Who asks: the API key's name or the Basic user (`None`: no identity, e.g. a legacy client),
/// the address the request came from, the group a front end puts everyone in (the legacy
/// listener's `access_group`), and whether the caller holds the control lease.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub name: Option<&'a str>,
    pub address: Option<IpAddr>,
    pub group: Option<&'a str>,
    pub holds_lease: bool,
}

/// What the rules know of a channel: its full name, its alias and the facts channel groups
/// select by. Built by the caller from the channel table's descriptor.
#[derive(Debug, Clone, Copy)]
pub struct ChannelFacts<'a> {
    pub name: &'a str,
    pub alias: &'a str,
    /// `in`, `out` or `inout`; `None` when the channel table does not know the channel.
    pub direction: Option<&'a str>,
}

impl<'a> ChannelFacts<'a> {
    /// The module's serial: the first part after the line (and slot) numbers, with the
    /// channel's own name after it: the third part of a module's channel
    /// (`0.4.ESH10000662.ON1`), the second of a base board's (`0.ESH10000023.UART01`); `None`
    /// for an engine-level name (`Engine.Uptime`).
    pub fn module_serial(&self) -> Option<&'a str> {
        let mut rest = self.name;
        let mut numbered = false;
        loop {
            let (part, after) = rest.split_once('.')?;
            if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                numbered = true;
                rest = after;
                continue;
            }
            return numbered.then_some(part);
        }
    }

    /// A channel the table does not know: only its name.
    pub fn named(name: &'a str) -> ChannelFacts<'a> {
        ChannelFacts {
            name,
            alias: "",
            direction: None,
        }
    }
}

/// Something a channel group selects by that matches no channel of the station's table: a
/// glob of `names`, a serial of `modules`, a direction, or the group as a whole (its criteria
/// together). Reported when the rules are loaded and the table is known, never refused: the
/// station may have other modules tomorrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmatched {
    /// The channel group's name (`[channels.NAME]`).
    pub group: String,
    /// `names`, `modules` or `directions`; `None`: the group as a whole.
    pub key: Option<&'static str>,
    /// The glob, serial or direction as written.
    pub entry: String,
}

impl fmt::Display for Unmatched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.key {
            Some(key) => write!(
                f,
                "channels.{}.{key}: \"{}\" matches no channel of the station",
                self.group, self.entry
            ),
            None => write!(
                f,
                "channels.{}: the group matches no channel of the station",
                self.group
            ),
        }
    }
}

/// A rule whose `stations` name none of the stations a gateway serves: in force nowhere there
/// (a mistyped id, or a file shared with other gateways). Not an error, since the same file may
/// serve other gateways, but reported at every load and shown beside the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnservedRule {
    /// The rule's name.
    pub rule: String,
    /// Its `stations`, as written.
    pub stations: Vec<String>,
}

impl fmt::Display for UnservedRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named: Vec<String> = self.stations.iter().map(|id| format!("{id:?}")).collect();
        write!(
            f,
            "rule \"{}\".stations: [{}] names no station this gateway serves; the rule is in force nowhere here",
            self.rule,
            named.join(", ")
        )
    }
}

/// A condition on a channel's value: the action is allowed only while `channel` reads `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interlock {
    /// The rule that set it.
    pub rule: Arc<str>,
    pub channel: Arc<str>,
    /// The value as text (`True`, `3`, `OPEN`), compared with a value's rendering.
    pub value: Arc<str>,
}

impl Interlock {
    /// Whether `seen` (the interlock channel's value now) lets the action through.
    pub fn holds(&self, seen: &Value) -> bool {
        let rendered = seen.render();
        rendered.eq_ignore_ascii_case(&self.value)
    }
}

/// Why a decision came out as it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// An allow rule names the action (its conditions, if any, in `interlocks`).
    Allowed,
    /// A deny rule names it.
    Denied,
    /// No rule names it: the file's default.
    Default { allowed: bool },
    /// The rule allows it only while holding the control lease, and the caller does not.
    LeaseNeeded,
}

/// A decision and the rule that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The rule's name; `default` for the file's default.
    pub rule: Arc<str>,
    pub reason: Reason,
    /// For an allowed decision: the interlocks it still needs, checked by the caller at
    /// admission and again by the send guard.
    pub interlocks: Vec<Interlock>,
}

impl Decision {
    /// Words for a refusal of `action` on `channel` (who asked is the caller's to say).
    pub fn refusal(&self, action: Action, channel: &str) -> String {
        match &self.reason {
            Reason::Denied => format!("access rule \"{}\" denies {action} on {channel}", self.rule),
            Reason::Default { .. } => {
                format!("no access rule allows {action} on {channel} (the rules' default is deny)")
            }
            Reason::LeaseNeeded => format!(
                "access rule \"{}\" allows {action} on {channel} only while holding the control lease",
                self.rule
            ),
            Reason::Allowed => {
                format!("access rule \"{}\" allows {action} on {channel}", self.rule)
            }
        }
    }
}

/// A refusal by the access rules: the channel, the rule, and when an interlock is why, its
/// channel and the value it had (`None`: it could not be read). Its words are the answer's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub channel: String,
    pub rule: Arc<str>,
    pub action: Action,
    /// The interlock's channel and what it read, when that is why.
    pub interlock: Option<Box<(String, Option<String>)>>,
    pub message: String,
}

impl Refusal {
    /// The refusal of a decision that does not allow.
    pub fn of(decision: &Decision, action: Action, channel: &str) -> Refusal {
        Refusal {
            channel: channel.to_owned(),
            rule: decision.rule.clone(),
            action,
            interlock: None,
            message: format!("forbidden: {}", decision.refusal(action, channel)),
        }
    }

    /// The refusal of an action whose interlock does not hold: `seen` is the interlock
    /// channel's value (`None`: no value recent enough to trust).
    pub fn interlock(
        interlock: &Interlock,
        action: Action,
        channel: &str,
        seen: Option<String>,
    ) -> Refusal {
        let state = match &seen {
            Some(value) => format!("reads {value}"),
            None => "has no value read recently enough to trust".to_owned(),
        };
        Refusal {
            channel: channel.to_owned(),
            rule: interlock.rule.clone(),
            action,
            interlock: Some(Box::new((interlock.channel.to_string(), seen))),
            message: format!(
                "forbidden: access rule \"{}\" allows {action} on {channel} only while {} is {}, and it {state}; it was not sent",
                interlock.rule, interlock.channel, interlock.value
            ),
        }
    }
}

/// The name the default's decisions carry.
pub const DEFAULT_RULE: &str = "default";

#[cfg(test)]
mod tests;
