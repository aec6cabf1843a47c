//! The access rules in force (`[access] rules`), the shell around the pure `rules` core: the
//! file read and compiled whole, swapped atomically on reload (SIGHUP, or the file's mtime
//! changing, polled every second), a bad file refused with its line and key while the rules in
//! force stay; the refusals counted per rule for `/metrics`. Off (no checks at all) without a
//! rules file.
//!
//! The gateway loads the one file once per station it serves, for that station's id
//! ([`AccessRules::load_for_station`]), however many stations it serves: each station's rules
//! are those of the file without `stations` and those whose `stations = [...]` name it, and
//! every reload keeps to that station. A rule whose `stations` name no station the gateway
//! serves is in force nowhere: every load and reload warns of it, and
//! [`AccessRules::unserved`] lists it for `v1/access/explain`, the status page and
//! `v1/stations`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use station_protocol::Direction;

use crate::link::{ChannelTable, Forbidden, GuardRefusal, StationInfo};
use crate::rules::{Action, ChannelFacts, Refusal, Rules, RulesError, Subject, Unmatched};

/// The rules' view of `name` from the channel table (only its name when the table lacks it).
pub fn channel_facts<'a>(table: &'a ChannelTable, name: &'a str) -> ChannelFacts<'a> {
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

/// Why a rules file could not be put in force.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("access rules {}: cannot be read: {error}", .path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{} ({})", .error, .path.display())]
    Invalid { path: PathBuf, error: RulesError },
}

struct Live {
    path: PathBuf,
    /// The station whose rules these are (`None`: every rule, whatever its `stations`).
    station: Option<String>,
    /// Every station the gateway serves: a rule naming none of them is reported.
    served: Vec<String>,
    current: RwLock<Arc<Rules>>,
    /// Held by a reload from reading the file to swapping its rules in: two reloads (SIGHUP
    /// and the mtime poll) never take the same version, and a refused file takes none.
    reloading: Mutex<()>,
    /// Told after every reload that put new rules in force (for [`report_unmatched`]).
    reloaded: tokio::sync::Notify,
    /// Refusals per rule name, since start.
    refusals: Mutex<BTreeMap<String, u64>>,
    /// The file's mtime when it was last read.
    read_mtime: Mutex<Option<SystemTime>>,
}

/// Who asks, as a front end knows it: owned, so it travels with a change or a read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Who {
    /// The API key's name or the Basic user.
    pub name: Option<String>,
    pub address: Option<IpAddr>,
    /// The group a front end puts everyone in (the legacy listener's `access_group`).
    pub group: Option<String>,
    pub holds_lease: bool,
}

impl Who {
    pub fn subject(&self) -> Subject<'_> {
        Subject {
            name: self.name.as_deref(),
            address: self.address,
            group: self.group.as_deref(),
            holds_lease: self.holds_lease,
        }
    }
}

/// The rules in force; cheap to clone. [`AccessRules::off`] checks nothing.
#[derive(Clone, Default)]
pub struct AccessRules {
    live: Option<Arc<Live>>,
    /// The user group the legacy listener's clients (no identity) are in.
    legacy_group: Option<Arc<str>>,
}

impl std::fmt::Debug for AccessRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessRules")
            .field("on", &self.live.is_some())
            .field("station", &self.station())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_and_compile(
    path: &Path,
    version: u64,
    station: Option<&str>,
    served: &[String],
) -> Result<Rules, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|error| LoadError::Io {
        path: path.to_owned(),
        error,
    })?;
    let rules = Rules::compile_for_station(&text, version, station).map_err(|error| {
        LoadError::Invalid {
            path: path.to_owned(),
            error,
        }
    })?;
    if !rules.anyone_may(Action::SafeStop) {
        warn!(
            "access rules {}{} (version {version}): no rule allows safe_stop and the default is deny: nobody may press the safe stop (POST /v1/safe-stop); give it to those who must ([[rule]] users = [...] allow = [\"safe_stop\"])",
            path.display(),
            on_station(station)
        );
    }
    for unserved in rules.unserved(served) {
        warn!(
            "access rules {}{} (version {version}): {unserved} (it serves {})",
            path.display(),
            on_station(station),
            served.join(", ")
        );
    }
    Ok(rules)
}

/// ` for station ID` in the log, or nothing without a station.
fn on_station(station: Option<&str>) -> String {
    station.map_or_else(String::new, |id| format!(" for station {id}"))
}

impl AccessRules {
    /// No rules: every front end's access is its role's, as without a rules file.
    pub fn off() -> AccessRules {
        AccessRules::default()
    }

