//! What loading a configuration file does, decided before anything is sent: every entry
//! checked against the channel table and the channels' configurations (an unknown channel or
//! a value out of range stops it, naming it), then one ordered sequence of steps with the
//! high-voltage outputs last. And the other way: a file from the station as it is now.

use std::collections::HashMap;

use station_protocol::{ChannelConfig, ChannelDescriptor, Value, ValueType};

use super::format::{ChannelEntry, ConfigFile, FORMAT_VERSION};
use super::settings::{
    Wanted, check_aliases, detail_from_toml, detail_to_toml, parse_direction, parse_type,
    settings_for, type_names,
};
use crate::link::ChannelTable;

/// One step of a load.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub channel: String,
    pub action: Action,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// CONFIGURE with these settings.
    Configure(Vec<(String, Value)>),
    /// WRITE this value.
    Write(Value),
}

impl Step {
    /// For the report: `configure X: unit, description` or `write X = 500`.
    pub fn describe(&self) -> String {
        match &self.action {
            Action::Configure(settings) => {
                let keys: Vec<&str> = settings.iter().map(|(key, _)| key.as_str()).collect();
                format!("configure {}: {}", self.channel, keys.join(", "))
            }
            Action::Write(value) => format!("write {} = {}", self.channel, value.render()),
        }
    }
}

/// A high-voltage output's switch: a bool channel called `ON` or `ON<n>` (`…ESH10000662.ON1`).
/// Its write energises or de-energises an output, so a load orders it apart from the rest.
pub fn is_hv_output(channel: &ChannelDescriptor) -> bool {
    let last = channel.name.rsplit('.').next().unwrap_or("");
    channel.value_type == ValueType::Bool
        && last
            .strip_prefix("ON")
            .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()))
}

/// The steps that make the station what `file` says, in order: configurations first, then
/// outputs being switched off, then every other setting (set points, limits, ramps), then
/// outputs being switched on, last. Or what is wrong, naming the channel; nothing is sent then.
pub fn plan_load(
    file: &ConfigFile,
    table: &ChannelTable,
    configs: &HashMap<String, ChannelConfig>,
) -> Result<Vec<Step>, String> {
    let mut configure = Vec::new();
    let (mut switch_off, mut settings, mut switch_on) = (Vec::new(), Vec::new(), Vec::new());
    check_aliases(
        table,
        file.channels.iter().filter_map(|entry| {
            let channel = table.get(&entry.name)?;
            Some((channel.name.as_str(), entry.alias.as_deref()?))
        }),
    )?;
    for entry in &file.channels {
        let name = &entry.name;
        let channel = table
            .get(name)
            .ok_or_else(|| format!("unknown channel {name}: the station has no such channel"))?;
        let config = configs
            .get(name)
            .ok_or_else(|| format!("{name}: the station did not say how it is configured"))?;
        let wanted = wanted_of(entry).map_err(|why| format!("{name}: {why}"))?;
        let changes =
            settings_for(channel, config, &wanted).map_err(|why| format!("{name}: {why}"))?;
        if !changes.is_empty() {
            configure.push(Step {
                channel: name.clone(),
                action: Action::Configure(changes),
            });
        }
        let Some(text) = &entry.value else { continue };
        let value = setting_value(channel, config, text)?;
        let step = Step {
            channel: name.clone(),
            action: Action::Write(value.clone()),
        };
        match (is_hv_output(channel), value) {
            (true, Value::Bool(true)) => switch_on.push(step),
            (true, _) => switch_off.push(step),
            (false, _) => settings.push(step),
        }
    }
    Ok([configure, switch_off, settings, switch_on].concat())
}

fn wanted_of(entry: &ChannelEntry) -> Result<Wanted, String> {
    let direction = match &entry.direction {
        None => None,
        Some(text) => Some(
            parse_direction(text)
                .ok_or_else(|| format!("direction {text:?} is not IN, OUT or IN, OUT"))?,
        ),
    };
    let type_flags = match &entry.channel_type {
        None => None,
        Some(text) => {
            Some(parse_type(text).ok_or_else(|| format!("type {text:?} names no channel type"))?)
        }
    };
    let mut details = Vec::new();
    for (key, value) in entry.details.iter().flatten() {
        let given = detail_from_toml(value)
            .ok_or_else(|| format!("detail {key} must be a number, a bool or a string"))?;
        details.push((key.clone(), given));
    }
    Ok(Wanted {
        alias: entry.alias.clone(),
        description: entry.description.clone(),
        unit: entry.unit.clone(),
        group: entry.group.clone(),
        device: entry.device.clone(),
        enabled: entry.enabled,
        direction,
        type_flags,
        details,
    })
}

