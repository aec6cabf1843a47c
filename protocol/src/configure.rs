//! The CONFIGURE operation (opcode `0C`, SPEC.md §6.13): change a channel's configuration, or
//! ask for it, and the reply with the channel's descriptor and configuration afterwards.

use bytes::{BufMut, BytesMut};

use crate::channel::{ChannelDescriptor, Direction, get_channel, put_channel};
use crate::value::{Value, get_value, put_value};
use crate::wire::{PayloadError, Reader, Writer};

/// The setting keys a CONFIGURE may carry (§6.13); a detail is `detail.` and its name.
pub const SETTING_KEYS: &[&str] = &[
    "alias",
    "enabled",
    "direction",
    "type",
    "description",
    "unit",
    "group",
    "device",
];

/// The prefix of a type-specific detail's key, e.g. `detail.Gain`.
pub const DETAIL_PREFIX: &str = "detail.";

/// A CONFIGURE request: the channel and the settings to change, in order. No settings: the
/// station changes nothing and answers with the channel's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Configure {
    pub name: String,
    pub settings: Vec<(String, Value)>,
}

/// What a channel's configuration is beyond its descriptor: what may be changed and to what.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelConfig {
    pub enabled: bool,
    /// The directions the channel supports; `direction` may be set within it.
    pub capability: Direction,
    /// The type flags the channel supports; `type` may be set within them.
    pub type_capability: u32,
    /// The name of the device that provides the channel.
    pub device: String,
    /// The bounds of a numeric value, when it has any.
    pub limits: Option<(f64, f64)>,
    /// The type-specific details the channel has, by name, with their values; a detail's
    /// value type is that of its value here.
    pub details: Vec<(String, Value)>,
}

/// The answer to CONFIGURE: the descriptor and configuration as they are now.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigureReply {
    pub channel: ChannelDescriptor,
    pub config: ChannelConfig,
}

impl Configure {
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_string(&self.name);
        out.put_count(self.settings.len());
        for (key, value) in &self.settings {
            out.put_string(key);
            put_value(out, value);
        }
    }

    pub(crate) fn decode(r: &mut Reader) -> Result<Configure, PayloadError> {
        let name = r.at("channel name").string()?;
        // The smallest setting: an empty key (2) and a bool value (2).
        let n = r.at("setting count").count(4)?;
        let mut settings = Vec::with_capacity(n);
        for _ in 0..n {
            let key = r.at("setting key").string()?;
            settings.push((key, get_value(r)?));
        }
        Ok(Configure { name, settings })
    }
}

impl ConfigureReply {
    /// Encodes the reply; returns the number of details (checked against the count's limit).
    pub(crate) fn encode(&self, out: &mut BytesMut) -> usize {
        put_channel(out, &self.channel);
        let config = &self.config;
        out.put_u8(u8::from(config.enabled));
        out.put_u8(config.capability as u8);
        out.put_u32(config.type_capability);
        out.put_string(&config.device);
        match config.limits {
            Some((min, max)) => {
                out.put_u8(1);
                out.put_f64(min);
                out.put_f64(max);
            }
            None => out.put_u8(0),
        }
        out.put_count(config.details.len());
        for (key, value) in &config.details {
            out.put_string(key);
            put_value(out, value);
        }
        config.details.len()
    }

