//! One example frame of every kind, and the hex dump format `SPEC.md` shows them in.
//!
//! `examples/spec_frames.rs` prints these dumps; a test below checks that every dump in
//! `SPEC.md` is exactly what this code produces, so the specification cannot drift from it.

use crate::bus::{
    BusAction, BusRequest, DEFAULT_RETRIES, FlowControl, Parity, UartBusType, UartLine,
};
use crate::configure::{ChannelConfig, Configure, ConfigureReply};
use crate::frame::{FrameError, HEADER_LEN, RawFrame, TRAILER_LEN};
use crate::message::{
    ChangeType, ChannelDescriptor, Direction, ErrorCode, Hello, HelloReply, ModuleInfo, Notify,
    Request, Response, StationError,
};
use crate::sample::{SampleEnd, SamplePart, SampleRequest};
use crate::value::{Value, ValueType};

/// A message to show as an example frame.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecMessage {
    Request(Request),
    Response(Response),
}

/// One example: the name that tags its dump in `SPEC.md`, its request id and its message.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecExample {
    pub name: &'static str,
    pub request_id: u32,
    pub message: SpecMessage,
}

impl SpecExample {
    /// The example as a frame.
    pub fn frame(&self) -> Result<RawFrame, FrameError> {
        match &self.message {
            SpecMessage::Request(request) => request.to_frame(self.request_id),
            SpecMessage::Response(response) => response.to_frame(self.request_id),
        }
    }

    /// The frame's bytes as `SPEC.md` shows them.
    pub fn dump(&self) -> Result<String, FrameError> {
        Ok(hex_dump(&self.frame()?.to_bytes()?))
    }
}