/// The value a file gives a channel, checked as the station would check it.
fn setting_value(
    channel: &ChannelDescriptor,
    config: &ChannelConfig,
    text: &str,
) -> Result<Value, String> {
    let name = &channel.name;
    if !channel.writable {
        return Err(format!("{name} is read only: a file cannot set its value"));
    }
    if channel.consuming {
        return Err(format!(
            "{name} consumes data when read: it is not a setting a file can hold"
        ));
    }
    let value = Value::parse_as(channel.value_type, text, &channel.options)
        .map_err(|error| format!("{name}: {error}"))?;
    let number = match &value {
        Value::Float(x) => Some(*x),
        Value::Integer(i) => Some(*i as f64),
        _ => None,
    };
    if let (Some((min, max)), Some(x)) = (config.limits, number)
        && !(min..=max).contains(&x)
    {
        let unit = if channel.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", channel.unit)
        };
        return Err(format!(
            "{name}: {} is out of range ({} to {}{unit})",
            value.render(),
            Value::Float(min).render(),
            Value::Float(max).render()
        ));
    }
    Ok(value)
}

/// Whether a channel's value belongs in a configuration: a writable setting, not a
/// measurement, not a channel whose read consumes data.
pub fn holds_value(channel: &ChannelDescriptor) -> bool {
    channel.writable && channel.readable && !channel.consuming
}

