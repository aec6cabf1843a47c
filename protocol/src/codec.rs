//! A tokio-util `Decoder`/`Encoder` for [`RawFrame`] that finds its way back to a frame
//! boundary after garbage or a corrupt frame, without losing the good frames that follow.
//!
//! The decoder never returns an error for bad input: a tokio-util framed stream ends at its
//! first error, and a serial line full of noise must keep working. What it drops is counted in
//! [`CodecStats`] instead.

use bytes::{Buf, BufMut, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::frame::{
    FRAME_CRC, FrameError, HEADER_CRC, HEADER_LEN, MAX_PAYLOAD, PROTOCOL_VERSION, RawFrame, SYNC,
    TRAILER_LEN,
};

/// What the decoder has seen and dropped since it was made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CodecStats {
    /// Frames decoded and handed on.
    pub frames: u64,
    /// Bytes skipped while looking for a sync pattern.
    pub skipped_bytes: u64,
    /// Candidate headers refused (wrong version or header CRC).
    pub header_errors: u64,
    /// Whole frames refused for a wrong frame CRC.
    pub crc_errors: u64,
}

/// The station byte protocol's codec, the same over TCP and a serial line.
#[derive(Debug, Default)]
pub struct StationCodec {
    stats: CodecStats,
}

impl StationCodec {
    pub fn new() -> StationCodec {
        StationCodec::default()
    }

    /// Counters of decoded and dropped input.
    pub fn stats(&self) -> CodecStats {
        self.stats
    }

    /// Drops everything before the next sync pattern; true when one is at the front.
    fn skip_to_sync(&mut self, src: &mut BytesMut) -> bool {
        match src.windows(2).position(|w| w == SYNC) {
            Some(0) => true,
            Some(at) => {
                self.stats.skipped_bytes += at as u64;
                src.advance(at);
                true
            }
            None => {
                // Keep a trailing first sync byte: its partner may be in the next read.
                let keep = usize::from(src.last() == Some(&SYNC[0]));
                let drop = src.len() - keep;
                self.stats.skipped_bytes += drop as u64;
                src.advance(drop);
                false
            }
        }
    }
}

impl Decoder for StationCodec {
    type Item = RawFrame;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<RawFrame>, std::io::Error> {
        loop {
            if !self.skip_to_sync(src) || src.len() < HEADER_LEN {
                return Ok(None);
            }
            let header_crc = u16::from_be_bytes([src[10], src[11]]);
            if src[2] != PROTOCOL_VERSION || HEADER_CRC.checksum(&src[2..10]) != header_crc {
                self.stats.header_errors += 1;
                src.advance(1);
                continue;
            }
            // The length is 16 bits, so it can never ask for more than MAX_PAYLOAD; the header
            // CRC has vouched for it before a single byte is reserved.
            let payload_len = usize::from(u16::from_be_bytes([src[8], src[9]]));
            debug_assert!(payload_len <= MAX_PAYLOAD);
            let frame_len = HEADER_LEN + payload_len + TRAILER_LEN;
            if src.len() < frame_len {
                src.reserve(frame_len - src.len());
                return Ok(None);
            }
            let body_end = HEADER_LEN + payload_len;
            let frame_crc = u32::from_be_bytes([
                src[body_end],
                src[body_end + 1],
                src[body_end + 2],
                src[body_end + 3],
            ]);
            if FRAME_CRC.checksum(&src[2..body_end]) != frame_crc {
                // Drop only the sync byte: a good frame may start inside this bad one.
                self.stats.crc_errors += 1;
                src.advance(1);
                continue;
            }
            let opcode = src[3];
            let request_id = u32::from_be_bytes([src[4], src[5], src[6], src[7]]);
            let mut frame = src.split_to(frame_len);
            frame.advance(HEADER_LEN);
            frame.truncate(payload_len);
            self.stats.frames += 1;
            return Ok(Some(RawFrame {
                opcode,
                request_id,
                payload: frame.freeze(),
            }));
        }
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

impl Encoder<RawFrame> for StationCodec {
    type Error = std::io::Error;

    fn encode(&mut self, frame: RawFrame, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        encode_frame(&frame, dst)
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))
    }
}

impl Encoder<&RawFrame> for StationCodec {
    type Error = std::io::Error;

    fn encode(&mut self, frame: &RawFrame, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        encode_frame(frame, dst)
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))
    }
}
