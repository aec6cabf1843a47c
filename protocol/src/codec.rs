//! A tokio-util `Decoder`/`Encoder` for [`RawFrame`] that finds its way back to a frame
//! boundary after garbage or a corrupt frame, without losing the good frames that follow.
//!
//! The decoder never returns an error for bad input: a tokio-util framed stream ends at its
//! first error, and a serial line full of noise must keep working. What it drops is counted in
//! [`CodecStats`] instead.

use bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::frame::{
    FRAME_CRC, HEADER_CRC, HEADER_LEN, MAX_PAYLOAD, PROTOCOL_VERSION, RawFrame, SYNC, TRAILER_LEN,
    encode_frame,
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    use super::*;
    use crate::frame::{FrameError, MAX_FRAME, Opcode};
    use crate::message::{Request, Response};
    use crate::spec_examples::{SpecMessage, spec_examples};

    /// One frame of every kind, plus an empty and a maximal payload.
    fn frames() -> Vec<RawFrame> {
        let mut frames: Vec<RawFrame> =
            spec_examples().iter().map(|e| e.frame().unwrap()).collect();
        frames.push(RawFrame::new(Opcode::Ping, u32::MAX, Bytes::new()));
        frames.push(RawFrame {
            opcode: 0x42,
            request_id: 0xDEAD_BEEF,
            payload: Bytes::from_static(&[0xA5, 0x5A, 0x01, 0xA5]),
        });
        frames
    }

    fn wire(frames: &[RawFrame]) -> BytesMut {
        let mut out = BytesMut::new();
        let mut codec = StationCodec::new();
        for frame in frames {
            codec.encode(frame, &mut out).unwrap();
        }
        out
    }

    /// Decodes everything `chunks` deliver, fed one chunk at a time.
    fn decode_chunks<'a>(
        codec: &mut StationCodec,
        chunks: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<RawFrame> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(frame) = codec.decode(&mut buf).unwrap() {
                out.push(frame);
            }
        }
        out
    }

    fn decode_all(codec: &mut StationCodec, bytes: &[u8]) -> Vec<RawFrame> {
        decode_chunks(codec, [bytes])
    }

    #[test]
    fn every_frame_kind_round_trips() {
        for frame in frames() {
            let mut codec = StationCodec::new();
            let mut buf = BytesMut::new();
            codec.encode(frame.clone(), &mut buf).unwrap();
            assert_eq!(buf.len(), HEADER_LEN + frame.payload.len() + TRAILER_LEN);
            assert_eq!(buf.to_vec(), frame.to_bytes().unwrap());
            assert_eq!(codec.decode(&mut buf).unwrap(), Some(frame.clone()));
            assert!(buf.is_empty());
            assert_eq!(codec.stats().frames, 1);
        }
    }

    #[test]
    fn every_message_survives_the_codec() {
        let mut codec = StationCodec::new();
        let examples = spec_examples();
        let frames: Vec<RawFrame> = examples.iter().map(|e| e.frame().unwrap()).collect();
        let decoded = decode_all(&mut codec, &wire(&frames));
        assert_eq!(decoded.len(), examples.len());
        for (example, frame) in examples.iter().zip(&decoded) {
            assert_eq!(frame.request_id, example.request_id);
            let message = match example.message {
                SpecMessage::Request(_) => {
                    SpecMessage::Request(Request::from_frame(frame).unwrap())
                }
                SpecMessage::Response(_) => {
                    SpecMessage::Response(Response::from_frame(frame).unwrap())
                }
            };
            assert_eq!(message, example.message);
        }
    }

    #[test]
    fn input_split_at_every_byte_boundary_decodes_the_same() {
        let frames = frames();
        let bytes = wire(&frames);
        for at in 0..=bytes.len() {
            let mut codec = StationCodec::new();
            let decoded = decode_chunks(&mut codec, [&bytes[..at], &bytes[at..]]);
            assert_eq!(decoded, frames, "split at {at}");
            assert_eq!(codec.stats().skipped_bytes, 0);
        }
        let mut codec = StationCodec::new();
        assert_eq!(decode_chunks(&mut codec, bytes.chunks(1)), frames);
        assert_eq!(
            codec.stats(),
            CodecStats {
                frames: frames.len() as u64,
                ..CodecStats::default()
            }
        );
    }

    #[test]
    fn garbage_before_and_between_frames_is_skipped_and_counted() {
        let frames = frames();
        let garbage: &[&[u8]] = &[b"hello\r\n", &[0x00, 0xFF, 0x5A, 0x5A], &[0xA5], b"x"];
        let mut bytes = Vec::new();
        for (i, frame) in frames.iter().enumerate() {
            bytes.extend_from_slice(garbage[i % garbage.len()]);
            bytes.extend_from_slice(&frame.to_bytes().unwrap());
        }
        bytes.extend_from_slice(b"trailing");
        let skipped: usize = (0..frames.len())
            .map(|i| garbage[i % garbage.len()].len())
            .sum::<usize>()
            + b"trailing".len();
        let mut codec = StationCodec::new();
        assert_eq!(decode_all(&mut codec, &bytes), frames);
        let stats = codec.stats();
        assert_eq!(stats.frames, frames.len() as u64);
        assert_eq!(stats.skipped_bytes, skipped as u64);
        assert_eq!((stats.header_errors, stats.crc_errors), (0, 0));

        // The same, a byte at a time.
        let mut codec = StationCodec::new();
        assert_eq!(decode_chunks(&mut codec, bytes.chunks(1)), frames);
        assert_eq!(codec.stats(), stats);
    }

    #[test]
    fn a_false_sync_in_garbage_is_refused_by_its_header() {
        let good = RawFrame::new(Opcode::Ping, 7, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        // A sync pattern followed by a header that is not one: wrong version, then wrong CRC.
        let mut bytes = vec![0xA5, 0x5A, 0x02, 0x07, 0, 0, 0, 7, 0, 8, 0, 0];
        bytes.extend_from_slice(&[0xA5, 0x5A, 0x01, 0x07, 0, 0, 0, 7, 0, 8, 0, 0]);
        bytes.extend_from_slice(&good.to_bytes().unwrap());
        let mut codec = StationCodec::new();
        assert_eq!(decode_all(&mut codec, &bytes), vec![good]);
        assert_eq!(codec.stats().header_errors, 2);
        assert_eq!(codec.stats().skipped_bytes, 22);
    }

    #[test]
    fn a_corrupt_frame_is_dropped_and_the_next_is_decoded() {
        let frames = frames();
        let sizes: Vec<usize> = frames.iter().map(|f| f.to_bytes().unwrap().len()).collect();
        let clean = wire(&frames);
        // Corrupt, in the second frame: a payload byte, a frame CRC byte, a header byte.
        let start = sizes[0];
        for (offset, header_error) in [(HEADER_LEN, false), (sizes[1] - 1, false), (5, true)] {
            let mut bytes = clean.to_vec();
            bytes[start + offset] ^= 0x10;
            let mut codec = StationCodec::new();
            let decoded = decode_all(&mut codec, &bytes);
            let mut expected = frames.clone();
            expected.remove(1);
            assert_eq!(decoded, expected, "corrupt byte {offset} of frame 1");
            let stats = codec.stats();
            assert_eq!(stats.frames, expected.len() as u64);
            assert_eq!(stats.crc_errors, u64::from(!header_error));
            assert_eq!(stats.header_errors, u64::from(header_error));
            assert_eq!(stats.skipped_bytes, sizes[1] as u64 - 1);
        }
    }

    #[test]
    fn a_frame_after_a_fake_header_with_a_huge_length_is_found() {
        let good = RawFrame::new(Opcode::Read, 3, vec![0, 0]);
        // A header claiming 65 535 payload bytes whose CRC does not vouch for it: the decoder
        // must not wait for 64 KiB before it looks at the good frame that follows.
        let mut bytes = vec![0xA5, 0x5A, 0x01, 0x04, 0, 0, 0, 3, 0xFF, 0xFF, 0x12, 0x34];
        bytes.extend_from_slice(&good.to_bytes().unwrap());
        let mut codec = StationCodec::new();
        assert_eq!(decode_all(&mut codec, &bytes), vec![good.clone()]);
        assert_eq!(codec.stats().header_errors, 1);

        // A header with a good CRC and a huge length, cut off after a few bytes: the frame CRC
        // fails once its 64 KiB have arrived, and the frame inside it is found on rescanning.
        let mut fake = vec![0xA5, 0x5A, 0x01, 0x04, 0, 0, 0, 3, 0xFF, 0xFF];
        fake.extend_from_slice(&HEADER_CRC.checksum(&fake[2..10]).to_be_bytes());
        fake.extend_from_slice(&[0x00; 5]);
        fake.extend_from_slice(&good.to_bytes().unwrap());
        fake.resize(MAX_FRAME + 1000, 0x00);
        fake.extend_from_slice(&good.to_bytes().unwrap());
        let mut codec = StationCodec::new();
        assert_eq!(
            decode_chunks(&mut codec, fake.chunks(4096)),
            vec![good.clone(), good]
        );
        assert_eq!(codec.stats().crc_errors, 1);
    }

    #[test]
    fn an_oversized_payload_is_refused_by_the_encoder() {
        let big = RawFrame::new(Opcode::Read, 1, vec![0u8; MAX_PAYLOAD + 1]);
        let mut buf = BytesMut::new();
        assert_eq!(
            encode_frame(&big, &mut buf),
            Err(FrameError::PayloadTooLarge(MAX_PAYLOAD + 1))
        );
        assert!(buf.is_empty(), "nothing written for a refused frame");
        assert_eq!(
            big.to_bytes(),
            Err(FrameError::PayloadTooLarge(MAX_PAYLOAD + 1))
        );
        let error = StationCodec::new().encode(big, &mut buf).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);

        // The largest payload goes through.
        let max = RawFrame::new(Opcode::ReadReply, 1, vec![0xA5; MAX_PAYLOAD]);
        let bytes = max.to_bytes().unwrap();
        assert_eq!(bytes.len(), MAX_FRAME);
        assert_eq!(decode_all(&mut StationCodec::new(), &bytes), vec![max]);
    }

    #[test]
    fn the_decoder_never_reserves_more_than_one_frame() {
        let max = RawFrame::new(Opcode::ReadReply, 1, vec![0x11; MAX_PAYLOAD]);
        let bytes = max.to_bytes().unwrap();
        let mut codec = StationCodec::new();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&bytes[..HEADER_LEN]);
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert!(
            buf.capacity() >= MAX_FRAME,
            "reserves what the header announced"
        );
        assert!(
            buf.capacity() <= MAX_FRAME,
            "{} > {MAX_FRAME}",
            buf.capacity()
        );

        // A header the CRC does not vouch for reserves nothing.
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0xA5, 0x5A, 0x01, 0x84, 0, 0, 0, 1, 0xFF, 0xFF, 0, 0]);
        let before = buf.capacity();
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        assert!(buf.capacity() <= before.max(HEADER_LEN));
    }

    #[test]
    fn an_unknown_opcode_is_still_a_frame() {
        let unknown = RawFrame {
            opcode: 0x42,
            request_id: 5,
            payload: Bytes::from_static(b"?"),
        };
        let decoded = decode_all(&mut StationCodec::new(), &unknown.to_bytes().unwrap());
        assert_eq!(decoded, vec![unknown.clone()]);
        assert_eq!(decoded[0].kind(), None);
        assert_eq!(
            Request::from_frame(&decoded[0]),
            Err(crate::message::PayloadError::UnknownOpcode(0x42))
        );
    }

    #[test]
    fn a_megabyte_of_noise_then_good_frames() {
        let mut rng = StdRng::seed_from_u64(0x5EED);
        let mut bytes = vec![0u8; 1 << 20];
        rng.fill(&mut bytes[..]);
        // Make the noise nastier: plenty of sync patterns and plausible headers.
        for _ in 0..2000 {
            let at = rng.gen_range(0..bytes.len() - HEADER_LEN);
            bytes[at..at + 3].copy_from_slice(&[0xA5, 0x5A, 0x01]);
        }
        let frames = frames();
        bytes.extend_from_slice(&wire(&frames));
        let mut codec = StationCodec::new();
        let mut chunks = Vec::new();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let n = rng.gen_range(1..=8192).min(rest.len());
            chunks.push(&rest[..n]);
            rest = &rest[n..];
        }
        let decoded = decode_chunks(&mut codec, chunks);
        assert_eq!(decoded, frames);
        let stats = codec.stats();
        assert!(stats.header_errors >= 2000, "{stats:?}");
        assert!(stats.skipped_bytes > 1_000_000, "{stats:?}");
    }

    fn arb_frame() -> impl Strategy<Value = RawFrame> {
        (
            any::<u8>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..80),
        )
            .prop_map(|(opcode, request_id, payload)| RawFrame {
                opcode,
                request_id,
                payload: payload.into(),
            })
    }

    proptest! {
        #[test]
        fn any_chunking_decodes_the_same_frames(
            frames in proptest::collection::vec(arb_frame(), 0..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let bytes = wire(&frames);
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            cuts.push(0);
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let chunks = cuts.windows(2).map(|w| &bytes[w[0]..w[1]]);
            let mut codec = StationCodec::new();
            prop_assert_eq!(decode_chunks(&mut codec, chunks), frames);
        }

        #[test]
        fn garbage_between_frames_never_costs_a_frame(
            parts in proptest::collection::vec(
                // Garbage without sync bytes, so it cannot make a sync with its neighbours.
                (proptest::collection::vec(any::<u8>().prop_filter("no sync byte", |b| *b != 0xA5 && *b != 0x5A), 0..20), arb_frame()),
                0..6,
            ),
            chunk in 1usize..64,
        ) {
            let mut bytes = Vec::new();
            for (garbage, frame) in &parts {
                bytes.extend_from_slice(garbage);
                bytes.extend_from_slice(&frame.to_bytes().unwrap());
            }
            let frames: Vec<RawFrame> = parts.iter().map(|(_, f)| f.clone()).collect();
            let mut codec = StationCodec::new();
            prop_assert_eq!(decode_chunks(&mut codec, bytes.chunks(chunk)), frames);
            let garbage: usize = parts.iter().map(|(g, _)| g.len()).sum();
            prop_assert_eq!(codec.stats().skipped_bytes, garbage as u64);
        }

        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut codec = StationCodec::new();
            let _ = decode_all(&mut codec, &bytes);
        }
    }
}
