//! Several stations in one configuration: `[[station]]` tables, each turned into a
//! whole single-station [`Config`] of its own, so that every part that serves one station today
//! (its link, cache, control lease, safe state, legacy listener, history) reads the same keys
//! it reads now.
//!
//! A `[[station]]` table has an `id` (letters, digits, `-`, `_`; at most 64), every key of
//! today's `[station]`, and sub-tables for what is per station:
//! - `[station.lease]`: `name`, `safe_state`, `safe_state_tolerance`, `lock_delay_ms` (the
//!   backend, the admin token and the link-owner lease's times are the gateway's, in `[lease]`);
//! - `[station.legacy]`: any key of `[legacy]` (its own `listen` address);
//! - `[station.history]`: `enabled`, `channels`, `interval_ms`, `samples_per_channel`,
//!   `max_channels` (the archive is the gateway's, in `[history]`);
//! - `[station.config_files]`: `dir` (by default the gateway's `config_files.dir` with the
//!   station's id under it, so two stations' files never mix).
//!
//! A key a station's sub-table sets overrides the gateway-wide section's; everything else is the
//! gateway's for every station. The station's `id` names it in paths (`/stations/{id}/api/...`)
//! and its control lease (`control:station:<id>`, unless `[station.lease] name` says otherwise).
//! A file with today's single `[station]` is one station, as before.

use std::collections::BTreeSet;

use super::{Config, ConfigError};

/// One station of the configuration, and the whole single-station config it runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct StationSetup {
    /// Its id in paths and in its lease's name (`station` for a file with one `[station]`
    /// without an id that fits, see [`single_station_id`]).
    pub id: String,
    pub config: Config,
}

/// Every station a configuration names, and the one `/api/...` serves.
#[derive(Debug, Clone, PartialEq)]
pub struct Lab {
    pub stations: Vec<StationSetup>,
    /// The station `/api/...` serves: the only one, or `default_station`; `None` with several
    /// stations and no `default_station` (then `/api/...` answers 404 naming the stations).
    pub default_station: Option<String>,
}

/// The longest station id.
pub const MAX_ID_LEN: usize = 64;

/// Keys a station's `[station.lease]` may set; the rest of `[lease]` is the gateway's.
const PER_STATION_LEASE: [&str; 4] = [
    "name",
    "safe_state",
    "safe_state_tolerance",
    "lock_delay_ms",
];
/// Keys a station's `[station.history]` may set; the archive is the gateway's.
const PER_STATION_HISTORY: [&str; 5] = [
    "enabled",
    "channels",
    "interval_ms",
    "samples_per_channel",
    "max_channels",
];
/// Keys a station's `[station.config_files]` may set.
const PER_STATION_CONFIG_FILES: [&str; 1] = ["dir"];

/// Why `id` cannot name a station; `None` when it can.
pub fn id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("must not be empty".into());
    }
    if id.len() > MAX_ID_LEN {
        return Some(format!("must be at most {MAX_ID_LEN} characters"));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Some(format!(
            "{id:?} has {bad:?}: only letters, digits, '-' and '_' may name a station (it goes in paths such as /stations/{{id}}/api)"
        ));
    }
    None
}

/// The id of the one station of a file with `[station]`: its `station.id` when that fits an id,
/// else `station`.
pub fn single_station_id(config: &Config) -> String {
    match config.station_id() {
        Some(id) if id_problem(&id).is_none() => id,
        _ => "station".to_owned(),
    }
}

