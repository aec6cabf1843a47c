//! A rules file's text compiled into [`Rules`] ([`Rules::compile`]): the default, the groups
//! resolved to indices and their globs and CIDRs compiled, every rule checked against them
//! (its groups, its action, its conditions, its stations) and kept when in force on the
//! station compiled for.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use dashmap::DashMap;
use globset::{GlobBuilder, GlobSetBuilder};
use ipnet::IpNet;
use toml::Spanned;

use super::{ChannelGroup, ChannelRules, GroupSet, Rule, Rules};
use crate::config::lab::id_problem;
use crate::rules::file::{RawRules, RulesError, line_of, parse};
use crate::rules::{Action, DEFAULT_RULE, Interlock};

impl Rules {
    /// Parses and compiles `text` as rules version `version`; the first mistake names its line
    /// and key, and nothing is half-built.
    pub fn compile(text: &str, version: u64) -> Result<Rules, RulesError> {
        Rules::compile_for_station(text, version, None)
    }

    /// As [`compile`](Rules::compile), for one station (the gateway compiles for each of its
    /// stations, however many it serves): a rule with `stations = [...]` is kept only when they
    /// name `station` (ids compared in any letter case, as two stations' ids never differ only
    /// in case); a rule without `stations` is kept for every station. `None` keeps every rule,
    /// whatever its `stations` (a reader that guards no station, e.g. a check of the file).
    /// Every rule is checked, those of other stations too: a file is good or bad whichever
    /// station reads it.
    pub fn compile_for_station(
        text: &str,
        version: u64,
        station: Option<&str>,
    ) -> Result<Rules, RulesError> {
        let raw = parse(text)?;
        build(text, raw, version, station)
    }
}

/// A mistake of the file, on `at`'s line, under `key`.
fn error(text: &str, at: &Spanned<impl Sized>, key: impl Into<String>, why: String) -> RulesError {
    RulesError {
        line: line_of(text, at.span().start),
        key: key.into(),
        why,
    }
}

