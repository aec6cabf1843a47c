//! CONFIGURE (SPEC.md §6.13) on the simulated station: each channel's configuration beyond its
//! descriptor (enabled, capabilities, device, limits, type-specific details), checked whole
//! before anything changes, and a configuration NOTIFY for every change.

use station_protocol::{
    ChangeType, ChannelConfig, ChannelDescriptor, ConfigureReply, Direction, ErrorCode, Notify,
    StationError, Value,
};

use super::{Station, unknown_channel};
use crate::profile::{ChannelModel, ChannelSpec};

const DIGITAL: u32 = 1 << 1;
const VIRTUAL_DIGITAL: u32 = 1 << 2;
const UART: u32 = 1 << 13;
/// Types whose readings pass through a gain and an offset.
const SCALED: u32 = 1 | (1 << 3) | (1 << 11);

/// A channel's configuration as the station starts with it, from its profile entry.
pub(super) fn initial(spec: &ChannelSpec) -> ChannelConfig {
    let d = &spec.descriptor;
    // A digital pin that drives can also be read: it may be turned around.
    let capability = if d.type_flags & DIGITAL != 0 && d.direction == Direction::Out {
        Direction::InOut
    } else {
        d.direction
    };
    let type_capability = if d.type_flags & DIGITAL != 0 {
        d.type_flags | VIRTUAL_DIGITAL
    } else {
        d.type_flags
    };
    let limits = match &spec.model {
        ChannelModel::Setting { range, .. } | ChannelModel::Hv { range, .. } => *range,
        _ => None,
    };
    let mut details = Vec::new();
    if d.type_flags & SCALED != 0 {
        details.push(("Gain".to_owned(), Value::Float(1.0)));
        details.push(("Offset".to_owned(), Value::Float(0.0)));
    }
    if d.type_flags & DIGITAL != 0 {
        details.push(("PullType".to_owned(), Value::String("None".to_owned())));
    }
    if d.type_flags & UART != 0 {
        details.push(("Baudrate".to_owned(), Value::Integer(115_200)));
    }
    ChannelConfig {
        enabled: true,
        capability,
        type_capability,
        device: d
            .name
            .rsplit_once('.')
            .map(|(device, _)| device.to_owned())
            .unwrap_or_default(),
        limits,
        details,
    }
}

fn bad(message: String) -> StationError {
    StationError::new(ErrorCode::BadValue, message)
}

fn text(name: &str, key: &str, value: &Value) -> Result<String, StationError> {
    match value {
        Value::String(text) => Ok(text.clone()),
        other => Err(bad(format!(
            "{name}: {key} takes a string, not {}",
            other.value_type().name()
        ))),
    }
}

/// Applies one checked setting to a copy of the channel.
fn apply(
    name: &str,
    descriptor: &mut ChannelDescriptor,
    config: &mut ChannelConfig,
    key: &str,
    value: &Value,
) -> Result<(), StationError> {
    match key {
        "alias" => descriptor.alias = text(name, key, value)?,
        "description" => descriptor.description = text(name, key, value)?,
        "unit" => descriptor.unit = text(name, key, value)?,
        "group" => descriptor.group = text(name, key, value)?,
        "device" => config.device = text(name, key, value)?,
        "enabled" => match value {
            Value::Bool(on) => config.enabled = *on,
            _ => return Err(bad(format!("{name}: enabled takes a bool"))),
        },
        "direction" => {
            let wanted = match value {
                Value::Integer(i) => u8::try_from(*i).ok().and_then(Direction::from_u8),
                _ => None,
            }
            .ok_or_else(|| {
                bad(format!(
                    "{name}: direction takes 1 (IN), 2 (OUT) or 3 (IN, OUT)"
                ))
            })?;
            if wanted as u8 & !(config.capability as u8) != 0 {
                return Err(bad(format!(
                    "{name}: direction {} is outside its capability {}",
                    wanted.label(),
                    config.capability.label()
                )));
            }
            descriptor.direction = wanted;
        }
        "type" => {
            let flags = match value {
                Value::Integer(i) => u32::try_from(*i).ok().filter(|flags| *flags != 0),
                _ => None,
            }
            .ok_or_else(|| bad(format!("{name}: type takes non-zero type flags")))?;
            if flags & !config.type_capability != 0 {
                return Err(bad(format!(
                    "{name}: type {flags} is outside its type capability {}",
                    config.type_capability
                )));
            }
            descriptor.type_flags = flags;
        }
        _ => {
            let Some(detail) = key.strip_prefix(station_protocol::configure::DETAIL_PREFIX) else {
                return Err(bad(format!("{name}: no setting {key:?}")));
            };
            let Some((_, current)) = config.details.iter_mut().find(|(d, _)| d == detail) else {
                return Err(bad(format!("{name}: has no detail {detail:?}")));
            };
            if current.value_type() != value.value_type() {
                return Err(bad(format!(
                    "{name}: detail {detail} takes a {}, not {}",
                    current.value_type().name(),
                    value.value_type().name()
                )));
            }
            *current = value.clone();
        }
    }
    Ok(())
}

