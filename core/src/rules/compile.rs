//! The compiled rules: groups resolved to indices, globs to one `GlobSet` per channel group,
//! CIDRs to `IpNet`s; per channel (by full name and alias), which rules apply to each action,
//! worked out once and cached for the life of this [`Rules`] value (a reload is a new value,
//! so the cache is per rules version).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use globset::{GlobMatcher, GlobSet};
use ipnet::IpNet;
use station_protocol::Value;

mod build;
use super::{Action, ChannelFacts, DEFAULT_RULE, Decision, Interlock, Reason, Subject, Unmatched};

/// A set of group indices, one bit each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct GroupSet(Vec<u64>);

impl GroupSet {
    fn insert(&mut self, index: usize) {
        let word = index / 64;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (index % 64);
    }

    fn intersects(&self, other: &GroupSet) -> bool {
        self.0.iter().zip(&other.0).any(|(a, b)| a & b != 0)
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|word| *word == 0)
    }
}

struct ChannelGroup {
    /// `[channels.NAME]`'s name.
    name: String,
    /// Matches the full name or the alias; `None`: any name.
    names: Option<GlobSet>,
    /// Each glob of `names` as written and alone, to say which matches no channel.
    globs: Vec<(String, GlobMatcher)>,
    modules: Vec<String>,
    directions: Vec<String>,
}

impl ChannelGroup {
    fn contains(&self, channel: &ChannelFacts<'_>) -> bool {
        if let Some(names) = &self.names
            && !names.is_match(channel.name)
            && (channel.alias.is_empty() || !names.is_match(channel.alias))
        {
            return false;
        }
        if !self.modules.is_empty()
            && !channel
                .module_serial()
                .is_some_and(|serial| self.modules.iter().any(|m| m == serial))
        {
            return false;
        }
        if !self.directions.is_empty()
            && !channel.direction.is_some_and(|d| {
                self.directions
                    .iter()
                    .any(|want| want.eq_ignore_ascii_case(d))
            })
        {
            return false;
        }
        true
    }
}

struct Rule {
    name: Arc<str>,
    /// Channel group indices.
    channels: Vec<usize>,
    /// Empty: any user.
    users: GroupSet,
    /// Empty: any address.
    hosts: GroupSet,
    /// One bit per [`Action`].
    actions: u32,
    deny: bool,
    lease: bool,
    value: Option<String>,
    interlock: Option<Interlock>,
}

impl Rule {
    fn applies_to(&self, who: &Principal) -> bool {
        (self.users.is_empty() || self.users.intersects(&who.users))
            && (self.hosts.is_empty() || self.hosts.intersects(&who.hosts))
    }

    fn applies_to_value(&self, written: Option<&Value>) -> bool {
        match (&self.value, written) {
            (None, _) => true,
            (Some(wanted), Some(value)) => value.render().eq_ignore_ascii_case(wanted),
            // A value rule says nothing of an action without a value.
            (Some(_), None) => false,
        }
    }
}

/// The caller as the rules see it: its user and host groups, resolved once per request.
#[derive(Debug, Clone, Default)]
pub struct Principal {
    users: GroupSet,
    hosts: GroupSet,
    holds_lease: bool,
}

/// Which rules (indices, in file order) apply to one channel, per action.
type ChannelRules = [Vec<u32>; Action::ALL.len()];

/// A channel's alias and direction when its rules were worked out, and those rules.
type WorkedOut = (Box<str>, Option<Box<str>>, Arc<ChannelRules>);

/// A rules file, compiled. Immutable; a reload builds a new one.
pub struct Rules {
    version: u64,
    default_allows: bool,
    interlock_max_age: Duration,
    interlock_poll: Duration,
    user_groups: HashMap<String, GroupSet>,
    /// Host group index → its networks.
    host_groups: Vec<Vec<IpNet>>,
    group_names: HashMap<String, usize>,
    channel_groups: Vec<ChannelGroup>,
    rules: Vec<Rule>,
    /// The rules of station-wide actions (lease, reset), whatever their channels.
    station_rules: ChannelRules,
    /// The station these rules were compiled for (`None`: every rule, whatever its
    /// `stations`).
    station: Option<String>,
    /// Every station id a rule's `stations` names, the whole file's, sorted, once each.
    stations_named: Vec<String>,
    /// Every rule of the file with `stations` (those not in force here too), in file order:
    /// its name and its `stations` as written.
    scoped: Vec<(String, Vec<String>)>,
    /// Per channel (by full name, with the alias and direction it had): which rules apply.
    per_channel: DashMap<Box<str>, WorkedOut>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("version", &self.version)
            .field("station", &self.station)
            .field("rules", &self.rules.len())
            .finish_non_exhaustive()
    }
}