    /// The rules of `path`, compiled, every one of them whatever its `stations`
    /// ([`load_for_station`](Self::load_for_station) with `None`); the gateway does not start
    /// with a bad file.
    pub fn load(path: &Path) -> Result<AccessRules, LoadError> {
        AccessRules::load_for_station(path, None, &[])
    }

    /// The rules of `path` in force on `station`: those without `stations` and those whose
    /// `stations` name it ([`Rules::compile_for_station`]); `None`: every rule, as
    /// [`load`](Self::load). `served` is every station the gateway serves: a rule whose
    /// `stations` name none of them is logged at this load and every reload, and listed by
    /// [`unserved`](Self::unserved). Every [`reload`](Self::reload) keeps to the same station.
    /// The whole file is checked whichever station loads it.
    pub fn load_for_station(
        path: &Path,
        station: Option<&str>,
        served: &[String],
    ) -> Result<AccessRules, LoadError> {
        let read_mtime = mtime(path);
        let rules = read_and_compile(path, 1, station, served)?;
        info!(
            "access rules {}{}: {} rules in force (version 1)",
            path.display(),
            on_station(station),
            rules.rule_count()
        );
        Ok(AccessRules {
            live: Some(Arc::new(Live {
                path: path.to_owned(),
                station: station.map(str::to_owned),
                served: served.to_vec(),
                current: RwLock::new(Arc::new(rules)),
                reloading: Mutex::default(),
                reloaded: tokio::sync::Notify::new(),
                refusals: Mutex::default(),
                read_mtime: Mutex::new(read_mtime),
            })),
            legacy_group: None,
        })
    }

    /// Rules from text (tests): as [`AccessRules::load`] without the file.
    pub fn from_rules(rules: Rules) -> AccessRules {
        AccessRules {
            live: Some(Arc::new(Live {
                path: PathBuf::new(),
                station: rules.station().map(str::to_owned),
                served: Vec::new(),
                current: RwLock::new(Arc::new(rules)),
                reloading: Mutex::default(),
                reloaded: tokio::sync::Notify::new(),
                refusals: Mutex::default(),
                read_mtime: Mutex::new(None),
            })),
            legacy_group: None,
        }
    }

    /// The same rules with the legacy listener's clients in `group`.
    pub fn with_legacy_group(mut self, group: Option<&str>) -> AccessRules {
        self.legacy_group = group.filter(|g| !g.is_empty()).map(Into::into);
        self
    }

    pub fn legacy_group(&self) -> Option<&str> {
        self.legacy_group.as_deref()
    }

    pub fn enabled(&self) -> bool {
        self.live.is_some()
    }

    /// The station these rules were loaded for (`None`: off, or every rule whatever its
    /// `stations`).
    pub fn station(&self) -> Option<&str> {
        self.live.as_ref()?.station.as_deref()
    }

    /// The rules in force whose `stations` name no station this gateway serves (none while
    /// off, or loaded without the stations served): in force nowhere here.
    pub fn unserved(&self) -> Vec<crate::rules::UnservedRule> {
        match (&self.live, self.current()) {
            (Some(live), Some(rules)) if !live.served.is_empty() => rules.unserved(&live.served),
            _ => Vec::new(),
        }
    }

    /// [`unserved`](Self::unserved), each as the load's warning says it: for
    /// `v1/access/explain`, `status.json` and `v1/stations` (`rulesForOtherStations`).
    pub fn unserved_said(&self) -> Vec<String> {
        self.unserved().iter().map(ToString::to_string).collect()
    }

    /// The rules in force now (`None`: off). One read lock, held only to clone the `Arc`:
    /// a decision uses one whole version, never half of a reload.
    pub fn current(&self) -> Option<Arc<Rules>> {
        let live = self.live.as_ref()?;
        Some(
            live.current
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        )
    }

    /// Reads the file again and puts it in force whole; a bad file is refused (its line and
    /// key in the error) and the rules in force stay. Returns the new version: the one in
    /// force plus one (a refused file takes no version).
    pub fn reload(&self) -> Result<u64, LoadError> {
        let Some(live) = &self.live else {
            return Ok(0);
        };
        let _reloading = lock(&live.reloading);
        let seen = mtime(&live.path);
        *lock(&live.read_mtime) = seen;
        let version = self.version() + 1;
        let rules = read_and_compile(&live.path, version, live.station.as_deref(), &live.served)?;
        let count = rules.rule_count();
        *live
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(rules);
        info!(
            "access rules {}{}: reloaded, {count} rules in force (version {version})",
            live.path.display(),
            on_station(live.station.as_deref())
        );
        live.reloaded.notify_one();
        Ok(version)
    }

    /// Swaps in rules compiled elsewhere (tests), as a reload does.
    pub fn replace(&self, rules: Rules) {
        if let Some(live) = &self.live {
            *live
                .current
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(rules);
        }
    }

