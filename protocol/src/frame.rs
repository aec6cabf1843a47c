//! The frame envelope: constants, opcodes, the raw frame and its checksums.
//!
//! ```text
//! offset size  field
//! 0      2     sync            0xA5 0x5A
//! 2      1     version         0x01
//! 3      1     opcode
//! 4      4     request id      u32, big-endian (0 for NOTIFY)
//! 8      2     payload length  u16, big-endian (0..=65535)
//! 10     2     header CRC      CRC-16/IBM-3740 of bytes 2..10
//! 12     n     payload
//! 12+n   4     frame CRC       CRC-32/ISO-HDLC of bytes 2..12+n
//! ```

use bytes::{BufMut, Bytes, BytesMut};
use crc::{CRC_16_IBM_3740, CRC_32_ISO_HDLC, Crc};

/// The two bytes every frame starts with.
pub const SYNC: [u8; 2] = [0xA5, 0x5A];
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 12;
/// Bytes after the payload.
pub const TRAILER_LEN: usize = 4;
/// The largest payload a frame may carry; the length field cannot say more.
pub const MAX_PAYLOAD: usize = u16::MAX as usize;
/// The largest frame on the wire.
pub const MAX_FRAME: usize = HEADER_LEN + MAX_PAYLOAD + TRAILER_LEN;

pub(crate) const HEADER_CRC: Crc<u16> = Crc::<u16>::new(&CRC_16_IBM_3740);
pub(crate) const FRAME_CRC: Crc<u32> = Crc::<u32>::new(&CRC_32_ISO_HDLC);

/// What a frame asks or answers. A response carries its request's opcode with the high bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Hello = 0x01,
    System = 0x02,
    List = 0x03,
    Read = 0x04,
    Write = 0x05,
    Transact = 0x06,
    Ping = 0x07,
    /// Unsolicited, station to client, request id 0.
    Notify = 0x08,
    /// Restart the station's application (SPEC.md §6.10).
    Reset = 0x09,
    Configure = 0x0C,
    /// A NumericResult acquisition, answered by several reply frames (SPEC.md §6.12).
    Sample = 0x0B,
    /// One transaction on a bus channel (SPEC.md §6.11).
    Bus = 0x0A,
    HelloReply = 0x81,
    SystemReply = 0x82,
    ListReply = 0x83,
    ReadReply = 0x84,
    WriteReply = 0x85,
    TransactReply = 0x86,
    PingReply = 0x87,
    ResetReply = 0x89,
    ConfigureReply = 0x8C,
    SampleReply = 0x8B,
    BusReply = 0x8A,
    /// The request as a whole failed; carries an error code and message.
    Error = 0xFF,
}

impl Opcode {
    /// The opcode for a byte, or `None` for one this version does not define.
    pub fn from_u8(byte: u8) -> Option<Opcode> {
        Some(match byte {
            0x01 => Opcode::Hello,
            0x02 => Opcode::System,
            0x03 => Opcode::List,
            0x04 => Opcode::Read,
            0x05 => Opcode::Write,
            0x06 => Opcode::Transact,
            0x07 => Opcode::Ping,
            0x08 => Opcode::Notify,
            0x09 => Opcode::Reset,
            0x0C => Opcode::Configure,
            0x0B => Opcode::Sample,
            0x0A => Opcode::Bus,
            0x81 => Opcode::HelloReply,
            0x82 => Opcode::SystemReply,
            0x83 => Opcode::ListReply,
            0x84 => Opcode::ReadReply,
            0x85 => Opcode::WriteReply,
            0x86 => Opcode::TransactReply,
            0x87 => Opcode::PingReply,
            0x89 => Opcode::ResetReply,
            0x8C => Opcode::ConfigureReply,
            0x8B => Opcode::SampleReply,
            0x8A => Opcode::BusReply,
            0xFF => Opcode::Error,
            _ => return None,
        })
    }
}

/// One frame as it travels: opcode byte, request id and payload, checksums already verified.
///
/// The opcode is kept as a byte so that a frame with an opcode this version does not know
/// still reaches the layer that can answer it with `Unsupported`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    pub opcode: u8,
    pub request_id: u32,
    pub payload: Bytes,
}

impl RawFrame {
    pub fn new(opcode: Opcode, request_id: u32, payload: impl Into<Bytes>) -> RawFrame {
        RawFrame {
            opcode: opcode as u8,
            request_id,
            payload: payload.into(),
        }
    }

    /// The typed opcode, when this version defines it.
    pub fn kind(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }

    /// The frame's bytes on the wire.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FrameError> {
        let mut out = BytesMut::new();
        encode_frame(self, &mut out)?;
        Ok(out.to_vec())
    }
}

/// Appends `frame`'s wire bytes to `dst`.
pub(crate) fn encode_frame(frame: &RawFrame, dst: &mut BytesMut) -> Result<(), FrameError> {
    let payload_len = frame.payload.len();
    if payload_len > MAX_PAYLOAD {
        return Err(FrameError::PayloadTooLarge(payload_len));
    }
    dst.reserve(HEADER_LEN + payload_len + TRAILER_LEN);
    let start = dst.len();
    dst.put_slice(&SYNC);
    dst.put_u8(PROTOCOL_VERSION);
    dst.put_u8(frame.opcode);
    dst.put_u32(frame.request_id);
    dst.put_u16(payload_len as u16);
    let header_crc = HEADER_CRC.checksum(&dst[start + 2..start + 10]);
    dst.put_u16(header_crc);
    dst.put_slice(&frame.payload);
    let frame_crc = FRAME_CRC.checksum(&dst[start + 2..]);
    dst.put_u32(frame_crc);
    Ok(())
}

/// Why a frame could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("payload of {0} bytes is over the {MAX_PAYLOAD}-byte limit of one frame")]
    PayloadTooLarge(usize),
}