/// A configuration file of the station as it is: every channel's configuration, and the
/// values (`values`, read just now) of its writable settings.
pub fn snapshot(
    table: &ChannelTable,
    configs: &HashMap<String, ChannelConfig>,
    values: &HashMap<String, Value>,
    header: (String, String, String),
) -> ConfigFile {
    let (saved_at, station, serial) = header;
    let channels = table
        .channels
        .iter()
        .map(|channel| {
            let config = configs.get(&channel.name);
            ChannelEntry {
                name: channel.name.clone(),
                alias: Some(channel.alias.clone()),
                description: Some(channel.description.clone()),
                unit: Some(channel.unit.clone()),
                group: Some(channel.group.clone()),
                device: config.map(|c| c.device.clone()),
                enabled: config.map(|c| c.enabled),
                direction: Some(channel.direction.label().to_owned()),
                channel_type: (channel.type_flags != 0).then(|| type_names(channel.type_flags)),
                value: values
                    .get(&channel.name)
                    .filter(|_| holds_value(channel))
                    .map(Value::render),
                details: config.filter(|c| !c.details.is_empty()).map(|c| {
                    c.details
                        .iter()
                        .map(|(key, value)| (key.clone(), detail_to_toml(value)))
                        .collect()
                }),
            }
        })
        .collect();
    ConfigFile {
        format_version: FORMAT_VERSION,
        saved_at,
        station,
        serial,
        channels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use station_protocol::Direction;

    fn descriptor(name: &str, value_type: ValueType, writable: bool) -> ChannelDescriptor {
        ChannelDescriptor {
            name: name.into(),
            alias: String::new(),
            net_name: String::new(),
            type_flags: 1,
            direction: Direction::Out,
            unit: "V".into(),
            description: String::new(),
            group: String::new(),
            readable: true,
            writable,
            consuming: false,
            value_type,
            options: vec![],
        }
    }

    fn config(limits: Option<(f64, f64)>) -> ChannelConfig {
        ChannelConfig {
            enabled: true,
            capability: Direction::Out,
            type_capability: 1,
            device: String::new(),
            limits,
            details: vec![],
        }
    }

    fn station() -> (ChannelTable, HashMap<String, ChannelConfig>) {
        let channels = vec![
            descriptor("M.ON1", ValueType::Bool, true),
            descriptor("M.ON2", ValueType::Bool, true),
            descriptor("M.VSET1", ValueType::Float, true),
            descriptor("M.ISET1", ValueType::Float, true),
            descriptor("M.VMON1", ValueType::Float, false),
            descriptor("M.RAMP1", ValueType::Float, true),
        ];
        let configs = channels
            .iter()
            .map(|c| {
                let limits = (c.value_type == ValueType::Float).then_some((0.0, 3000.0));
                (c.name.clone(), config(limits))
            })
            .collect();
        (ChannelTable::new(channels), configs)
    }

    fn entry(name: &str, value: &str) -> ChannelEntry {
        ChannelEntry {
            name: name.into(),
            value: Some(value.into()),
            ..ChannelEntry::default()
        }
    }

    fn file(channels: Vec<ChannelEntry>) -> ConfigFile {
        ConfigFile {
            format_version: FORMAT_VERSION,
            saved_at: String::new(),
            station: String::new(),
            serial: String::new(),
            channels,
        }
    }

    #[test]
    fn outputs_are_switched_on_last_after_their_set_points_and_limits_and_off_first() {
        let (table, configs) = station();
        let loaded = file(vec![
            entry("M.ON1", "True"),
            entry("M.VSET1", "500"),
            entry("M.ON2", "False"),
            ChannelEntry {
                unit: Some("kV".into()),
                ..entry("M.ISET1", "100")
            },
            entry("M.RAMP1", "50"),
        ]);
        let steps = plan_load(&loaded, &table, &configs).unwrap();
        let order: Vec<String> = steps.iter().map(Step::describe).collect();
        assert_eq!(
            order,
            [
                "configure M.ISET1: unit",
                "write M.ON2 = False",
                "write M.VSET1 = 500",
                "write M.ISET1 = 100",
                "write M.RAMP1 = 50",
                "write M.ON1 = True",
            ]
        );
    }

    #[test]
    fn an_unknown_channel_or_a_value_out_of_range_stops_the_plan_naming_it() {
        let (table, configs) = station();
        let unknown = plan_load(
            &file(vec![entry("M.VSET1", "1"), entry("NO.SUCH", "1")]),
            &table,
            &configs,
        );
        assert!(unknown.unwrap_err().contains("unknown channel NO.SUCH"));
        let high = plan_load(&file(vec![entry("M.VSET1", "5000")]), &table, &configs).unwrap_err();
        assert_eq!(high, "M.VSET1: 5000 is out of range (0 to 3000 V)");
        let measured = plan_load(&file(vec![entry("M.VMON1", "1")]), &table, &configs).unwrap_err();
        assert!(measured.contains("read only"), "{measured}");
        let not_bool =
            plan_load(&file(vec![entry("M.ON1", "maybe")]), &table, &configs).unwrap_err();
        assert!(not_bool.starts_with("M.ON1:"), "{not_bool}");
        let sideways = ChannelEntry {
            direction: Some("sideways".into()),
            ..ChannelEntry::default()
        };
        let sideways = ChannelEntry {
            name: "M.VSET1".into(),
            ..sideways
        };
        assert!(
            plan_load(&file(vec![sideways]), &table, &configs)
                .unwrap_err()
                .contains("direction")
        );
    }

    #[test]
    fn a_snapshot_loads_back_as_writes_only_of_its_settings() {
        let (table, configs) = station();
        let values: HashMap<String, Value> = [
            ("M.VSET1", Value::Float(250.0)),
            ("M.ON1", Value::Bool(false)),
            ("M.VMON1", Value::Float(249.9)),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v))
        .collect();
        let saved = snapshot(&table, &configs, &values, Default::default());
        assert_eq!(saved.channels.len(), 6);
        let vmon = saved.channels.iter().find(|c| c.name == "M.VMON1").unwrap();
        assert_eq!(vmon.value, None, "a measurement is not saved");
        let reread = ConfigFile::parse(saved.render().as_bytes()).unwrap();
        let steps = plan_load(&reread, &table, &configs).unwrap();
        assert_eq!(
            steps.iter().map(Step::describe).collect::<Vec<_>>(),
            ["write M.ON1 = False", "write M.VSET1 = 250"]
        );
        assert!(is_hv_output(&descriptor("A.ON", ValueType::Bool, true)));
        assert!(!is_hv_output(&descriptor("A.ONX", ValueType::Bool, true)));
        assert!(!is_hv_output(&descriptor("A.ON1", ValueType::Float, true)));
    }
}