impl Lab {
    /// Parses a configuration of one `[station]` or of `[[station]]` tables; `origin` names the
    /// source in errors. Each station's config is checked as a whole ([`Config::validate`]),
    /// then what two stations may not share (an id, a control lease, a legacy address, a
    /// configuration files directory).
    pub fn from_toml(text: &str, origin: &str) -> Result<Lab, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|error| super::parse_error(&error, text, origin))?;
        let default_station = match table.remove("default_station") {
            None => None,
            Some(toml::Value::String(id)) => Some(id),
            Some(other) => {
                return Err(invalid(
                    "default_station",
                    format!("must be a station's id (a string); got {other}"),
                ));
            }
        };
        let Some(toml::Value::Array(entries)) = table.get("station") else {
            // One `[station]` (or none): today's file, parsed as it always was.
            let config = Config::from_toml(&without_default_station(text), origin)?;
            let id = single_station_id(&config);
            if let Some(named) = &default_station
                && *named != id
            {
                return Err(invalid(
                    "default_station",
                    format!("names {named:?}, but the one station is {id:?}"),
                ));
            }
            return Ok(Lab {
                stations: vec![StationSetup {
                    id: id.clone(),
                    config,
                }],
                default_station: Some(id),
            });
        };
        let entries = entries.clone();
        table.remove("station");
        if entries.is_empty() {
            return Err(invalid("station", "[[station]] names no station"));
        }
        let mut stations = Vec::with_capacity(entries.len());
        for (index, entry) in entries.into_iter().enumerate() {
            stations.push(station_setup(&table, entry, index, origin)?);
        }
        check_apart(&stations)?;
        let default_station = match default_station {
            Some(named) if !stations.iter().any(|station| station.id == named) => {
                return Err(invalid(
                    "default_station",
                    format!(
                        "names {named:?}, which is not a station here ({})",
                        ids(&stations)
                    ),
                ));
            }
            Some(named) => Some(named),
            None if stations.len() == 1 => Some(stations[0].id.clone()),
            None => None,
        };
        Ok(Lab {
            stations,
            default_station,
        })
    }

    /// Reads and parses a configuration file ([`Lab::from_toml`]).
    pub fn from_file(path: &std::path::Path) -> Result<Lab, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Lab::from_toml(&text, &path.display().to_string())
    }

    /// `count` stations `sim1`…`simN` made from one station's `config` (`--simulator N`): each
    /// its own id, control lease and configuration files directory (the gateway's with the id
    /// under it); its `station.url` is for the caller to set. What two stations may not share
    /// (a legacy address, a named control lease, a history archive) is refused here, by name.
    pub fn simulated(config: &Config, count: usize) -> Result<Lab, ConfigError> {
        let stations: Vec<StationSetup> = (1..=count)
            .map(|number| {
                let id = format!("sim{number}");
                let mut config = config.clone();
                config.station.id = id.clone();
                config.config_files.dir = config.config_files.dir.join(&id);
                StationSetup { id, config }
            })
            .collect();
        check_apart(&stations)?;
        Ok(Lab {
            stations,
            default_station: None,
        })
    }

    /// One station, as today's single-station configuration describes it (`--station`, a file
    /// with one `[station]`, no file at all): its id is [`single_station_id`], and it is the
    /// default station.
    pub fn single(config: Config) -> Lab {
        let id = single_station_id(&config);
        Lab {
            stations: vec![StationSetup {
                id: id.clone(),
                config,
            }],
            default_station: Some(id),
        }
    }

    /// The ids of the stations, in the configuration's order.
    pub fn ids(&self) -> Vec<String> {
        self.stations
            .iter()
            .map(|station| station.id.clone())
            .collect()
    }

    /// The station of `id`.
    pub fn station(&self, id: &str) -> Option<&StationSetup> {
        self.stations.iter().find(|station| station.id == id)
    }
}

/// Station `id`'s own file beside `path` (`link-owner.state` → `link-owner-st1.state`): a
/// file one station locks or owns, where a gateway of one station has one.
pub fn station_file(path: &std::path::Path, id: &str) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(extension) => format!("{stem}-{id}.{}", extension.to_string_lossy()),
        None => format!("{stem}-{id}"),
    };
    path.with_file_name(name)
}

