//! Typed requests and responses, and their payload encodings.
//!
//! A request frame carries one [`Request`]; its answer carries the same request id and either
//! the matching [`Response`] or `Response::Error`. The station may also send
//! `Response::Notify` at any time with request id 0.

use bytes::{BufMut, BytesMut};

use crate::channel::{get_channel, put_channel};
use crate::frame::{FrameError, MAX_PAYLOAD, Opcode, RawFrame};
use crate::sample::{self, SamplePart, SampleRequest};
use crate::value::{Value, get_value, put_value};
use crate::wire::{Reader, Writer};

pub use crate::channel::{ChannelDescriptor, Direction};
pub use crate::wire::PayloadError;

/// What went wrong, as the station reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorCode {
    UnknownChannel = 1,
    ReadOnly = 2,
    BadValue = 3,
    Busy = 4,
    Locked = 5,
    Unsupported = 6,
    Internal = 7,
    /// The request frame's payload could not be decoded.
    Malformed = 8,
    /// No device acknowledged its address on a bus, after the retries.
    Nak = 9,
    /// A bus transaction did not complete in time (a device held the bus).
    BusTimeout = 10,
    /// Line settings the bus cannot take, or an action it does not have.
    BadSettings = 11,
}

impl ErrorCode {
    pub fn from_u8(code: u8) -> Option<ErrorCode> {
        Some(match code {
            1 => ErrorCode::UnknownChannel,
            2 => ErrorCode::ReadOnly,
            3 => ErrorCode::BadValue,
            4 => ErrorCode::Busy,
            5 => ErrorCode::Locked,
            6 => ErrorCode::Unsupported,
            7 => ErrorCode::Internal,
            8 => ErrorCode::Malformed,
            9 => ErrorCode::Nak,
            10 => ErrorCode::BusTimeout,
            11 => ErrorCode::BadSettings,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::UnknownChannel => "unknown channel",
            ErrorCode::ReadOnly => "read only",
            ErrorCode::BadValue => "bad value",
            ErrorCode::Busy => "busy",
            ErrorCode::Locked => "locked",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Internal => "internal",
            ErrorCode::Malformed => "malformed",
            ErrorCode::Nak => "nak",
            ErrorCode::BusTimeout => "bus timeout",
            ErrorCode::BadSettings => "bad settings",
        }
    }
}

/// An error from the station: a code and a message meant for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StationError {
    pub code: ErrorCode,
    pub message: String,
}

impl StationError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> StationError {
        StationError {
            code,
            message: message.into(),
        }
    }
}

/// The outcome of one item of a READ or WRITE.
pub type ItemResult<T> = Result<T, StationError>;

/// HELLO, client to station.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u8,
    /// Who is asking, for the station's log.
    pub client: String,
}

/// HELLO's answer: who the station is and how many requests it takes at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloReply {
    pub version: u8,
    pub station: String,
    pub firmware: String,
    pub serial: String,
    /// Requests the station accepts in flight at once (1 on a serial line).
    pub window: u16,
}

/// One module of the station, for SYSTEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleInfo {
    pub index: u16,
    pub name: String,
    pub product_id: String,
    pub revision: u32,
    pub serial: String,
}

/// The page of `channels` a LIST with `offset` and `limit` gets: at most `limit` descriptors
/// (`0` means as many as fit), never more than fit in one frame, and at least one when any
/// remain and the limit allows one. The reply is `Response::List { total, offset, channels }`.
pub fn list_page(channels: &[ChannelDescriptor], offset: u32, limit: u16) -> Response {
    let limit = if limit == 0 {
        usize::MAX
    } else {
        usize::from(limit)
    };
    // total, offset and count come before the descriptors.
    let mut budget = crate::frame::MAX_PAYLOAD - 10;
    let mut page = Vec::new();
    for descriptor in channels.iter().skip(offset as usize) {
        let size = descriptor.encoded_len();
        if page.len() >= limit || size > budget {
            break;
        }
        budget -= size;
        page.push(descriptor.clone());
    }
    Response::List {
        total: u32::try_from(channels.len()).unwrap_or(u32::MAX),
        offset,
        channels: page,
    }
}

/// What kind of change a configuration NOTIFY announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChangeType {
    Added = 1,
    Removed = 2,
    Changed = 3,
}

impl ChangeType {
    pub fn from_u8(byte: u8) -> Option<ChangeType> {
        Some(match byte {
            1 => ChangeType::Added,
            2 => ChangeType::Removed,
            3 => ChangeType::Changed,
            _ => return None,
        })
    }

    /// As the REST contract's `configuration` event spells it.
    pub fn label(self) -> &'static str {
        match self {
            ChangeType::Added => "Added",
            ChangeType::Removed => "Removed",
            ChangeType::Changed => "Changed",
        }
    }
}

