//! Typed requests and responses, and their payload encodings.
//!
//! A request frame carries one [`Request`]; its answer carries the same request id and either
//! the matching [`Response`] or `Response::Error`. The station may also send
//! `Response::Notify` at any time with request id 0.

use bytes::{BufMut, BytesMut};

use crate::frame::{FrameError, MAX_PAYLOAD, Opcode, RawFrame};
use crate::value::{Value, ValueType};
use crate::wire::{Reader, Writer};

/// Why a frame's payload is not the message its opcode announces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("opcode 0x{0:02X} is not defined by this protocol version")]
    UnknownOpcode(u8),
    #[error("opcode 0x{0:02X} is not a request")]
    NotARequest(u8),
    #[error("opcode 0x{0:02X} is not a response")]
    NotAResponse(u8),
    #[error("payload ends inside {0}")]
    Truncated(&'static str),
    #[error("{0} has an undefined tag {1}")]
    BadTag(&'static str, u8),
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("{0} bytes left over after the message")]
    TrailingBytes(usize),
}

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
    Notify(Notify),
    Error(StationError),
}

fn finish(opcode: Opcode, request_id: u32, payload: BytesMut) -> Result<RawFrame, FrameError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(FrameError::PayloadTooLarge(payload.len()));
    }
    Ok(RawFrame::new(opcode, request_id, payload.freeze()))
}

fn put_value(out: &mut BytesMut, value: &Value) {
    out.put_u8(value.value_type() as u8);
    match value {
        Value::Float(x) => out.put_f64(*x),
        Value::Integer(i) => out.put_i64(*i),
        Value::Bool(b) => out.put_u8(u8::from(*b)),
        Value::Enum(s) | Value::String(s) => out.put_string(s),
        Value::Bytes(b) => out.put_blob(b),
    }
}

fn get_value(r: &mut Reader) -> Result<Value, PayloadError> {
    let tag = r.at("value type").u8()?;
    let kind = ValueType::from_u8(tag).ok_or(PayloadError::BadTag("value type", tag))?;
    r.at("value");
    Ok(match kind {
        ValueType::Float => Value::Float(r.f64()?),
        ValueType::Integer => Value::Integer(r.i64()?),
        ValueType::Bool => Value::Bool(r.bool()?),
        ValueType::Enum => Value::Enum(r.string()?),
        ValueType::String => Value::String(r.string()?),
        ValueType::Bytes => Value::Bytes(r.bytes()?),
    })
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

fn put_channel(out: &mut BytesMut, ch: &ChannelDescriptor) {
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

fn get_channel(r: &mut Reader) -> Result<ChannelDescriptor, PayloadError> {
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
            Response::Notify(_) => Opcode::Notify,
            Response::Error(_) => Opcode::Error,
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
                let n = r.at("module count").count(16)?;
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
                let n = r.at("channel count").count(26)?;
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
