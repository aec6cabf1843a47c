//! The station byte protocol: frames, typed messages, values and a tokio-util codec.
//!
//! The crate is pure: it knows nothing of sockets, runtimes or the gateway.
//! `SPEC.md` beside this crate is the normative description of the wire format.
//!
//! Layers, bottom up:
//! - [`frame`]: the envelope (sync, version, opcode, request id, length, CRCs).
//! - [`codec`]: a tokio-util `Decoder`/`Encoder` for [`RawFrame`] that resynchronises on garbage.
//! - `wire` (private): the payload primitives (`Reader`, `Writer`) and [`PayloadError`].
//! - [`value`]: typed values, their payload encoding and their rendering in the station's REST
//!   value format.
//! - `channel` (private): [`ChannelDescriptor`] and [`Direction`] with their payload encoding.
//! - [`configure`], [`bus`], [`reset`], [`sample`]: one operation's payloads each, built on the
//!   three above.
//! - [`message`]: the typed requests and responses carried in frame payloads; it hooks every
//!   operation's payloads into [`Request`] and [`Response`].
//!
//! [`spec_examples`] holds one example frame of every kind, as `SPEC.md` shows them.

pub mod bus;
mod channel;
pub mod codec;
pub mod configure;
pub mod frame;
pub mod message;
pub mod reset;
pub mod sample;
pub mod spec_examples;
pub mod value;
mod wire;

pub use bus::{BusAction, BusRequest, FlowControl, Parity, UartBusType, UartLine};
pub use codec::{CodecStats, StationCodec};
pub use configure::{ChannelConfig, Configure, ConfigureReply};
pub use frame::{FrameError, MAX_PAYLOAD, Opcode, PROTOCOL_VERSION, RawFrame};
pub use message::{
    ChangeType, ChannelDescriptor, Direction, ErrorCode, Hello, HelloReply, ItemResult, ModuleInfo,
    Notify, PayloadError, Request, Response, StationError, list_page,
};
pub use reset::Reset;
pub use sample::{SampleEnd, SamplePart, SampleRequest};
pub use value::{Value, ValueError, ValueType};
