//! SAMPLE (`0B`): a NumericResult channel's acquisition of many samples of one target, answered
//! by a stream of reply frames (`8B`) with the samples as little-endian `f64`, then an end frame.
//!
//! SPEC.md §6.12 is the normative text. This module holds the payload encodings and the split
//! of an acquisition into frames; `message.rs` only hooks them into [`crate::Request`] and
//! [`crate::Response`].

use bytes::{BufMut, BytesMut};

use crate::frame::MAX_PAYLOAD;
use crate::wire::{PayloadError, Reader, Writer};

/// The most samples one acquisition may ask for.
pub const MAX_SAMPLES: u32 = 100_000;

/// Bytes of a data frame's payload before its samples: kind, index, count.
pub const DATA_HEADER_LEN: usize = 1 + 4 + 2;

/// The most samples one data frame can carry.
pub const MAX_FRAME_SAMPLES: usize = (MAX_PAYLOAD - DATA_HEADER_LEN) / 8;

const KIND_DATA: u8 = 1;
const KIND_END: u8 = 2;

/// SAMPLE, client to station: take `count` samples of `target` with NumericResult `channel`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRequest {
    /// The NumericResult channel, e.g. `0.1.ESH10000158.NumericResult`.
    pub channel: String,
    /// The channel it samples, one of the NumericResult channel's targets.
    pub target: String,
    /// Samples wanted, 1 to [`MAX_SAMPLES`].
    pub count: u32,
    /// The most samples per data frame; `0` means as many as fit in one frame. A client on a
    /// slow line asks for small frames so its other requests' answers wait less between them.
    pub frame_samples: u16,
}

impl SampleRequest {
    /// Samples per data frame the station uses for this request.
    pub fn samples_per_frame(&self) -> usize {
        match self.frame_samples {
            0 => MAX_FRAME_SAMPLES,
            n => usize::from(n).min(MAX_FRAME_SAMPLES),
        }
    }
}

/// How an acquisition ended: what the station really did.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleEnd {
    /// Samples sent in the data frames before this one.
    pub count: u32,
    /// The sample rate really used, samples per second.
    pub rate: f64,
    /// When the first sample was taken, microseconds since 1970-01-01T00:00:00Z (station clock).
    pub started_us: i64,
    /// The target's unit, e.g. `V`; may be empty.
    pub unit: String,
}

/// One reply frame of an acquisition.
#[derive(Debug, Clone, PartialEq)]
pub enum SamplePart {
    /// Samples `index ..` of the acquisition, in order.
    Data { index: u32, samples: Vec<f64> },
    /// The last frame: the acquisition is complete.
    End(SampleEnd),
}

impl SamplePart {
    /// Whether more frames follow this one for the same request.
    pub fn is_last(&self) -> bool {
        matches!(self, SamplePart::End(_))
    }
}

/// The data frames of `samples`, at most `per_frame` samples each (`0` or more than fit: as
/// many as fit), numbered from `first_index`.
pub fn data_parts(samples: &[f64], first_index: u32, per_frame: usize) -> Vec<SamplePart> {
    let per_frame = match per_frame {
        0 => MAX_FRAME_SAMPLES,
        n => n.min(MAX_FRAME_SAMPLES),
    };
    samples
        .chunks(per_frame)
        .enumerate()
        .map(|(i, chunk)| SamplePart::Data {
            index: first_index + (i * per_frame) as u32,
            samples: chunk.to_vec(),
        })
        .collect()
}

pub(crate) fn put_request(out: &mut BytesMut, request: &SampleRequest) {
    out.put_string(&request.channel);
    out.put_string(&request.target);
    out.put_u32(request.count);
    out.put_u16(request.frame_samples);
}

pub(crate) fn get_request(r: &mut Reader) -> Result<SampleRequest, PayloadError> {
    Ok(SampleRequest {
        channel: r.at("sample channel").string()?,
        target: r.at("sample target").string()?,
        count: r.at("sample count").u32()?,
        frame_samples: r.at("samples per frame").u16()?,
    })
}

/// Writes one reply frame's payload; `false` when a data frame holds more samples than fit.
pub(crate) fn put_part(out: &mut BytesMut, part: &SamplePart) -> bool {
    match part {
        SamplePart::Data { index, samples } => {
            if samples.len() > MAX_FRAME_SAMPLES {
                return false;
            }
            out.put_u8(KIND_DATA);
            out.put_u32(*index);
            out.put_u16(samples.len() as u16);
            for x in samples {
                out.put_f64_le(*x);
            }
        }
        SamplePart::End(end) => {
            out.put_u8(KIND_END);
            out.put_u32(end.count);
            out.put_f64(end.rate);
            out.put_i64(end.started_us);
            out.put_string(&end.unit);
        }
    }
    true
}

pub(crate) fn get_part(r: &mut Reader) -> Result<SamplePart, PayloadError> {
    Ok(match r.at("sample reply kind").u8()? {
        KIND_DATA => {
            let index = r.at("first sample index").u32()?;
            let n = usize::from(r.at("sample count").u16()?);
            let mut samples = Vec::with_capacity(n.min(MAX_FRAME_SAMPLES));
            for _ in 0..n {
                samples.push(r.at("sample").f64_le()?);
            }
            SamplePart::Data { index, samples }
        }
        KIND_END => SamplePart::End(SampleEnd {
            count: r.at("samples sent").u32()?,
            rate: r.at("sample rate").f64()?,
            started_us: r.at("start time").i64()?,
            unit: r.at("target unit").string()?,
        }),
        other => return Err(PayloadError::BadTag("sample reply kind", other)),
    })
}