/// A frame's wire bytes as lower-case hex: the 12 header bytes on a line of their own, the
/// payload 16 bytes a line, then the 4 frame CRC bytes; each line labelled.
pub fn hex_dump(wire: &[u8]) -> String {
    fn hex(bytes: &[u8]) -> String {
        bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
    let payload_end = wire.len().saturating_sub(TRAILER_LEN).max(HEADER_LEN);
    let header = &wire[..HEADER_LEN.min(wire.len())];
    let payload = &wire[header.len()..payload_end.min(wire.len())];
    let trailer = &wire[payload_end.min(wire.len())..];
    let mut out = format!("header   {}\n", hex(header));
    for (i, line) in payload.chunks(16).enumerate() {
        let label = if i == 0 { "payload" } else { "" };
        out.push_str(&format!("{label:<8} {}\n", hex(line)));
    }
    out.push_str(&format!("crc      {}\n", hex(trailer)));
    out
}

/// Reads a dump made by [`hex_dump`] back into bytes: every token after a line's label.
pub fn parse_dump(dump: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for line in dump.lines() {
        let mut tokens = line.split_whitespace().peekable();
        if tokens
            .peek()
            .is_some_and(|t| matches!(*t, "header" | "payload" | "crc"))
        {
            tokens.next();
        }
        for token in tokens {
            if token.len() != 2 {
                return None;
            }
            out.push(u8::from_str_radix(token, 16).ok()?);
        }
    }
    Some(out)
}

fn channel(
    name: &str,
    type_flags: u32,
    direction: Direction,
    unit: &str,
    writable: bool,
    value_type: ValueType,
) -> ChannelDescriptor {
    ChannelDescriptor {
        name: name.to_owned(),
        alias: String::new(),
        net_name: String::new(),
        type_flags,
        direction,
        unit: unit.to_owned(),
        description: String::new(),
        group: String::new(),
        readable: true,
        writable,
        consuming: false,
        value_type,
        options: Vec::new(),
    }
}

/// One example of every frame kind, requests first, in the order `SPEC.md` shows them.
pub fn spec_examples() -> Vec<SpecExample> {
    use SpecMessage::{Request as Req, Response as Res};
    let ex = |name, request_id, message| SpecExample {
        name,
        request_id,
        message,
    };
    let vset = "0.4.ESH10000662.VSET1".to_owned();
    let mut vset_channel = channel(&vset, 1, Direction::Out, "V", true, ValueType::Float);
    vset_channel.alias = "HV1 set".to_owned();
    vset_channel.net_name = "HV1_VSET".to_owned();
    vset_channel.description = "Output 1 voltage set point".to_owned();
    vset_channel.group = "HV4".to_owned();
    let mut led = channel(
        "0.11.ESH10000355.A1",
        2,
        Direction::Out,
        "",
        true,
        ValueType::Enum,
    );
    led.options = vec!["Black".to_owned(), "Red".to_owned()];
    let mut uart = channel(
        "0.ESH10000023.UART01",
        8192 | 65536,
        Direction::InOut,
        "",
        true,
        ValueType::String,
    );
    uart.consuming = true;
    vec![
        ex(
            "HELLO",
            1,
            Req(Request::Hello(Hello {
                version: 1,
                client: "station-cli".to_owned(),
            })),
        ),
        ex("SYSTEM", 2, Req(Request::System)),
        ex(
            "LIST",
            3,
            Req(Request::List {
                offset: 0,
                limit: 100,
            }),
        ),
        ex(
            "READ",
            4,
            Req(Request::Read {
                names: vec![
                    "0.1.ESH10000158.MON_3V3".to_owned(),
                    "No.Such.Channel".to_owned(),
                ],
            }),
        ),
        ex(
            "WRITE",
            5,
            Req(Request::Write {
                items: vec![
                    (vset.clone(), Value::Float(500.0)),
                    ("0.4.ESH10000662.ON1".to_owned(), Value::Bool(true)),
                ],
            }),
        ),
        ex(
            "TRANSACT",
            6,
            Req(Request::Transact {
                name: "0.ESH10000023.UART01".to_owned(),
                value: Value::String("*IDN?\n".to_owned()),
            }),
        ),
        ex(
            "PING",
            7,
            Req(Request::Ping {
                nonce: 0x0123_4567_89AB_CDEF,
            }),
        ),
        ex(
            "HELLO_REPLY",
            1,
            Res(Response::Hello(HelloReply {
                version: 1,
                station: "station-sim".to_owned(),
                firmware: "6.4.2".to_owned(),
                serial: "SIM0001".to_owned(),
                window: 8,
            })),
        ),
        ex(
            "SYSTEM_REPLY",
            2,
            Res(Response::System(vec![
                ModuleInfo {
                    index: 1,
                    name: "AGENT Q2 Base".to_owned(),
                    product_id: "ESH10000158".to_owned(),
                    revision: 3,
                    serial: "158-0042".to_owned(),
                },
                ModuleInfo {
                    index: 4,
                    name: "HV4 high-voltage supply".to_owned(),
                    product_id: "ESH10000662".to_owned(),
                    revision: 7,
                    serial: "662-0107".to_owned(),
                },
            ])),
        ),
        ex(
            "LIST_REPLY",
            3,
            Res(Response::List {
                total: 57,
                offset: 0,
                channels: vec![vset_channel, led, uart],
            }),
        ),
        ex(
            "READ_REPLY",
            4,
            Res(Response::Read(vec![
                Ok(Value::Float(3.301)),
                Err(StationError::new(
                    ErrorCode::UnknownChannel,
                    "no channel No.Such.Channel",
                )),
            ])),
        ),
        ex(
            "READ_REPLY_VALUES",
            9,
            Res(Response::Read(vec![
                Ok(Value::Integer(-7)),
                Ok(Value::Enum("Red".to_owned())),
                Ok(Value::Bytes(bytes::Bytes::from_static(&[0xDE, 0xAD]))),
            ])),
        ),
        ex(
            "WRITE_REPLY",
            5,
            Res(Response::Write(vec![
                Ok(()),
                Err(StationError::new(ErrorCode::Locked, "ON1 is interlocked")),
            ])),
        ),
        ex(
            "TRANSACT_REPLY",
            6,
            Res(Response::Transact(Value::String(
                "SIM,HV4,0001,6.4.2\n".to_owned(),
            ))),
        ),
        ex(
            "PING_REPLY",
            7,
            Res(Response::Ping {
                nonce: 0x0123_4567_89AB_CDEF,
            }),
        ),
        ex(
            "NOTIFY_CONFIGURATION_CHANGED",
            0,
            Res(Response::Notify(Notify::ConfigurationChanged {
                change: ChangeType::Added,
                message: "1 channel added".to_owned(),
            })),
        ),
        ex(
            "NOTIFY_OUTPUT_TRIPPED",
            0,
            Res(Response::Notify(Notify::OutputTripped {
                channel: "0.4.ESH10000662.ON1".to_owned(),
                message: "IMON1 above ISET1".to_owned(),
            })),
        ),
        ex(
            "ERROR",
            8,
            Res(Response::Error(StationError::new(
                ErrorCode::Busy,
                "station busy",
            ))),
        ),
        // RESET (§6.10), appended.
        ex(
            "RESET",
            9,
            Req(Request::Reset(crate::reset::Reset {
                requester: "station-gateway".to_owned(),
            })),
        ),
        ex("RESET_REPLY", 9, Res(Response::Reset)),
        ex(
            "CONFIGURE",
            12,
            Req(Request::Configure(Configure {
                name: vset.clone(),
                settings: vec![
                    ("unit".to_owned(), Value::String("kV".to_owned())),
                    ("detail.Gain".to_owned(), Value::Float(2.0)),
                ],
            })),
        ),
        ex(
            "CONFIGURE_REPLY",
            12,
            Res(Response::Configure(Box::new(ConfigureReply {
                channel: {
                    let mut configured =
                        channel(&vset, 1, Direction::Out, "kV", true, ValueType::Float);
                    configured.net_name = "HV1_VSET".to_owned();
                    configured
                },
                config: ChannelConfig {
                    enabled: true,
                    capability: Direction::Out,
                    type_capability: 1,
                    device: "0.4.ESH10000662".to_owned(),
                    limits: Some((0.0, 3000.0)),
                    details: vec![("Gain".to_owned(), Value::Float(2.0))],
                },
            }))),
        ),
        ex(
            "SAMPLE",
            10,
            Req(Request::Sample(SampleRequest {
                channel: "0.1.ESH10000158.NumericResult".to_owned(),
                target: "0.1.ESH10000158.MON_3V3".to_owned(),
                count: 3,
                frame_samples: 2,
            })),
        ),
        ex(
            "SAMPLE_REPLY_DATA",
            10,
            Res(Response::Sample(SamplePart::Data {
                index: 0,
                samples: vec![3.301, 3.299],
            })),
        ),
        ex(
            "SAMPLE_REPLY_END",
            10,
            Res(Response::Sample(SamplePart::End(SampleEnd {
                count: 3,
                rate: 10_000.0,
                started_us: 1_764_590_400_000_000,
                unit: "V".to_owned(),
            }))),
        ),
        ex(
            "BUS",
            10,
            Req(Request::Bus(BusRequest {
                channel: "0.ESH10000023.I2C09".to_owned(),
                action: BusAction::SendReceive,
                address: 0x50,
                retries: DEFAULT_RETRIES,
                receive: 4,
                data: bytes::Bytes::from_static(&[0x10]),
                line: None,
            })),
        ),
        ex(
            "BUS_UART",
            11,
            Req(Request::Bus(BusRequest {
                channel: "0.ESH10000023.UART01".to_owned(),
                action: BusAction::SendReceive,
                address: 0,
                retries: DEFAULT_RETRIES,
                receive: 64,
                data: bytes::Bytes::from_static(b"*IDN?\n"),
                line: Some(UartLine {
                    baud: 9600,
                    bus_type: UartBusType::Rs232,
                    flow_control: FlowControl::None,
                    parity: Parity::None,
                    use_termination: true,
                    termination_byte: b'\n',
                    timeout_ms: 1000,
                }),
            })),
        ),
        ex(
            "BUS_REPLY",
            10,
            Res(Response::Bus(bytes::Bytes::from_static(&[
                0xDE, 0xAD, 0xBE, 0xEF,
            ]))),
        ),
        ex(
            "BUS_ERROR",
            12,
            Res(Response::Error(StationError::new(
                ErrorCode::Nak,
                "no device acknowledged address 0x51",
            ))),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::StationCodec;
    use bytes::BytesMut;
    use tokio_util::codec::Decoder;

    const SPEC: &str = include_str!("../SPEC.md");

    /// Every fenced block whose info string is `hex NAME`, as (NAME, body).
    fn spec_dumps() -> Vec<(String, String)> {
        let mut dumps = Vec::new();
        let mut lines = SPEC.lines();
        while let Some(line) = lines.next() {
            let Some(name) = line.strip_prefix("```hex ") else {
                continue;
            };
            let mut body = String::new();
            for line in lines.by_ref() {
                if line.starts_with("```") {
                    break;
                }
                body.push_str(line);
                body.push('\n');
            }
            dumps.push((name.trim().to_owned(), body));
        }
        dumps
    }

    #[test]
    fn spec_dumps_match_the_code() {
        let examples = spec_examples();
        let dumps = spec_dumps();
        let names: Vec<&str> = dumps.iter().map(|(name, _)| name.as_str()).collect();
        let wanted: Vec<&str> = examples.iter().map(|e| e.name).collect();
        assert_eq!(names, wanted, "SPEC.md's hex blocks, in order");
        for (example, (_, body)) in examples.iter().zip(&dumps) {
            assert_eq!(
                body,
                &example.dump().unwrap(),
                "SPEC.md's dump of {} is stale: run `cargo run -p station-protocol --example spec_frames`",
                example.name
            );
        }
    }

    #[test]
    fn spec_dumps_decode_to_their_messages() {
        for (name, body) in spec_dumps() {
            let example = spec_examples()
                .into_iter()
                .find(|e| e.name == name)
                .unwrap();
            let mut wire = BytesMut::from(&parse_dump(&body).unwrap()[..]);
            let frame = StationCodec::new().decode(&mut wire).unwrap().unwrap();
            assert!(wire.is_empty(), "{name}: bytes left after the frame");
            assert_eq!(frame.request_id, example.request_id, "{name}");
            let decoded = match &example.message {
                SpecMessage::Request(_) => {
                    SpecMessage::Request(Request::from_frame(&frame).unwrap())
                }
                SpecMessage::Response(_) => {
                    SpecMessage::Response(Response::from_frame(&frame).unwrap())
                }
            };
            assert_eq!(decoded, example.message, "{name}");
        }
    }

    #[test]
    fn every_opcode_has_an_example() {
        use crate::frame::Opcode;
        let opcodes: Vec<u8> = spec_examples()
            .iter()
            .map(|e| e.frame().unwrap().opcode)
            .collect();
        for byte in 0..=u8::MAX {
            if Opcode::from_u8(byte).is_some() {
                assert!(opcodes.contains(&byte), "no example of opcode {byte:#04x}");
            }
        }
    }

    #[test]
    fn dump_reads_back() {
        let wire: Vec<u8> = (0..=40).collect();
        assert_eq!(parse_dump(&hex_dump(&wire)), Some(wire));
    }
}
