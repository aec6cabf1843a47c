//! What LIST says about one channel ([`ChannelDescriptor`], its [`Direction`]) and its payload
//! encoding, shared by LIST (`message.rs`) and CONFIGURE (`configure.rs`).

use bytes::{BufMut, BytesMut};

use crate::value::ValueType;
use crate::wire::{PayloadError, Reader, Writer};

/// Whether a channel is an input, an output or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Direction {
    In = 1,
    Out = 2,
    InOut = 3,
}

impl Direction {
    pub fn from_u8(byte: u8) -> Option<Direction> {
        Some(match byte {
            1 => Direction::In,
            2 => Direction::Out,
            3 => Direction::InOut,
            _ => return None,
        })
    }

    /// As the REST contract spells it.
    pub fn label(self) -> &'static str {
        match self {
            Direction::In => "IN",
            Direction::Out => "OUT",
            Direction::InOut => "IN, OUT",
        }
    }
}

/// What LIST says about one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelDescriptor {
    pub name: String,
    pub alias: String,
    pub net_name: String,
    /// Channel type flags, bit values as the REST contract's `channelType`.
    pub type_flags: u32,
    pub direction: Direction,
    pub unit: String,
    pub description: String,
    pub group: String,
    pub readable: bool,
    pub writable: bool,
    /// A read changes the station (a byte stream's receive buffer, a bus device's queue).
    pub consuming: bool,
    pub value_type: ValueType,
    /// The option names of an enum channel, empty otherwise.
    pub options: Vec<String>,
}

impl ChannelDescriptor {
    /// Bytes this descriptor takes in a LIST reply.
    pub fn encoded_len(&self) -> usize {
        let strings = [
            &self.name,
            &self.alias,
            &self.net_name,
            &self.unit,
            &self.description,
            &self.group,
        ];
        let text: usize = strings.iter().map(|s| 2 + s.len()).sum();
        let options: usize = self.options.iter().map(|o| 2 + o.len()).sum();
        text + 4 + 1 + 1 + 1 + 1 + 2 + options
    }
}

pub(crate) fn put_channel(out: &mut BytesMut, ch: &ChannelDescriptor) {
    out.put_string(&ch.name);
    out.put_string(&ch.alias);
    out.put_string(&ch.net_name);
    out.put_u32(ch.type_flags);
    out.put_u8(ch.direction as u8);
    out.put_string(&ch.unit);
    out.put_string(&ch.description);
    out.put_string(&ch.group);
    out.put_u8(u8::from(ch.readable) | (u8::from(ch.writable) << 1));
    out.put_u8(u8::from(ch.consuming));
    out.put_u8(ch.value_type as u8);
    out.put_count(ch.options.len());
    for option in &ch.options {
        out.put_string(option);
    }
}

pub(crate) fn get_channel(r: &mut Reader) -> Result<ChannelDescriptor, PayloadError> {
    let name = r.at("channel name").string()?;
    let alias = r.at("channel alias").string()?;
    let net_name = r.at("channel net name").string()?;
    let type_flags = r.at("channel type flags").u32()?;
    let direction = r.at("channel direction").u8()?;
    let direction = Direction::from_u8(direction)
        .ok_or(PayloadError::BadTag("channel direction", direction))?;
    let unit = r.at("channel unit").string()?;
    let description = r.at("channel description").string()?;
    let group = r.at("channel group").string()?;
    let access = r.at("channel access").u8()?;
    if access > 3 {
        return Err(PayloadError::BadTag("channel access", access));
    }
    let consuming = r.at("channel consuming flag").bool()?;
    let tag = r.at("channel value type").u8()?;
    let value_type =
        ValueType::from_u8(tag).ok_or(PayloadError::BadTag("channel value type", tag))?;
    let n = r.at("channel options").count(2)?;
    let mut options = Vec::with_capacity(n);
    for _ in 0..n {
        options.push(r.at("channel option").string()?);
    }
    Ok(ChannelDescriptor {
        name,
        alias,
        net_name,
        type_flags,
        direction,
        unit,
        description,
        group,
        readable: access & 1 != 0,
        writable: access & 2 != 0,
        consuming,
        value_type,
        options,
    })
}