/// An unsolicited message from the station.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notify {
    /// Channels were added, removed or changed: a client should LIST again.
    ConfigurationChanged { change: ChangeType, message: String },
    /// An output switched itself off (IMON above ISET).
    OutputTripped { channel: String, message: String },
}

/// A request, client to station.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Hello(Hello),
    System,
    /// Up to `limit` channel descriptors starting at `offset`.
    List {
        offset: u32,
        limit: u16,
    },
    Read {
        names: Vec<String>,
    },
    Write {
        items: Vec<(String, Value)>,
    },
    /// Write `value` to `name`, then read `name`, as one step.
    Transact {
        name: String,
        value: Value,
    },
    Ping {
        nonce: u64,
    },
    /// Restart the station's application (§6.10).
    Reset(crate::reset::Reset),
    /// Change a channel's configuration (§6.13); no settings only asks for it.
    Configure(crate::configure::Configure),
    /// A NumericResult acquisition; answered by several [`Response::Sample`] frames.
    Sample(SampleRequest),
    /// One bus transaction (SPEC.md §6.11).
    Bus(crate::bus::BusRequest),
}

/// A response or notification, station to client.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Hello(HelloReply),
    System(Vec<ModuleInfo>),
    /// One page of the channel list; `total` is the length of the whole list.
    List {
        total: u32,
        offset: u32,
        channels: Vec<ChannelDescriptor>,
    },
    /// One result per name, in the order asked.
    Read(Vec<ItemResult<Value>>),
    /// One status per item, in the order asked.
    Write(Vec<ItemResult<()>>),
    Transact(Value),
    Ping {
        nonce: u64,
    },
    /// The station restarts its application once this is sent (§6.10).
    Reset,
    Notify(Notify),
    Error(StationError),
    /// The channel's descriptor and configuration after a CONFIGURE (§6.13).
    Configure(Box<crate::configure::ConfigureReply>),
    /// One frame of an acquisition's answer; more follow until [`SamplePart::End`] or ERROR.
    Sample(SamplePart),
    /// The bytes a bus transaction received; their count is the blob's length.
    Bus(bytes::Bytes),
}

fn finish(opcode: Opcode, request_id: u32, payload: BytesMut) -> Result<RawFrame, FrameError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(FrameError::PayloadTooLarge(payload.len()));
    }
    Ok(RawFrame::new(opcode, request_id, payload.freeze()))
}

fn put_error(out: &mut BytesMut, error: &StationError) {
    out.put_u8(error.code as u8);
    out.put_string(&error.message);
}

fn get_error(r: &mut Reader) -> Result<StationError, PayloadError> {
    let code = r.at("error code").u8()?;
    let code = ErrorCode::from_u8(code).ok_or(PayloadError::BadTag("error code", code))?;
    let message = r.at("error message").string()?;
    Ok(StationError { code, message })
}

impl Request {
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello(_) => Opcode::Hello,
            Request::System => Opcode::System,
            Request::List { .. } => Opcode::List,
            Request::Read { .. } => Opcode::Read,
            Request::Write { .. } => Opcode::Write,
            Request::Transact { .. } => Opcode::Transact,
            Request::Ping { .. } => Opcode::Ping,
            Request::Reset(_) => Opcode::Reset,
            Request::Configure(_) => Opcode::Configure,
            Request::Sample(_) => Opcode::Sample,
            Request::Bus(_) => Opcode::Bus,
        }
    }

    /// The request as a frame with `request_id`; fails only when it would not fit in one.
    pub fn to_frame(&self, request_id: u32) -> Result<RawFrame, FrameError> {
        let mut out = BytesMut::new();
        match self {
            Request::Hello(hello) => {
                out.put_u8(hello.version);
                out.put_string(&hello.client);
            }
            Request::System => {}
            Request::List { offset, limit } => {
                out.put_u32(*offset);
                out.put_u16(*limit);
            }
            Request::Read { names } => {
                out.put_count(names.len());
                for name in names {
                    out.put_string(name);
                }
            }
            Request::Write { items } => {
                out.put_count(items.len());
                for (name, value) in items {
                    out.put_string(name);
                    put_value(&mut out, value);
                }
            }
            Request::Transact { name, value } => {
                out.put_string(name);
                put_value(&mut out, value);
            }
            Request::Ping { nonce } => out.put_u64(*nonce),
            Request::Reset(reset) => crate::reset::put(&mut out, reset),
            Request::Configure(configure) => configure.encode(&mut out),
            Request::Sample(request) => sample::put_request(&mut out, request),
            Request::Bus(bus) => crate::bus::put_bus_request(&mut out, bus),
        }
        if self.count_overflows() {
            return Err(FrameError::PayloadTooLarge(usize::MAX));
        }
        finish(self.opcode(), request_id, out)
    }

    fn count_overflows(&self) -> bool {
        match self {
            Request::Read { names } => names.len() > usize::from(u16::MAX),
            Request::Write { items } => items.len() > usize::from(u16::MAX),
            Request::Configure(configure) => configure.settings.len() > usize::from(u16::MAX),
            _ => false,
        }
    }

    /// Reads a request from a frame a client sent.
    pub fn from_frame(frame: &RawFrame) -> Result<Request, PayloadError> {
        let opcode = frame
            .kind()
            .ok_or(PayloadError::UnknownOpcode(frame.opcode))?;
        let mut r = Reader::new(frame.payload.clone());
        let request = match opcode {
            Opcode::Hello => Request::Hello(Hello {
                version: r.at("protocol version").u8()?,
                client: r.at("client name").string()?,
            }),
            Opcode::System => Request::System,
            Opcode::List => Request::List {
                offset: r.at("list offset").u32()?,
                limit: r.at("list limit").u16()?,
            },
            Opcode::Read => {
                let n = r.at("name count").count(2)?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(r.at("channel name").string()?);
                }
                Request::Read { names }
            }
            Opcode::Write => {
                let n = r.at("item count").count(3)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.at("channel name").string()?;
                    items.push((name, get_value(&mut r)?));
                }
                Request::Write { items }
            }
            Opcode::Transact => {
                let name = r.at("channel name").string()?;
                Request::Transact {
                    name,
                    value: get_value(&mut r)?,
                }
            }
            Opcode::Ping => Request::Ping {
                nonce: r.at("ping nonce").u64()?,
            },
            Opcode::Reset => Request::Reset(crate::reset::get(&mut r)?),
            Opcode::Configure => Request::Configure(crate::configure::Configure::decode(&mut r)?),
            Opcode::Sample => Request::Sample(sample::get_request(&mut r)?),
            Opcode::Bus => Request::Bus(crate::bus::get_bus_request(&mut r)?),
            _ => return Err(PayloadError::NotARequest(frame.opcode)),
        };
        r.finish()?;
        Ok(request)
    }
}

