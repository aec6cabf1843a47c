//! Save and load against the station, through the station service: a save asks every
//! channel's configuration and reads the writable settings, then writes the file; a load
//! checks the whole file first, then applies its steps one at a time under the lease's send
//! guard, and says exactly what was applied when it stops partway.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::SystemTime;

use futures::StreamExt;
use station_protocol::{ChannelConfig, Configure};
use tracing::{info, warn};

use super::format::ConfigFile;
use super::plan::{Action, holds_value, plan_load, snapshot};
use super::{ConfigFileError, ConfigFiles, LoadStopped, check_name};
use crate::lease::Admitted;
use crate::link::{ChannelTable, StationInfo};
use crate::station::{
    Change, ChangeOrigin, ChangeWhat, ItemError, ReadPolicy, Station, Step, StepAction, StepsDone,
};

/// What a load did.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadReport {
    pub file: String,
    pub generation: u64,
    /// Every step applied, in order (`write X = 500`, `configure X: unit`).
    pub applied: Vec<String>,
}

fn connected(station: &Station) -> Result<std::sync::Arc<StationInfo>, ConfigFileError> {
    station
        .connected()
        .map_err(|not_reached| ConfigFileError::NotReached(not_reached.to_string()))
}

/// How many CONFIGURE inquiries are asked at once.
const INQUIRIES_AT_ONCE: usize = 8;

/// The configuration of each of `names` (CONFIGURE without settings where the channel table
/// does not know it yet). Changes nothing on the station.
pub async fn configs_of(
    station: &Station,
    table: &ChannelTable,
    names: &[String],
) -> Result<HashMap<String, ChannelConfig>, ConfigFileError> {
    let mut configs = HashMap::new();
    let mut missing = Vec::new();
    for name in names {
        match table.config(name) {
            Some(config) => {
                configs.insert(name.clone(), config.clone());
            }
            None => missing.push(name.clone()),
        }
    }
    // A few at a time: the station's window, not the link's whole queue.
    let asked: Vec<_> = futures::stream::iter(missing.into_iter().map(|name| {
        let station = station.clone();
        async move {
            let answer = station.channel_config(&name).await;
            (name, answer)
        }
    }))
    .buffered(INQUIRIES_AT_ONCE)
    .collect()
    .await;
    for (name, answer) in asked {
        let reply = answer.map_err(|error| ConfigFileError::Station {
            context: format!("asking the station how {name} is configured"),
            error,
        })?;
        configs.insert(name.clone(), reply.config);
    }
    Ok(configs)
}

/// Saves the station as it is now under `name`.
pub async fn save(
    files: &ConfigFiles,
    station: &Station,
    name: &str,
    peer: SocketAddr,
) -> Result<usize, ConfigFileError> {
    check_name(name)?;
    let _one_at_a_time = files.busy.lock().await;
    let info = connected(station)?;
    let table = info.channels.clone();
    let all: Vec<String> = table.channels.iter().map(|c| c.name.clone()).collect();
    let configs = configs_of(station, &table, &all).await?;
    let settings: Vec<String> = table
        .channels
        .iter()
        .filter(|c| holds_value(c))
        .map(|c| c.name.clone())
        .collect();
    let readings = station
        // Settings only: no channel whose read consumes data, so no read here needs a guard.
        .read(&settings, ReadPolicy::hardware(Some(peer), None))
        .await
        .map_err(|error| ConfigFileError::ReadFailed(error.to_string()))?;
    let mut values = HashMap::new();
    for (name, reading) in settings.iter().zip(readings) {
        match reading {
            Ok(reading) => {
                values.insert(name.clone(), reading.value);
            }
            Err(ItemError::Link(error)) => {
                return Err(ConfigFileError::Station {
                    context: format!("reading {name} for the snapshot; nothing was saved"),
                    error,
                });
            }
            Err(error) => {
                return Err(ConfigFileError::ReadFailed(format!(
                    "reading {name} for the snapshot failed ({error}); nothing was saved"
                )));
            }
        }
    }
    let (station_name, serial) = info
        .hello
        .as_ref()
        .map(|hello| (hello.station.clone(), hello.serial.clone()))
        .unwrap_or_default();
    let header = (
        crate::lease::rfc3339(SystemTime::now()),
        station_name,
        serial,
    );
    let file = snapshot(&table, &configs, &values, header);
    let channels = file.channels.len();
    files.write(name, file.render().into_bytes()).await?;
    Ok(channels)
}

/// Loads the file `name` under the admission's send guard, as one sequence.
pub async fn load(
    files: &ConfigFiles,
    station: &Station,
    name: &str,
    admitted: &Admitted,
    origin: ChangeOrigin,
) -> Result<LoadReport, ConfigFileError> {
    let bytes = files.read(name).await?;
    let file = ConfigFile::parse(&bytes)
        .map_err(|error| ConfigFileError::BadFile(format!("{name} cannot be loaded: {error}")))?;
    let _one_at_a_time = files.busy.lock().await;
    let info = connected(station)?;
    let table = info.channels.clone();
    let known: Vec<String> = file
        .channels
        .iter()
        .filter(|entry| table.get(&entry.name).is_some())
        .map(|entry| entry.name.clone())
        .collect();
    let configs = configs_of(station, &table, &known).await?;
    let steps = plan_load(&file, &table, &configs).map_err(|why| {
        ConfigFileError::BadFile(format!("{name} cannot be loaded, nothing was sent: {why}"))
    })?;
    // One change of many steps, run to its end by the station service whoever hangs up: its
    // audit line names what was applied when it stops partway.
    let labels: Vec<String> = steps.iter().map(|step| step.describe()).collect();
    let change_steps = steps
        .iter()
        .zip(&labels)
        .map(|(step, label)| Step {
            label: label.clone(),
            action: match &step.action {
                Action::Configure(settings) => StepAction::Configure(Configure {
                    name: step.channel.clone(),
                    settings: settings.clone(),
                }),
                Action::Write(value) => StepAction::Write {
                    name: step.channel.clone(),
                    value: value.clone(),
                },
            },
        })
        .collect();
    let mut origin = origin;
    // The access rules ask `load_config` of every channel of the file, all before any is sent.
    origin.loads_file = Some(name.to_owned());
    let change = Change {
        what: ChangeWhat::Steps(change_steps),
        origin,
        admitted: admitted.clone(),
    };
    let report = station
        .change(change)
        .await
        .map_err(ConfigFileError::StillRunning)?;
    let done = match report.answer {
        Ok(answer) => answer.stepped().unwrap_or_default(),
        Err(error) => StepsDone {
            done: Vec::new(),
            stopped: Some((0, error)),
        },
    };
    if let Some((index, error)) = done.stopped {
        warn!(
            file = name,
            step = index + 1,
            "configuration load stopped: {error}"
        );
        return Err(ConfigFileError::Stopped(Box::new(LoadStopped {
            file: name.to_owned(),
            step: index + 1,
            total: steps.len(),
            failed: labels[index].clone(),
            error,
            applied: if index == 0 {
                "nothing".to_owned()
            } else {
                labels[..index].join("; ")
            },
            rest: steps.len() - index - 1,
        })));
    }
    let applied = labels;
    files.record_loaded(name, info.generation);
    info!(file = name, steps = applied.len(), "configuration loaded");
    Ok(LoadReport {
        file: name.to_owned(),
        generation: info.generation,
        applied,
    })
}