    /// Counts one refusal by `rule`.
    pub fn count_refusal(&self, rule: &str) {
        if let Some(live) = &self.live {
            *lock(&live.refusals).entry(rule.to_owned()).or_default() += 1;
        }
    }

    /// Refusals per rule since start, for `/metrics`.
    pub fn refusals(&self) -> Vec<(String, u64)> {
        match &self.live {
            Some(live) => lock(&live.refusals)
                .iter()
                .map(|(rule, count)| (rule.clone(), *count))
                .collect(),
            None => Vec::new(),
        }
    }

    /// The version in force (0: off).
    pub fn version(&self) -> u64 {
        self.current().map_or(0, |rules| rules.version())
    }

    /// Whether the file changed since it was last read.
    fn file_changed(&self) -> bool {
        let Some(live) = &self.live else {
            return false;
        };
        let now = mtime(&live.path);
        now.is_some() && now != *lock(&live.read_mtime)
    }

    /// Reloads on SIGHUP and when the file's mtime changes (polled every second), until
    /// `shutdown`. A refused file is logged with its line and key; the rules in force stay.
    pub fn spawn_reloader(&self, shutdown: CancellationToken) {
        if self.live.is_none() {
            return;
        }
        let rules = self.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hangups =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut poll = tokio::time::interval(Duration::from_secs(1));
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hangups.as_mut() {
                        Some(signal) => {
                            signal.recv().await;
                        }
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<()>();
                let asked = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = hangup => true,
                    _ = poll.tick() => false,
                };
                if (asked || rules.file_changed())
                    && let Err(error) = rules.reload()
                {
                    warn!("{error}; the access rules in force stay");
                }
            }
        });
    }
}

/// What of `rules`' channel groups matches no channel of `table` (a serial mistyped, a glob
/// for another station): for the log, `v1/access/explain` and the status page.
pub fn unmatched(rules: &Rules, table: &ChannelTable) -> Vec<Unmatched> {
    let facts: Vec<ChannelFacts<'_>> = table
        .channels
        .iter()
        .map(|channel| channel_facts(table, &channel.name))
        .collect();
    rules.unmatched(&facts)
}