impl Response {
    pub fn opcode(&self) -> Opcode {
        match self {
            Response::Hello(_) => Opcode::HelloReply,
            Response::System(_) => Opcode::SystemReply,
            Response::List { .. } => Opcode::ListReply,
            Response::Read(_) => Opcode::ReadReply,
            Response::Write(_) => Opcode::WriteReply,
            Response::Transact(_) => Opcode::TransactReply,
            Response::Ping { .. } => Opcode::PingReply,
            Response::Reset => Opcode::ResetReply,
            Response::Notify(_) => Opcode::Notify,
            Response::Error(_) => Opcode::Error,
            Response::Configure(_) => Opcode::ConfigureReply,
            Response::Sample(_) => Opcode::SampleReply,
            Response::Bus(_) => Opcode::BusReply,
        }
    }

    /// The response as a frame answering `request_id` (0 for a NOTIFY).
    pub fn to_frame(&self, request_id: u32) -> Result<RawFrame, FrameError> {
        let mut out = BytesMut::new();
        let mut items = 0usize;
        match self {
            Response::Hello(h) => {
                out.put_u8(h.version);
                out.put_string(&h.station);
                out.put_string(&h.firmware);
                out.put_string(&h.serial);
                out.put_u16(h.window);
            }
            Response::System(modules) => {
                items = modules.len();
                out.put_count(modules.len());
                for m in modules {
                    out.put_u16(m.index);
                    out.put_string(&m.name);
                    out.put_string(&m.product_id);
                    out.put_u32(m.revision);
                    out.put_string(&m.serial);
                }
            }
            Response::List {
                total,
                offset,
                channels,
            } => {
                items = channels.len();
                out.put_u32(*total);
                out.put_u32(*offset);
                out.put_count(channels.len());
                for ch in channels {
                    put_channel(&mut out, ch);
                }
            }
            Response::Read(results) => {
                items = results.len();
                out.put_count(results.len());
                for result in results {
                    match result {
                        Ok(value) => {
                            out.put_u8(0);
                            put_value(&mut out, value);
                        }
                        Err(error) => {
                            out.put_u8(1);
                            put_error(&mut out, error);
                        }
                    }
                }
            }
            Response::Write(results) => {
                items = results.len();
                out.put_count(results.len());
                for result in results {
                    match result {
                        Ok(()) => out.put_u8(0),
                        Err(error) => {
                            out.put_u8(1);
                            put_error(&mut out, error);
                        }
                    }
                }
            }
            Response::Transact(value) => put_value(&mut out, value),
            Response::Ping { nonce } => out.put_u64(*nonce),
            Response::Reset => {}
            Response::Notify(Notify::ConfigurationChanged { change, message }) => {
                out.put_u8(1);
                out.put_u8(*change as u8);
                out.put_string(message);
            }
            Response::Notify(Notify::OutputTripped { channel, message }) => {
                out.put_u8(2);
                out.put_string(channel);
                out.put_string(message);
            }
            Response::Error(error) => put_error(&mut out, error),
            Response::Configure(reply) => items = reply.encode(&mut out),
            Response::Sample(part) => {
                if !sample::put_part(&mut out, part) {
                    return Err(FrameError::PayloadTooLarge(usize::MAX));
                }
            }
            Response::Bus(received) => out.put_blob(received),
        }
        if items > usize::from(u16::MAX) {
            return Err(FrameError::PayloadTooLarge(usize::MAX));
        }
        finish(self.opcode(), request_id, out)
    }