impl Rules {
    /// The station these rules were compiled for (`None`: every rule is in force).
    pub fn station(&self) -> Option<&str> {
        self.station.as_deref()
    }

    /// Every station id the file's rules name in `stations` (those of rules not in force here
    /// too), sorted, once each: the gateway may warn of one it does not serve.
    pub fn stations_named(&self) -> &[String] {
        &self.stations_named
    }

    /// The rules of the file whose `stations` name none of `served` (ids compared in any letter
    /// case), in file order: in force on no station of a gateway serving `served`.
    pub fn unserved<S: AsRef<str>>(&self, served: &[S]) -> Vec<super::UnservedRule> {
        self.scoped
            .iter()
            .filter(|(_, stations)| {
                !stations.iter().any(|id| {
                    served
                        .iter()
                        .any(|here| here.as_ref().eq_ignore_ascii_case(id))
                })
            })
            .map(|(rule, stations)| super::UnservedRule {
                rule: rule.clone(),
                stations: stations.clone(),
            })
            .collect()
    }

    /// No rules: everything allowed (access rules off).
    pub fn allow_all(version: u64) -> Rules {
        Rules::compile("default = \"allow\"", version).expect("the allow-all rules compile")
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// How old an interlock channel's value may be for the send guard to trust it.
    pub fn interlock_max_age(&self) -> Duration {
        self.interlock_max_age
    }

    /// How often the interlock channels are read.
    pub fn interlock_poll(&self) -> Duration {
        self.interlock_poll
    }

    /// What of the channel groups matches no channel of `channels` (the station's table,
    /// each channel's facts): each glob, module serial and direction alone, and each group as
    /// a whole; the groups in name order.
    pub fn unmatched(&self, channels: &[ChannelFacts<'_>]) -> Vec<Unmatched> {
        let mut unmatched = Vec::new();
        for group in &self.channel_groups {
            let mut missing = |key: Option<&'static str>, entry: &str| {
                unmatched.push(Unmatched {
                    group: group.name.clone(),
                    key,
                    entry: entry.to_owned(),
                });
            };
            for (glob, matcher) in &group.globs {
                if !channels.iter().any(|channel| {
                    matcher.is_match(channel.name)
                        || (!channel.alias.is_empty() && matcher.is_match(channel.alias))
                }) {
                    missing(Some("names"), glob);
                }
            }
            for module in &group.modules {
                if !channels
                    .iter()
                    .any(|channel| channel.module_serial() == Some(module.as_str()))
                {
                    missing(Some("modules"), module);
                }
            }
            for direction in &group.directions {
                if !channels
                    .iter()
                    .any(|channel| channel.direction == Some(direction.as_str()))
                {
                    missing(Some("directions"), direction);
                }
            }
            if !channels.iter().any(|channel| group.contains(channel)) {
                missing(None, "");
            }
        }
        unmatched
    }

    /// Whether anyone at all may ever do `action`: the default allows, or an allow rule names
    /// it (a rules file written before `safe_stop` existed names it nowhere).
    pub fn anyone_may(&self, action: Action) -> bool {
        self.default_allows
            || self
                .rules
                .iter()
                .any(|rule| !rule.deny && rule.actions & (1 << action.index()) != 0)
    }

    /// Every channel an interlock names, once each.
    pub fn interlock_channels(&self) -> Vec<String> {
        let mut channels: Vec<String> = self
            .rules
            .iter()
            .filter_map(|rule| rule.interlock.as_ref().map(|i| i.channel.to_string()))
            .collect();
        channels.sort();
        channels.dedup();
        channels
    }

    /// The caller's groups, resolved once for all its decisions.
    pub fn principal(&self, subject: &Subject<'_>) -> Principal {
        let mut users = GroupSet::default();
        if let Some(name) = subject.name
            && let Some(groups) = self.user_groups.get(name)
        {
            users = groups.clone();
        }
        if let Some(group) = subject.group
            && let Some(&index) = self.group_names.get(group)
        {
            users.insert(index);
        }
        let mut hosts = GroupSet::default();
        if let Some(address) = subject.address {
            let address = canonical(address);
            for (index, nets) in self.host_groups.iter().enumerate() {
                if nets.iter().any(|net| net.contains(&address)) {
                    hosts.insert(index);
                }
            }
        }
        Principal {
            users,
            hosts,
            holds_lease: subject.holds_lease,
        }
    }

    /// Whether `who` may do `action` to `channel` (writing `written`, for a write or transact).
    pub fn decide(
        &self,
        who: &Principal,
        channel: &ChannelFacts<'_>,
        action: Action,
        written: Option<&Value>,
    ) -> Decision {
        if action.station_wide() {
            return self.decide_over(&self.station_rules[action.index()], who, written);
        }
        let applying = self.channel_rules(channel);
        self.decide_over(&applying[action.index()], who, written)
    }

    fn decide_over(
        &self,
        candidates: &[u32],
        who: &Principal,
        written: Option<&Value>,
    ) -> Decision {
        let mut allowed_by: Option<&Rule> = None;
        let mut needs_lease: Option<&Rule> = None;
        let mut interlocks = Vec::new();
        for &index in candidates {
            let rule = &self.rules[index as usize];
            if !rule.applies_to(who) || !rule.applies_to_value(written) {
                continue;
            }
            if rule.deny {
                return Decision {
                    allowed: false,
                    rule: rule.name.clone(),
                    reason: Reason::Denied,
                    interlocks: Vec::new(),
                };
            }
            // Conditions add up: every allow rule that applies adds its own.
            if rule.lease && !who.holds_lease {
                needs_lease.get_or_insert(rule);
            }
            if let Some(interlock) = &rule.interlock {
                interlocks.push(interlock.clone());
            }
            allowed_by.get_or_insert(rule);
        }
        if let Some(rule) = needs_lease {
            return Decision {
                allowed: false,
                rule: rule.name.clone(),
                reason: Reason::LeaseNeeded,
                interlocks: Vec::new(),
            };
        }
        match allowed_by {
            Some(rule) => Decision {
                allowed: true,
                rule: rule.name.clone(),
                reason: Reason::Allowed,
                interlocks,
            },
            None => Decision {
                allowed: self.default_allows,
                rule: DEFAULT_RULE.into(),
                reason: Reason::Default {
                    allowed: self.default_allows,
                },
                interlocks: Vec::new(),
            },
        }
    }

    /// Which rules apply to `channel`, per action: worked out once per channel.
    fn channel_rules(&self, channel: &ChannelFacts<'_>) -> Arc<ChannelRules> {
        // Looked up without allocating: the key is built only on a miss.
        if let Some(found) = self.lookup(channel) {
            return found;
        }
        let mut applying: ChannelRules = Default::default();
        let groups: Vec<bool> = self
            .channel_groups
            .iter()
            .map(|group| group.contains(channel))
            .collect();
        for (index, rule) in self.rules.iter().enumerate() {
            if !rule.channels.iter().any(|&group| groups[group]) {
                continue;
            }
            for action in Action::ALL {
                if rule.actions & (1 << action.index()) != 0 {
                    applying[action.index()].push(index as u32);
                }
            }
        }
        let applying = Arc::new(applying);
        self.per_channel.insert(
            channel.name.into(),
            (
                channel.alias.into(),
                channel.direction.map(Into::into),
                applying.clone(),
            ),
        );
        applying
    }

    fn lookup(&self, channel: &ChannelFacts<'_>) -> Option<Arc<ChannelRules>> {
        let entry = self.per_channel.get(channel.name)?;
        let (alias, direction, applying) = entry.value();
        // A channel whose alias or direction changed since is worked out again.
        (**alias == *channel.alias && direction.as_deref() == channel.direction)
            .then(|| applying.clone())
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(address),
        v4 => v4,
    }
}