/// `text` without its top-level `default_station = ...` line, which a single-station
/// [`Config`] does not know.
fn without_default_station(text: &str) -> String {
    let mut in_table = false;
    text.lines()
        .filter(|line| {
            let trimmed = line.trim_start();
            if trimmed.starts_with('[') {
                in_table = true;
            }
            in_table
                || !trimmed
                    .strip_prefix("default_station")
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

/// `st1, st2`.
fn ids(stations: &[StationSetup]) -> String {
    stations
        .iter()
        .map(|station| station.id.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The whole config of the `index`th `[[station]]` table: the gateway's sections with the
/// station's own keys over them.
fn station_setup(
    shared: &toml::Table,
    entry: toml::Value,
    index: usize,
    origin: &str,
) -> Result<StationSetup, ConfigError> {
    let toml::Value::Table(mut entry) = entry else {
        return Err(invalid("station", "every [[station]] must be a table"));
    };
    let id = match entry.get("id") {
        Some(toml::Value::String(id)) => id.clone(),
        Some(_) => return Err(invalid("station.id", "must be a string")),
        None => {
            return Err(invalid(
                "station.id",
                format!(
                    "station {} of [[station]] has no id; give every station an id such as \"st1\"",
                    index + 1
                ),
            ));
        }
    };
    if let Some(problem) = id_problem(&id) {
        return Err(invalid("station.id", problem));
    }
    let at = |message: String| ConfigError::Parse {
        origin: format!("{origin}, station {id}"),
        message,
    };
    let mut merged = shared.clone();
    for (section, allowed) in [
        ("lease", &PER_STATION_LEASE[..]),
        ("legacy", &[][..]),
        ("history", &PER_STATION_HISTORY[..]),
        ("config_files", &PER_STATION_CONFIG_FILES[..]),
    ] {
        let own = match entry.remove(section) {
            None => toml::Table::new(),
            Some(toml::Value::Table(own)) => own,
            Some(_) => return Err(at(format!("station.{section} must be a table"))),
        };
        if !allowed.is_empty()
            && let Some(key) = own.keys().find(|key| !allowed.contains(&key.as_str()))
        {
            return Err(at(format!(
                "{section}.{key} is the gateway's, for every station: set it in [{section}], not in [station.{section}] (a station may set {})",
                allowed.join(", ")
            )));
        }
        let target = merged
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(target) = target else {
            return Err(at(format!("{section} must be a table")));
        };
        let dir_set = own.contains_key("dir");
        target.extend(own);
        if section == "config_files" && !dir_set {
            // Each station's files under the gateway's directory, in a folder of its id.
            let base = match target.get("dir") {
                Some(toml::Value::String(dir)) => dir.clone(),
                _ => Config::default().config_files.dir.display().to_string(),
            };
            let dir = std::path::Path::new(&base).join(&id);
            target.insert("dir".into(), toml::Value::String(dir.display().to_string()));
        }
    }
    merged.insert("station".into(), toml::Value::Table(entry));
    let config: Config = toml::Value::Table(merged)
        .try_into()
        .map_err(|error: toml::de::Error| at(super::plain_type_names(error.message())))?;
    config.validate().map_err(|error| match error {
        ConfigError::Invalid { key, message } => at(format!("config key {key}: {message}")),
        other => other,
    })?;
    Ok(StationSetup { id, config })
}

/// What two stations may not share: an id (in any letter case: they are paths and lease
/// names), a control lease, a legacy listener's address, a configuration files directory.
pub fn check_apart(stations: &[StationSetup]) -> Result<(), ConfigError> {
    if stations.len() > 1
        && let Some(station) = stations.iter().find(|station| {
            station.config.history.enabled && !station.config.history.archive.is_empty()
        })
    {
        // The archive's rows name a channel, not a station: two stations' samples of one
        // channel name would be one series.
        return Err(invalid(
            "history.archive",
            format!(
                "the history archive keeps one station's samples (its rows name channels, not stations), and station {} would share it with the others; with several stations keep [history] in memory (archive = \"\")",
                station.id
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    for station in stations {
        if !seen.insert(station.id.to_lowercase()) {
            return Err(invalid(
                "station.id",
                format!("{:?} names two stations", station.id),
            ));
        }
    }
    for (i, a) in stations.iter().enumerate() {
        for b in &stations[i + 1..] {
            let clash = |what: &str, value: String| {
                invalid(
                    "station",
                    format!(
                        "stations {} and {} have one {what} ({value}); each needs its own",
                        a.id, b.id
                    ),
                )
            };
            if a.config.control_lease_name() == b.config.control_lease_name() {
                return Err(clash("control lease", a.config.control_lease_name()));
            }
            let listen = &a.config.legacy.listen;
            if !listen.is_empty() && *listen == b.config.legacy.listen {
                return Err(clash("legacy.listen", listen.clone()));
            }
            if a.config.config_files.dir == b.config.config_files.dir {
                return Err(clash(
                    "config_files.dir",
                    a.config.config_files.dir.display().to_string(),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