    /// Reads a response or notification from a frame the station sent.
    pub fn from_frame(frame: &RawFrame) -> Result<Response, PayloadError> {
        let opcode = frame
            .kind()
            .ok_or(PayloadError::UnknownOpcode(frame.opcode))?;
        let mut r = Reader::new(frame.payload.clone());
        let response = match opcode {
            Opcode::HelloReply => Response::Hello(HelloReply {
                version: r.at("protocol version").u8()?,
                station: r.at("station name").string()?,
                firmware: r.at("firmware").string()?,
                serial: r.at("serial number").string()?,
                window: r.at("window").u16()?,
            }),
            Opcode::SystemReply => {
                // The smallest module: index 2, three empty strings 2 each, revision 4.
                let n = r.at("module count").count(12)?;
                let mut modules = Vec::with_capacity(n);
                for _ in 0..n {
                    modules.push(ModuleInfo {
                        index: r.at("module index").u16()?,
                        name: r.at("module name").string()?,
                        product_id: r.at("module product id").string()?,
                        revision: r.at("module revision").u32()?,
                        serial: r.at("module serial number").string()?,
                    });
                }
                Response::System(modules)
            }
            Opcode::ListReply => {
                let total = r.at("list total").u32()?;
                let offset = r.at("list offset").u32()?;
                // The smallest channel: seven empty strings 2 each, flags 4, direction, access,
                // consuming and value type 1 each, option count 2.
                let n = r.at("channel count").count(22)?;
                let mut channels = Vec::with_capacity(n);
                for _ in 0..n {
                    channels.push(get_channel(&mut r)?);
                }
                Response::List {
                    total,
                    offset,
                    channels,
                }
            }
            Opcode::ReadReply => {
                let n = r.at("result count").count(2)?;
                let mut results = Vec::with_capacity(n);
                for _ in 0..n {
                    results.push(match r.at("result status").u8()? {
                        0 => Ok(get_value(&mut r)?),
                        1 => Err(get_error(&mut r)?),
                        other => return Err(PayloadError::BadTag("result status", other)),
                    });
                }
                Response::Read(results)
            }
            Opcode::WriteReply => {
                let n = r.at("status count").count(1)?;
                let mut results = Vec::with_capacity(n);
                for _ in 0..n {
                    results.push(match r.at("write status").u8()? {
                        0 => Ok(()),
                        1 => Err(get_error(&mut r)?),
                        other => return Err(PayloadError::BadTag("write status", other)),
                    });
                }
                Response::Write(results)
            }
            Opcode::TransactReply => Response::Transact(get_value(&mut r)?),
            Opcode::PingReply => Response::Ping {
                nonce: r.at("ping nonce").u64()?,
            },
            Opcode::ResetReply => Response::Reset,
            Opcode::Notify => match r.at("notify kind").u8()? {
                1 => {
                    let change = r.at("change type").u8()?;
                    let change = ChangeType::from_u8(change)
                        .ok_or(PayloadError::BadTag("change type", change))?;
                    let message = r.at("notify message").string()?;
                    Response::Notify(Notify::ConfigurationChanged { change, message })
                }
                2 => Response::Notify(Notify::OutputTripped {
                    channel: r.at("tripped channel").string()?,
                    message: r.at("notify message").string()?,
                }),
                other => return Err(PayloadError::BadTag("notify kind", other)),
            },
            Opcode::Error => Response::Error(get_error(&mut r)?),
            Opcode::ConfigureReply => {
                Response::Configure(Box::new(crate::configure::ConfigureReply::decode(&mut r)?))
            }
            Opcode::SampleReply => Response::Sample(sample::get_part(&mut r)?),
            Opcode::BusReply => Response::Bus(r.at("bus received").bytes()?),
            _ => return Err(PayloadError::NotAResponse(frame.opcode)),
        };
        r.finish()?;
        Ok(response)
    }
}