impl Station {
    /// CONFIGURE: every setting is checked on a copy; the channel changes only when all pass.
    pub(crate) fn configure(
        &mut self,
        name: &str,
        settings: &[(String, Value)],
    ) -> Result<ConfigureReply, StationError> {
        let index = self
            .by_name
            .get(name)
            .copied()
            .ok_or_else(|| unknown_channel(name))?;
        let channel = &self.channels[index];
        let mut descriptor = channel.spec.descriptor.clone();
        let mut config = channel.config.clone();
        for (key, value) in settings {
            apply(name, &mut descriptor, &mut config, key, value)?;
        }
        if !settings.is_empty() {
            let channel = &mut self.channels[index];
            channel.spec.descriptor = descriptor.clone();
            channel.config = config.clone();
            self.pending_notifies.push(Notify::ConfigurationChanged {
                change: ChangeType::Changed,
                message: format!("{name} configured"),
            });
        }
        Ok(ConfigureReply {
            channel: descriptor,
            config,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;
    use tokio::time::Instant;

    fn station() -> Station {
        Station::power_on(&Profile::default_station(), Instant::now())
    }

    fn set(key: &str, value: Value) -> (String, Value) {
        (key.to_owned(), value)
    }

    const VSET: &str = "0.4.ESH10000662.VSET1";
    const ON: &str = "0.4.ESH10000662.ON1";

    #[test]
    fn a_configure_changes_the_descriptor_and_details_and_notifies() {
        let mut station = station();
        let reply = station
            .configure(
                VSET,
                &[
                    set("unit", Value::String("kV".into())),
                    set("description", Value::String("set point".into())),
                    set("detail.Gain", Value::Float(2.0)),
                    set("enabled", Value::Bool(false)),
                ],
            )
            .unwrap();
        assert_eq!(reply.channel.unit, "kV");
        assert_eq!(reply.config.limits, Some((0.0, 3000.0)));
        assert!(!reply.config.enabled);
        assert!(
            reply
                .config
                .details
                .contains(&("Gain".into(), Value::Float(2.0)))
        );
        let index = station.by_name[VSET];
        assert_eq!(
            station.descriptor_at(index).unwrap().description,
            "set point"
        );
        assert!(matches!(
            station.take_notifies().as_slice(),
            [Notify::ConfigurationChanged {
                change: ChangeType::Changed,
                ..
            }]
        ));
    }

    #[test]
    fn an_inquiry_changes_nothing_and_does_not_notify() {
        let mut station = station();
        let reply = station.configure(VSET, &[]).unwrap();
        assert_eq!(reply.channel.unit, "V");
        assert!(station.take_notifies().is_empty());
    }

    #[test]
    fn one_bad_setting_changes_nothing_and_names_itself() {
        let mut station = station();
        for (settings, wanted) in [
            (
                vec![
                    set("unit", Value::String("kV".into())),
                    set("colour", Value::Bool(true)),
                ],
                "colour",
            ),
            (
                vec![set("direction", Value::Integer(1))],
                "outside its capability",
            ),
            (
                vec![set("type", Value::Integer(2))],
                "outside its type capability",
            ),
            (
                vec![set("detail.PullType", Value::String("Up".into()))],
                "PullType",
            ),
            (vec![set("detail.Gain", Value::String("2".into()))], "Gain"),
            (vec![set("unit", Value::Float(1.0))], "unit"),
        ] {
            let error = station.configure(VSET, &settings).unwrap_err();
            assert_eq!(error.code, ErrorCode::BadValue);
            assert!(error.message.contains(wanted), "{error:?}");
        }
        let index = station.by_name[VSET];
        assert_eq!(station.descriptor_at(index).unwrap().unit, "V");
        assert!(station.take_notifies().is_empty());
        assert_eq!(
            station.configure("NO.SUCH", &[]).unwrap_err().code,
            ErrorCode::UnknownChannel
        );
    }

    #[test]
    fn a_digital_output_may_be_turned_around_within_its_capability() {
        let mut station = station();
        let reply = station
            .configure(ON, &[set("direction", Value::Integer(3))])
            .unwrap();
        assert_eq!(reply.channel.direction, Direction::InOut);
        assert_eq!(reply.config.capability, Direction::InOut);
    }
}