    pub(crate) fn decode(r: &mut Reader) -> Result<ConfigureReply, PayloadError> {
        let channel = get_channel(r)?;
        let enabled = r.at("enabled").bool()?;
        let capability = r.at("direction capability").u8()?;
        let capability = Direction::from_u8(capability)
            .ok_or(PayloadError::BadTag("direction capability", capability))?;
        let type_capability = r.at("type capability").u32()?;
        let device = r.at("device name").string()?;
        let limits = match r.at("limits").bool()? {
            true => Some((r.at("minimum").f64()?, r.at("maximum").f64()?)),
            false => None,
        };
        let n = r.at("detail count").count(4)?;
        let mut details = Vec::with_capacity(n);
        for _ in 0..n {
            let key = r.at("detail name").string()?;
            details.push((key, get_value(r)?));
        }
        Ok(ConfigureReply {
            channel,
            config: ChannelConfig {
                enabled,
                capability,
                type_capability,
                device,
                limits,
                details,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Opcode;
    use crate::message::{Request, Response};
    use crate::value::ValueType;

    fn reply() -> ConfigureReply {
        ConfigureReply {
            channel: ChannelDescriptor {
                name: "0.4.ESH10000662.VSET1".into(),
                alias: "HV1 set".into(),
                net_name: "HV1_VSET".into(),
                type_flags: 1,
                direction: Direction::Out,
                unit: "V".into(),
                description: "Output 1".into(),
                group: "HV4".into(),
                readable: true,
                writable: true,
                consuming: false,
                value_type: ValueType::Float,
                options: vec![],
            },
            config: ChannelConfig {
                enabled: true,
                capability: Direction::Out,
                type_capability: 1,
                device: "0.4.ESH10000662".into(),
                limits: Some((0.0, 3000.0)),
                details: vec![("Gain".into(), Value::Float(1.0))],
            },
        }
    }

    #[test]
    fn a_configure_request_and_its_reply_round_trip() {
        let request = Request::Configure(Configure {
            name: "X".into(),
            settings: vec![
                ("unit".into(), Value::String("kV".into())),
                ("enabled".into(), Value::Bool(false)),
                ("detail.Gain".into(), Value::Float(2.0)),
            ],
        });
        let frame = request.to_frame(9).unwrap();
        assert_eq!(frame.kind(), Some(Opcode::Configure));
        assert_eq!(Request::from_frame(&frame).unwrap(), request);
        let mut without_limits = reply();
        without_limits.config.limits = None;
        for reply in [reply(), without_limits] {
            let response = Response::Configure(Box::new(reply));
            let frame = response.to_frame(9).unwrap();
            assert_eq!(frame.kind(), Some(Opcode::ConfigureReply));
            assert_eq!(Response::from_frame(&frame).unwrap(), response);
        }
    }

    #[test]
    fn an_inquiry_has_no_settings() {
        let request = Request::Configure(Configure {
            name: "X".into(),
            settings: vec![],
        });
        let frame = request.to_frame(1).unwrap();
        assert_eq!(&frame.payload[..], &[0, 1, b'X', 0, 0]);
        assert_eq!(Request::from_frame(&frame).unwrap(), request);
    }

    #[test]
    fn a_cut_or_padded_or_mistagged_payload_is_malformed() {
        let frame = Response::Configure(Box::new(reply())).to_frame(3).unwrap();
        let full = frame.payload.to_vec();
        for cut in 0..full.len() {
            let short =
                crate::frame::RawFrame::new(Opcode::ConfigureReply, 3, full[..cut].to_vec());
            assert!(Response::from_frame(&short).is_err(), "cut at {cut}");
        }
        let mut padded = full.clone();
        padded.push(0);
        let padded = crate::frame::RawFrame::new(Opcode::ConfigureReply, 3, padded);
        assert_eq!(
            Response::from_frame(&padded),
            Err(PayloadError::TrailingBytes(1))
        );
        // The capability byte sits right after the descriptor and the enabled flag.
        let mut bad_capability = full.clone();
        let descriptor_len = {
            let mut out = BytesMut::new();
            put_channel(&mut out, &reply().channel);
            out.len()
        };
        bad_capability[descriptor_len + 1] = 7;
        let bad = crate::frame::RawFrame::new(Opcode::ConfigureReply, 3, bad_capability);
        assert_eq!(
            Response::from_frame(&bad),
            Err(PayloadError::BadTag("direction capability", 7))
        );
        let request = Request::Configure(Configure {
            name: "X".into(),
            settings: vec![("unit".into(), Value::String("V".into()))],
        })
        .to_frame(4)
        .unwrap();
        let mut bad_value = request.payload.to_vec();
        let tag_at = bad_value.len() - 4;
        bad_value[tag_at] = 9;
        let bad = crate::frame::RawFrame::new(Opcode::Configure, 4, bad_value);
        assert_eq!(
            Request::from_frame(&bad),
            Err(PayloadError::BadTag("value type", 9))
        );
    }
}