impl From<StationError> for Response {
    fn from(error: StationError) -> Response {
        Response::Error(error)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::spec_examples::{SpecMessage, spec_examples};
    use crate::value::ValueType;

    fn frame(opcode: u8, payload: &[u8]) -> RawFrame {
        RawFrame {
            opcode,
            request_id: 9,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    /// Every kind of request and response, including every value type and both result kinds.
    fn all_messages() -> Vec<(u32, SpecMessage)> {
        let mut messages: Vec<(u32, SpecMessage)> = spec_examples()
            .into_iter()
            .map(|e| (e.request_id, e.message))
            .collect();
        let empty_module = ModuleInfo {
            index: 0,
            name: String::new(),
            product_id: String::new(),
            revision: 0,
            serial: String::new(),
        };
        let empty_channel = ChannelDescriptor {
            name: String::new(),
            alias: String::new(),
            net_name: String::new(),
            type_flags: 0,
            direction: Direction::In,
            unit: String::new(),
            description: String::new(),
            group: String::new(),
            readable: false,
            writable: false,
            consuming: false,
            value_type: ValueType::Bytes,
            options: Vec::new(),
        };
        let extra = [
            SpecMessage::Request(Request::Read { names: vec![] }),
            SpecMessage::Request(Request::Write { items: vec![] }),
            SpecMessage::Response(Response::System(vec![])),
            SpecMessage::Response(Response::System(vec![empty_module.clone(), empty_module])),
            SpecMessage::Response(Response::List {
                total: 0,
                offset: 0,
                channels: vec![],
            }),
            SpecMessage::Response(Response::List {
                total: 2,
                offset: 1,
                channels: vec![empty_channel],
            }),
            SpecMessage::Response(Response::Read(vec![
                Ok(Value::Bool(false)),
                Ok(Value::Bytes(Bytes::new())),
                Ok(Value::String(String::new())),
            ])),
            SpecMessage::Response(Response::Write(vec![Ok(()), Ok(())])),
            SpecMessage::Response(Response::Notify(Notify::ConfigurationChanged {
                change: ChangeType::Removed,
                message: String::new(),
            })),
        ];
        messages.extend(extra.into_iter().map(|m| (u32::MAX, m)));
        messages
    }

    fn to_frame(message: &SpecMessage, request_id: u32) -> RawFrame {
        match message {
            SpecMessage::Request(r) => r.to_frame(request_id).unwrap(),
            SpecMessage::Response(r) => r.to_frame(request_id).unwrap(),
        }
    }

    fn from_frame(like: &SpecMessage, frame: &RawFrame) -> Result<SpecMessage, PayloadError> {
        Ok(match like {
            SpecMessage::Request(_) => SpecMessage::Request(Request::from_frame(frame)?),
            SpecMessage::Response(_) => SpecMessage::Response(Response::from_frame(frame)?),
        })
    }

    #[test]
    fn every_message_kind_round_trips() {
        for (id, message) in all_messages() {
            let frame = to_frame(&message, id);
            assert_eq!(frame.request_id, id);
            assert_eq!(from_frame(&message, &frame), Ok(message.clone()));
        }
    }

    #[test]
    fn minimal_modules_and_channels_are_not_refused_as_truncated() {
        // One module with empty strings is 12 bytes, one channel 22; the count check that
        // refuses impossible counts must not refuse these.
        let module = ModuleInfo {
            index: 1,
            name: String::new(),
            product_id: String::new(),
            revision: 2,
            serial: String::new(),
        };
        let reply = Response::System(vec![module]);
        let frame = reply.to_frame(1).unwrap();
        assert_eq!(frame.payload.len(), 2 + 12);
        assert_eq!(Response::from_frame(&frame), Ok(reply));
    }

    #[test]
    fn opcodes_are_checked() {
        assert_eq!(
            Request::from_frame(&frame(0x42, &[])),
            Err(PayloadError::UnknownOpcode(0x42))
        );
        assert_eq!(
            Response::from_frame(&frame(0x42, &[])),
            Err(PayloadError::UnknownOpcode(0x42))
        );
        for reply in [0x81, 0x87, Opcode::Notify as u8, Opcode::Error as u8] {
            assert_eq!(
                Request::from_frame(&frame(reply, &[])),
                Err(PayloadError::NotARequest(reply))
            );
        }
        assert_eq!(
            Response::from_frame(&frame(Opcode::System as u8, &[])),
            Err(PayloadError::NotAResponse(0x02))
        );
    }

    #[test]
    fn every_truncation_is_refused_without_panic() {
        for (id, message) in all_messages() {
            let whole = to_frame(&message, id);
            for cut in 0..whole.payload.len() {
                let short = RawFrame {
                    payload: whole.payload.slice(..cut),
                    ..whole.clone()
                };
                match from_frame(&message, &short) {
                    Err(PayloadError::Truncated(field)) => assert!(!field.is_empty()),
                    other => panic!("{message:?} cut at {cut}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn truncation_names_the_field() {
        let hello = frame(Opcode::Hello as u8, &[1, 0, 5, b'a']);
        assert_eq!(
            Request::from_frame(&hello),
            Err(PayloadError::Truncated("client name"))
        );
        assert_eq!(
            Request::from_frame(&frame(Opcode::Ping as u8, &[1, 2, 3])),
            Err(PayloadError::Truncated("ping nonce"))
        );
        assert_eq!(
            Request::from_frame(&frame(Opcode::List as u8, &[0, 0, 0, 0, 1])),
            Err(PayloadError::Truncated("list limit"))
        );
        // A float value with only four of its eight bytes.
        assert_eq!(
            Request::from_frame(&frame(Opcode::Transact as u8, &[0, 1, b'x', 1, 0, 0, 0, 0])),
            Err(PayloadError::Truncated("value"))
        );
        // A count far beyond what the payload holds is refused before anything is allocated.
        assert_eq!(
            Request::from_frame(&frame(Opcode::Read as u8, &[0xFF, 0xFF, 0, 0])),
            Err(PayloadError::Truncated("name count"))
        );
        assert_eq!(
            Response::from_frame(&frame(
                Opcode::ListReply as u8,
                &[0, 0, 0, 9, 0, 0, 0, 0, 0, 9]
            )),
            Err(PayloadError::Truncated("channel count"))
        );
    }

    #[test]
    fn bad_tags_and_text_are_refused() {
        let transact = |value: &[u8]| {
            let mut payload = vec![0, 1, b'x'];
            payload.extend_from_slice(value);
            Request::from_frame(&frame(Opcode::Transact as u8, &payload))
        };
        assert_eq!(transact(&[9]), Err(PayloadError::BadTag("value type", 9)));
        assert_eq!(transact(&[3, 2]), Err(PayloadError::BadTag("value", 2)));
        assert_eq!(
            transact(&[5, 0, 2, 0xC3, 0x28]),
            Err(PayloadError::NotUtf8("value"))
        );
        assert_eq!(transact(&[3, 1, 0]), Err(PayloadError::TrailingBytes(1)));
        assert_eq!(
            Response::from_frame(&frame(Opcode::Error as u8, &[0, 0, 0])),
            Err(PayloadError::BadTag("error code", 0))
        );
        assert_eq!(
            Response::from_frame(&frame(Opcode::ReadReply as u8, &[0, 1, 2, 0, 0])),
            Err(PayloadError::BadTag("result status", 2))
        );
        assert_eq!(
            Response::from_frame(&frame(Opcode::Notify as u8, &[3, 0, 0])),
            Err(PayloadError::BadTag("notify kind", 3))
        );
        assert_eq!(
            Response::from_frame(&frame(Opcode::Notify as u8, &[1, 4, 0, 0])),
            Err(PayloadError::BadTag("change type", 4))
        );
        // A channel with access bits 4.
        let mut list = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 1];
        list.extend_from_slice(&[
            0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 4, 0, 1, 0, 0,
        ]);
        assert_eq!(
            Response::from_frame(&frame(Opcode::ListReply as u8, &list)),
            Err(PayloadError::BadTag("channel access", 4))
        );
        list[10 + 17] = 3;
        assert!(Response::from_frame(&frame(Opcode::ListReply as u8, &list)).is_ok());
        list[10 + 10] = 0;
        assert_eq!(
            Response::from_frame(&frame(Opcode::ListReply as u8, &list)),
            Err(PayloadError::BadTag("channel direction", 0))
        );
    }

    #[test]
    fn oversized_messages_are_refused() {
        let names = vec!["x".repeat(1000); 70];
        assert_eq!(
            Request::Read { names }.to_frame(1),
            Err(FrameError::PayloadTooLarge(70 * 1002 + 2))
        );
        let items = vec![(String::new(), Value::Bool(true)); 70_000];
        assert!(Request::Write { items }.to_frame(1).is_err());
        assert!(Response::Write(vec![Ok(()); 70_000]).to_frame(1).is_err());
        let error = StationError::new(ErrorCode::Internal, "e".repeat(MAX_PAYLOAD));
        assert!(Response::Error(error).to_frame(1).is_err());
        // The largest message that fits is accepted.
        let error = StationError::new(ErrorCode::Internal, "e".repeat(MAX_PAYLOAD - 3));
        let frame = Response::Error(error.clone()).to_frame(1).unwrap();
        assert_eq!(frame.payload.len(), MAX_PAYLOAD);
        assert_eq!(Response::from_frame(&frame), Ok(Response::Error(error)));
    }

    #[test]
    fn overlong_text_is_refused_not_cut() {
        // 65 536 bytes whose byte 65 535 is inside a character: cutting it at a character
        // boundary would leave a payload that fits, silently losing the text's end.
        let text = format!("{}{}", "a".repeat(65_532), '\u{1F600}');
        let hello = Request::Hello(Hello {
            version: 1,
            client: text.clone(),
        });
        assert!(matches!(
            hello.to_frame(1),
            Err(FrameError::PayloadTooLarge(_))
        ));
        let error = Response::Error(StationError::new(ErrorCode::Internal, text));
        assert!(matches!(
            error.to_frame(1),
            Err(FrameError::PayloadTooLarge(_))
        ));
    }

    // Property tests: arbitrary messages survive a round trip bit for bit.

    fn arb_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9._ ]{0,12}",
            any::<String>().prop_map(|s| s.chars().take(8).collect()),
        ]
    }

    fn arb_float() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(-f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-0.0),
            any::<u64>().prop_map(f64::from_bits),
        ]
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            arb_float().prop_map(Value::Float),
            any::<i64>().prop_map(Value::Integer),
            any::<bool>().prop_map(Value::Bool),
            arb_text().prop_map(Value::Enum),
            arb_text().prop_map(Value::String),
            proptest::collection::vec(any::<u8>(), 0..16).prop_map(|b| Value::Bytes(b.into())),
        ]
    }