/// `raw` (parsed from `text`) built into the rules of version `version` for `station`.
fn build(
    text: &str,
    raw: RawRules,
    version: u64,
    station: Option<&str>,
) -> Result<Rules, RulesError> {
    let default_allows = match &raw.default {
        None => false,
        Some(word) => match word.get_ref().as_str() {
            "allow" => true,
            "deny" => false,
            other => {
                return Err(error(
                    text,
                    word,
                    "default",
                    format!("\"{other}\" is neither \"allow\" nor \"deny\""),
                ));
            }
        },
    };
    // User and host groups share one namespace of group names, so a rule's `users` and
    // `hosts` cannot mix them up silently.
    let mut group_names: HashMap<String, usize> = HashMap::new();
    let mut user_groups: HashMap<String, GroupSet> = HashMap::new();
    for (index, (group, members)) in raw.users.iter().enumerate() {
        group_names.insert(group.get_ref().clone(), index);
        for member in members {
            if member.get_ref().is_empty() {
                return Err(error(
                    text,
                    member,
                    format!("users.{}", group.get_ref()),
                    "an empty user name".into(),
                ));
            }
            user_groups
                .entry(member.get_ref().clone())
                .or_default()
                .insert(index);
        }
    }
    let mut host_names: HashMap<String, usize> = HashMap::new();
    let mut host_groups = Vec::new();
    for (index, (group, members)) in raw.hosts.iter().enumerate() {
        if group_names.contains_key(group.get_ref()) {
            return Err(error(
                text,
                group,
                format!("hosts.{}", group.get_ref()),
                "a user group has this name too; give the host group another".into(),
            ));
        }
        host_names.insert(group.get_ref().clone(), index);
        let mut nets = Vec::new();
        for member in members {
            let written = member.get_ref().trim();
            let net = written
                .parse::<IpNet>()
                .or_else(|_| written.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    error(
                        text,
                        member,
                        format!("hosts.{}", group.get_ref()),
                        format!("\"{written}\" is not a CIDR (10.0.0.0/8) or an address"),
                    )
                })?;
            nets.push(net);
        }
        host_groups.push(nets);
    }
    let mut channel_names: HashMap<String, usize> = HashMap::new();
    let mut channel_groups = Vec::new();
    for (group, criteria) in &raw.channels {
        let key = format!("channels.{}", group.get_ref());
        if criteria.names.is_empty()
            && criteria.modules.is_empty()
            && criteria.directions.is_empty()
        {
            return Err(error(
                text,
                group,
                key,
                "the group names no channel: give names, modules or directions (names = [\"*\"] for every channel)".into(),
            ));
        }
        let mut globs = Vec::new();
        let names = if criteria.names.is_empty() {
            None
        } else {
            let mut set = GlobSetBuilder::new();
            for glob in &criteria.names {
                let compiled = GlobBuilder::new(glob.get_ref())
                    .literal_separator(false)
                    .build()
                    .map_err(|why| error(text, glob, format!("{key}.names"), why.to_string()))?;
                globs.push((glob.get_ref().clone(), compiled.compile_matcher()));
                set.add(compiled);
            }
            Some(
                set.build()
                    .map_err(|why| error(text, group, format!("{key}.names"), why.to_string()))?,
            )
        };
        for direction in &criteria.directions {
            if !["in", "out", "inout"].contains(&direction.get_ref().to_ascii_lowercase().as_str())
            {
                return Err(error(
                    text,
                    direction,
                    format!("{key}.directions"),
                    format!("\"{}\" is not in, out or inout", direction.get_ref()),
                ));
            }
        }
        channel_names.insert(group.get_ref().clone(), channel_groups.len());
        channel_groups.push(ChannelGroup {
            name: group.get_ref().clone(),
            names,
            globs,
            modules: criteria
                .modules
                .iter()
                .map(|m| m.get_ref().clone())
                .collect(),
            directions: criteria
                .directions
                .iter()
                .map(|d| d.get_ref().to_ascii_lowercase())
                .collect(),
        });
    }
    let mut rules = Vec::new();
    let mut stations_named: Vec<String> = Vec::new();
    let mut scoped = Vec::new();
    let mut seen_names: HashMap<String, ()> = HashMap::new();
    for raw_rule in &raw.rule {
        let name = raw_rule.name.get_ref().trim();
        let key = format!("rule \"{name}\"");
        if name.is_empty() || name == DEFAULT_RULE {
            return Err(error(
                text,
                &raw_rule.name,
                "rule.name",
                format!("a rule needs a name of its own (not empty, not \"{DEFAULT_RULE}\")"),
            ));
        }
        if seen_names.insert(name.to_owned(), ()).is_some() {
            return Err(error(
                text,
                &raw_rule.name,
                "rule.name",
                format!("two rules are named \"{name}\""),
            ));
        }
        let (words, deny) = match (raw_rule.allow.is_empty(), raw_rule.deny.is_empty()) {
            (false, true) => (&raw_rule.allow, false),
            (true, false) => (&raw_rule.deny, true),
            _ => {
                return Err(error(
                    text,
                    &raw_rule.name,
                    format!("{key}.allow"),
                    "a rule has either allow = [...] or deny = [...] (one of them, not empty)"
                        .into(),
                ));
            }
        };
        let mut actions = 0u32;
        let mut station_wide_only = true;
        for word in words {
            let action = Action::from_word(word.get_ref()).ok_or_else(|| {
                let known: Vec<&str> = Action::ALL.iter().map(|a| a.word()).collect();
                error(
                    text,
                    word,
                    format!("{key}.{}", if deny { "deny" } else { "allow" }),
                    format!(
                        "\"{}\" is not an action; the actions: {}",
                        word.get_ref(),
                        known.join(", ")
                    ),
                )
            })?;
            station_wide_only &= action.station_wide();
            actions |= 1 << action.index();
        }
        let mut channels = Vec::new();
        for group in &raw_rule.channels {
            let index = channel_names.get(group.get_ref()).ok_or_else(|| {
                error(
                    text,
                    group,
                    format!("{key}.channels"),
                    format!("no channel group \"{}\" in [channels]", group.get_ref()),
                )
            })?;
            channels.push(*index);
        }
        if channels.is_empty() && !station_wide_only {
            return Err(error(
                text,
                &raw_rule.name,
                format!("{key}.channels"),
                "the rule names no channel group".into(),
            ));
        }
        let mut users = GroupSet::default();
        for group in &raw_rule.users {
            let index = group_names.get(group.get_ref()).ok_or_else(|| {
                error(
                    text,
                    group,
                    format!("{key}.users"),
                    format!("no user group \"{}\" in [users]", group.get_ref()),
                )
            })?;
            users.insert(*index);
        }
        let mut hosts = GroupSet::default();
        for group in &raw_rule.hosts {
            let index = host_names.get(group.get_ref()).ok_or_else(|| {
                error(
                    text,
                    group,
                    format!("{key}.hosts"),
                    format!("no host group \"{}\" in [hosts]", group.get_ref()),
                )
            })?;
            hosts.insert(*index);
        }
        let interlock = match &raw_rule.interlock {
            None => None,
            Some(spanned) => {
                let raw = spanned.get_ref();
                if deny {
                    return Err(error(
                        text,
                        spanned,
                        format!("{key}.interlock"),
                        "an interlock is a condition of an allow rule (a deny rule needs none)"
                            .into(),
                    ));
                }
                if raw.channel.trim().is_empty() || raw.value.trim().is_empty() {
                    return Err(error(
                        text,
                        spanned,
                        format!("{key}.interlock"),
                        "an interlock needs a channel and a value".into(),
                    ));
                }
                Some(Interlock {
                    rule: name.into(),
                    channel: raw.channel.trim().into(),
                    value: raw.value.trim().into(),
                })
            }
        };
        let mut in_force_here = true;
        if let Some(stations) = &raw_rule.stations {
            if stations.get_ref().is_empty() {
                return Err(error(
                    text,
                    stations,
                    format!("{key}.stations"),
                    "the rule names no station: leave `stations` out for a rule of every station"
                        .into(),
                ));
            }
            for id in stations.get_ref() {
                if let Some(problem) = id_problem(id.get_ref()) {
                    return Err(error(
                        text,
                        id,
                        format!("{key}.stations"),
                        format!("{:?} cannot name a station: {problem}", id.get_ref()),
                    ));
                }
                stations_named.push(id.get_ref().clone());
            }
            scoped.push((
                name.to_owned(),
                stations
                    .get_ref()
                    .iter()
                    .map(|id| id.get_ref().clone())
                    .collect(),
            ));
            in_force_here = station.is_none_or(|here| {
                stations
                    .get_ref()
                    .iter()
                    .any(|id| id.get_ref().eq_ignore_ascii_case(here))
            });
        }
        if !in_force_here {
            continue;
        }
        rules.push(Rule {
            name: name.into(),
            channels,
            users,
            hosts,
            actions,
            deny,
            lease: raw_rule.lease,
            value: raw_rule
                .value
                .as_ref()
                .map(|v| v.get_ref().trim().to_owned()),
            interlock,
        });
    }
    stations_named.sort();
    stations_named.dedup();
    let mut station_rules: ChannelRules = Default::default();
    for (index, rule) in rules.iter().enumerate() {
        for action in Action::ALL.into_iter().filter(|a| a.station_wide()) {
            if rule.actions & (1 << action.index()) != 0 {
                station_rules[action.index()].push(index as u32);
            }
        }
    }
    Ok(Rules {
        version,
        default_allows,
        interlock_max_age: Duration::from_millis(raw.interlock_max_age_ms.unwrap_or(1000)),
        interlock_poll: Duration::from_millis(raw.interlock_poll_ms.unwrap_or(100).max(10)),
        user_groups,
        host_groups,
        group_names,
        channel_groups,
        rules,
        station_rules,
        station: station.map(str::to_owned),
        stations_named,
        scoped,
        per_channel: DashMap::new(),
    })
}