/// Logs (warn) what of the rules' channel groups matches no channel of the station, once the
/// channel table is known (the first HELLO) and again whenever the rules are reloaded or the
/// station's channels change it; a rule whose group matches nothing does nothing, silently
/// otherwise. Runs until `shutdown`.
pub async fn report_unmatched(
    access: AccessRules,
    mut info: tokio::sync::watch::Receiver<Arc<StationInfo>>,
    shutdown: CancellationToken,
) {
    let Some(live) = access.live.clone() else {
        return;
    };
    let mut reported: Option<(u64, Vec<Unmatched>)> = None;
    loop {
        let station = info.borrow_and_update().clone();
        if let (Some(_), Some(rules)) = (&station.hello, access.current()) {
            let found = unmatched(&rules, &station.channels);
            let seen = Some((rules.version(), found));
            if seen != reported {
                if let Some((version, found)) = &seen {
                    for missing in found {
                        warn!(
                            "access rules {}{} (version {version}): {missing}; a rule naming it does nothing here",
                            live.path.display(),
                            on_station(live.station.as_deref())
                        );
                    }
                }
                reported = seen;
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = info.changed() => if changed.is_err() {
                return;
            },
            _ = live.reloaded.notified() => {}
        }
    }
}

/// A refusal of the access rules as the link carries it: its rule and its words, as given.
impl From<Refusal> for GuardRefusal {
    fn from(refusal: Refusal) -> GuardRefusal {
        GuardRefusal::Forbidden(Box::new(Forbidden {
            by: refusal.rule,
            message: refusal.message,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "[channels.all]\nnames = [\"*\"]\n[[rule]]\nname = \"r1\"\nchannels = [\"all\"]\nallow = [\"write\"]\n";

    #[test]
    fn a_bad_file_is_refused_and_the_rules_in_force_stay() {
        let dir = std::env::temp_dir().join(format!("access-rules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rules.toml");
        std::fs::write(&path, GOOD).unwrap();
        let rules = AccessRules::load(&path).unwrap();
        assert_eq!(rules.version(), 1);
        std::fs::write(&path, GOOD.replace("write", "wirte")).unwrap();
        let refused = rules.reload().unwrap_err().to_string();
        assert!(
            refused.contains("line 6") && refused.contains("wirte"),
            "{refused}"
        );
        assert_eq!(rules.version(), 1, "the rules in force stay");
        std::fs::write(&path, GOOD.replace("r1", "r2")).unwrap();
        let version = rules.reload().unwrap();
        assert_eq!(rules.version(), version);
        assert_eq!(
            version, 2,
            "one up per reload: the refused file took no version"
        );
        std::fs::write(&path, GOOD).unwrap();
        assert_eq!(rules.reload().unwrap(), 3);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `r1` (every station) allows writes; `st1-only` denies them on st1.
    const TWO_STATIONS: &str = "[channels.all]\nnames = [\"*\"]\n[[rule]]\nname = \"r1\"\nchannels = [\"all\"]\nallow = [\"write\"]\n[[rule]]\nname = \"st1-only\"\nchannels = [\"all\"]\ndeny = [\"write\"]\nstations = [\"st1\"]\n";

    /// Whether `rules` let anyone write `0.11.X.F1`, and the rule that says so.
    fn write_decision(rules: &AccessRules) -> (bool, String) {
        let current = rules.current().expect("rules in force");
        let who = current.principal(&Who::default().subject());
        let decision = current.decide(&who, &ChannelFacts::named("0.11.X.F1"), Action::Write, None);
        (decision.allowed, decision.rule.to_string())
    }

    #[test]
    fn each_station_loads_its_rules_and_a_reload_keeps_to_its_station() {
        let dir =
            std::env::temp_dir().join(format!("access-rules-stations-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rules.toml");
        std::fs::write(&path, TWO_STATIONS).unwrap();
        let st1 = AccessRules::load_for_station(&path, Some("st1"), &[]).unwrap();
        let st2 = AccessRules::load_for_station(&path, Some("st2"), &[]).unwrap();
        let single = AccessRules::load(&path).unwrap();
        assert_eq!(
            (st1.station(), st2.station(), single.station()),
            (Some("st1"), Some("st2"), None)
        );
        assert_eq!(write_decision(&st1), (false, "st1-only".into()));
        assert_eq!(write_decision(&st2), (true, "r1".into()));
        // Without a station every rule is in force, as before `stations` existed.
        assert_eq!(write_decision(&single), (false, "st1-only".into()));
        // The rule moves to st2: each reload keeps its own station.
        std::fs::write(&path, TWO_STATIONS.replace("[\"st1\"]", "[\"st2\"]")).unwrap();
        assert_eq!(st1.reload().unwrap(), 2);
        assert_eq!(st2.reload().unwrap(), 2);
        assert_eq!(write_decision(&st1), (true, "r1".into()));
        assert_eq!(write_decision(&st2), (false, "st1-only".into()));
        // A bad station id is refused at reload too, naming the rule and the id; the rules in
        // force stay.
        std::fs::write(&path, TWO_STATIONS.replace("[\"st1\"]", "[\"st/1\"]")).unwrap();
        let refused = st1.reload().unwrap_err().to_string();
        assert!(
            refused.contains("rule \"st1-only\".stations") && refused.contains("st/1"),
            "{refused}"
        );
        assert_eq!(st1.version(), 2);
        assert_eq!(write_decision(&st1), (true, "r1".into()));
        let at_start = AccessRules::load_for_station(&path, Some("st2"), &[]).unwrap_err();
        assert!(at_start.to_string().contains("st/1"), "{at_start}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_rules_for_stations_the_gateway_does_not_serve_are_listed_and_follow_a_reload() {
        let dir =
            std::env::temp_dir().join(format!("access-rules-unserved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rules.toml");
        let for_st2 = TWO_STATIONS.replace("[\"st1\"]", "[\"st2\"]");
        std::fs::write(&path, &for_st2).unwrap();
        let served = ["st1".to_owned()];
        let st1 = AccessRules::load_for_station(&path, Some("st1"), &served).unwrap();
        // The rule for st2 is not in force on st1, and is listed as for no station served.
        assert_eq!(write_decision(&st1), (true, "r1".into()));
        let unserved: Vec<String> = st1.unserved().iter().map(|r| r.rule.clone()).collect();
        assert_eq!(unserved, ["st1-only"]);
        let said = st1.unserved_said();
        assert!(
            said.len() == 1 && said[0].starts_with("rule \"st1-only\".stations: [\"st2\"]"),
            "{said:?}"
        );
        // Not listed without the stations served, nor while off.
        let unknown = AccessRules::load_for_station(&path, Some("st1"), &[]).unwrap();
        assert!(unknown.unserved().is_empty());
        assert!(AccessRules::off().unserved().is_empty());
        // Named st1 again: nothing to report after the reload.
        std::fs::write(&path, TWO_STATIONS).unwrap();
        st1.reload().unwrap();
        assert!(st1.unserved().is_empty());
        assert_eq!(write_decision(&st1), (false, "st1-only".into()));
        std::fs::remove_dir_all(&dir).ok();
    }
}