    fn arb_error() -> impl Strategy<Value = StationError> {
        (1u8..=11, arb_text()).prop_map(|(code, message)| StationError {
            code: ErrorCode::from_u8(code).unwrap(),
            message,
        })
    }

    fn arb_channel() -> impl Strategy<Value = ChannelDescriptor> {
        (
            (arb_text(), arb_text(), arb_text(), any::<u32>(), 1u8..=3),
            (arb_text(), arb_text(), arb_text()),
            (any::<bool>(), any::<bool>(), any::<bool>(), 1u8..=6),
            proptest::collection::vec(arb_text(), 0..4),
        )
            .prop_map(
                |(
                    (name, alias, net_name, type_flags, direction),
                    (unit, description, group),
                    (readable, writable, consuming, value_type),
                    options,
                )| ChannelDescriptor {
                    name,
                    alias,
                    net_name,
                    type_flags,
                    direction: Direction::from_u8(direction).unwrap(),
                    unit,
                    description,
                    group,
                    readable,
                    writable,
                    consuming,
                    value_type: ValueType::from_u8(value_type).unwrap(),
                    options,
                },
            )
    }

    fn arb_bus_request() -> impl Strategy<Value = crate::bus::BusRequest> {
        use crate::bus::{BusAction, BusRequest, FlowControl, Parity, UartBusType, UartLine};
        let line = (
            (any::<u32>(), 1u8..=3, 1u8..=6, 1u8..=5),
            (any::<bool>(), any::<u8>(), any::<u32>()),
        )
            .prop_map(
                |((baud, bus, flow, parity), (use_termination, termination_byte, timeout_ms))| {
                    UartLine {
                        baud,
                        bus_type: UartBusType::from_u8(bus).unwrap(),
                        flow_control: FlowControl::from_u8(flow).unwrap(),
                        parity: Parity::from_u8(parity).unwrap(),
                        use_termination,
                        termination_byte,
                        timeout_ms,
                    }
                },
            );
        (
            (arb_text(), 1u8..=5, any::<u8>(), any::<u8>(), any::<u16>()),
            proptest::collection::vec(any::<u8>(), 0..16),
            proptest::option::of(line),
        )
            .prop_map(
                |((channel, action, address, retries, receive), data, line)| BusRequest {
                    channel,
                    action: BusAction::from_u8(action).unwrap(),
                    address,
                    retries,
                    receive,
                    data: Bytes::from(data),
                    line,
                },
            )
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (any::<u8>(), arb_text())
                .prop_map(|(version, client)| Request::Hello(Hello { version, client })),
            Just(Request::System),
            (any::<u32>(), any::<u16>())
                .prop_map(|(offset, limit)| Request::List { offset, limit }),
            proptest::collection::vec(arb_text(), 0..6).prop_map(|names| Request::Read { names }),
            proptest::collection::vec((arb_text(), arb_value()), 0..6)
                .prop_map(|items| Request::Write { items }),
            (arb_text(), arb_value()).prop_map(|(name, value)| Request::Transact { name, value }),
            any::<u64>().prop_map(|nonce| Request::Ping { nonce }),
            arb_text().prop_map(|requester| Request::Reset(crate::reset::Reset { requester })),
            (
                arb_text(),
                proptest::collection::vec((arb_text(), arb_value()), 0..4)
            )
                .prop_map(|(name, settings)| Request::Configure(
                    crate::configure::Configure { name, settings }
                )),
            arb_bus_request().prop_map(Request::Bus),
        ]
    }

    fn arb_response() -> impl Strategy<Value = Response> {
        let module = (
            any::<u16>(),
            arb_text(),
            arb_text(),
            any::<u32>(),
            arb_text(),
        )
            .prop_map(|(index, name, product_id, revision, serial)| ModuleInfo {
                index,
                name,
                product_id,
                revision,
                serial,
            });
        prop_oneof![
            (
                any::<u8>(),
                arb_text(),
                arb_text(),
                arb_text(),
                any::<u16>()
            )
                .prop_map(|(version, station, firmware, serial, window)| {
                    Response::Hello(HelloReply {
                        version,
                        station,
                        firmware,
                        serial,
                        window,
                    })
                }),
            proptest::collection::vec(module, 0..4).prop_map(Response::System),
            (
                any::<u32>(),
                any::<u32>(),
                proptest::collection::vec(arb_channel(), 0..4)
            )
                .prop_map(|(total, offset, channels)| Response::List {
                    total,
                    offset,
                    channels
                }),
            proptest::collection::vec(
                prop_oneof![arb_value().prop_map(Ok), arb_error().prop_map(Err)],
                0..6
            )
            .prop_map(Response::Read),
            proptest::collection::vec(prop_oneof![Just(Ok(())), arb_error().prop_map(Err)], 0..6)
                .prop_map(Response::Write),
            arb_value().prop_map(Response::Transact),
            any::<u64>().prop_map(|nonce| Response::Ping { nonce }),
            Just(Response::Reset),
            proptest::collection::vec(any::<u8>(), 0..16)
                .prop_map(|b| Response::Bus(Bytes::from(b))),
            (1u8..=3, arb_text()).prop_map(|(change, message)| Response::Notify(
                Notify::ConfigurationChanged {
                    change: ChangeType::from_u8(change).unwrap(),
                    message
                }
            )),
            (arb_text(), arb_text()).prop_map(|(channel, message)| Response::Notify(
                Notify::OutputTripped { channel, message }
            )),
            arb_error().prop_map(Response::Error),
            (
                arb_channel(),
                any::<bool>(),
                1u8..=3,
                any::<u32>(),
                arb_text(),
                proptest::option::of((-1e6f64..1e6, -1e6f64..1e6)),
                proptest::collection::vec((arb_text(), arb_value()), 0..4),
            )
                .prop_map(
                    |(channel, enabled, capability, type_capability, device, limits, details)| {
                        Response::Configure(Box::new(crate::configure::ConfigureReply {
                            channel,
                            config: crate::configure::ChannelConfig {
                                enabled,
                                capability: Direction::from_u8(capability).unwrap(),
                                type_capability,
                                device,
                                limits,
                                details,
                            },
                        }))
                    }
                ),
        ]
    }

    /// NaN is not equal to itself, so messages holding one are compared on their encoding only.
    fn has_nan(values: &[&Value]) -> bool {
        values
            .iter()
            .any(|v| matches!(v, Value::Float(x) if x.is_nan()))
    }

    fn request_values(request: &Request) -> Vec<&Value> {
        match request {
            Request::Write { items } => items.iter().map(|(_, v)| v).collect(),
            Request::Transact { value, .. } => vec![value],
            Request::Configure(configure) => configure.settings.iter().map(|(_, v)| v).collect(),
            _ => vec![],
        }
    }

    fn response_values(response: &Response) -> Vec<&Value> {
        match response {
            Response::Read(results) => results.iter().filter_map(|r| r.as_ref().ok()).collect(),
            Response::Transact(value) => vec![value],
            Response::Configure(reply) => reply.config.details.iter().map(|(_, v)| v).collect(),
            _ => vec![],
        }
    }

    proptest! {
        #[test]
        fn any_request_round_trips(request in arb_request(), id in any::<u32>()) {
            let frame = request.to_frame(id).unwrap();
            prop_assert_eq!(frame.opcode, request.opcode() as u8);
            prop_assert_eq!(frame.request_id, id);
            let decoded = Request::from_frame(&frame).unwrap();
            // Bit for bit, NaN payloads and the sign of zero included.
            prop_assert_eq!(&decoded.to_frame(id).unwrap(), &frame);
            if !has_nan(&request_values(&request)) {
                prop_assert_eq!(decoded, request);
            }
        }

        #[test]
        fn any_response_round_trips(response in arb_response(), id in any::<u32>()) {
            let frame = response.to_frame(id).unwrap();
            prop_assert_eq!(frame.opcode, response.opcode() as u8);
            let decoded = Response::from_frame(&frame).unwrap();
            prop_assert_eq!(&decoded.to_frame(id).unwrap(), &frame);
            if !has_nan(&response_values(&response)) {
                prop_assert_eq!(decoded, response);
            }
        }

        #[test]
        fn any_payload_decodes_or_errs_without_panic(
            opcode in any::<u8>(),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let frame = frame(opcode, &payload);
            // Whatever decodes must encode back to the same bytes.
            if let Ok(request) = Request::from_frame(&frame) {
                prop_assert_eq!(request.to_frame(9).unwrap(), frame.clone());
            }
            if let Ok(response) = Response::from_frame(&frame) {
                prop_assert_eq!(response.to_frame(9).unwrap(), frame);
            }
        }
    }
}