/// Puts the parts of one acquisition back together, checking they come in order.
#[derive(Debug, Default)]
pub struct SampleAssembler {
    samples: Vec<f64>,
}

/// Why the reply frames of an acquisition do not make one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssemblyError {
    #[error("a data frame starts at sample {got}, but {expected} samples came before it")]
    OutOfOrder { expected: u64, got: u32 },
    #[error("the end frame counts {said} samples, but {got} came")]
    CountMismatch { said: u32, got: u64 },
}

impl SampleAssembler {
    pub fn new() -> SampleAssembler {
        SampleAssembler::default()
    }

    /// Takes one part; the samples and the end when it was the last.
    pub fn push(
        &mut self,
        part: SamplePart,
    ) -> Result<Option<(Vec<f64>, SampleEnd)>, AssemblyError> {
        match part {
            SamplePart::Data { index, samples } => {
                let expected = self.samples.len() as u64;
                if u64::from(index) != expected {
                    return Err(AssemblyError::OutOfOrder {
                        expected,
                        got: index,
                    });
                }
                self.samples.extend_from_slice(&samples);
                Ok(None)
            }
            SamplePart::End(end) => {
                let got = self.samples.len() as u64;
                if u64::from(end.count) != got {
                    return Err(AssemblyError::CountMismatch {
                        said: end.count,
                        got,
                    });
                }
                Ok(Some((std::mem::take(&mut self.samples), end)))
            }
        }
    }

    /// Samples received so far.
    pub fn received(&self) -> usize {
        self.samples.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::StationCodec;
    use crate::message::Response;
    use bytes::BytesMut;
    use tokio_util::codec::{Decoder, Encoder};

    fn acquisition(n: usize, per_frame: usize) -> (Vec<f64>, Vec<SamplePart>) {
        let samples: Vec<f64> = (0..n).map(|i| 3.3 + (i as f64) * 1e-6 - 0.5e-3).collect();
        let mut parts = data_parts(&samples, 0, per_frame);
        parts.push(SamplePart::End(SampleEnd {
            count: n as u32,
            rate: 10_000.0,
            started_us: 1_764_590_400_000_000,
            unit: "V".into(),
        }));
        (samples, parts)
    }

    #[test]
    fn the_largest_data_frame_fills_the_payload_limit() {
        let (_, parts) = acquisition(MAX_FRAME_SAMPLES + 1, 0);
        assert_eq!(parts.len(), 3, "two data frames and the end");
        let frame = Response::Sample(parts[0].clone())
            .to_frame(7)
            .expect("fits");
        assert!(frame.payload.len() <= MAX_PAYLOAD);
        assert!(
            frame.payload.len() + 8 > MAX_PAYLOAD,
            "one more sample would not fit"
        );
        let too_many = SamplePart::Data {
            index: 0,
            samples: vec![0.0; MAX_FRAME_SAMPLES + 1],
        };
        assert!(Response::Sample(too_many).to_frame(7).is_err());
    }

    #[test]
    fn samples_are_little_endian_after_the_big_endian_header() {
        let part = SamplePart::Data {
            index: 2,
            samples: vec![1.0],
        };
        let frame = Response::Sample(part).to_frame(1).expect("fits");
        assert_eq!(
            &frame.payload[..],
            &[1, 0, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F]
        );
    }

    /// The whole reply stream, cut at every byte boundary, decodes to the same parts, and
    /// the parts assemble to the samples sent.
    #[test]
    fn a_multi_frame_reply_survives_being_cut_at_every_byte() {
        let (samples, parts) = acquisition(300, 64);
        let mut wire = BytesMut::new();
        let mut codec = StationCodec::new();
        for part in &parts {
            let frame = Response::Sample(part.clone()).to_frame(42).expect("fits");
            codec.encode(frame, &mut wire).expect("encodes");
        }
        let wire = wire.freeze();
        for cut in 0..=wire.len() {
            let mut codec = StationCodec::new();
            let mut buf = BytesMut::new();
            let mut decoded = Vec::new();
            for piece in [&wire[..cut], &wire[cut..]] {
                buf.extend_from_slice(piece);
                while let Some(frame) = codec.decode(&mut buf).expect("no io error") {
                    assert_eq!(frame.request_id, 42);
                    match Response::from_frame(&frame).expect("a sample reply") {
                        Response::Sample(part) => decoded.push(part),
                        other => panic!("not a sample reply: {other:?}"),
                    }
                }
            }
            assert_eq!(decoded, parts, "cut at byte {cut}");
            let mut assembler = SampleAssembler::new();
            let mut done = None;
            for part in decoded {
                done = assembler.push(part).expect("in order");
            }
            let (got, end) = done.expect("ends with the end frame");
            assert_eq!(got, samples);
            assert_eq!(end.count, 300);
        }
    }

    #[test]
    fn the_assembler_refuses_gaps_and_wrong_counts() {
        let mut a = SampleAssembler::new();
        let gap = SamplePart::Data {
            index: 5,
            samples: vec![1.0],
        };
        assert!(matches!(a.push(gap), Err(AssemblyError::OutOfOrder { .. })));
        let mut a = SampleAssembler::new();
        let end = SamplePart::End(SampleEnd {
            count: 1,
            rate: 1.0,
            started_us: 0,
            unit: String::new(),
        });
        assert!(matches!(
            a.push(end),
            Err(AssemblyError::CountMismatch { .. })
        ));
    }
}
