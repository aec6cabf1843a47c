//! The BUS operation (opcode `0A`): one transaction on a station's I2C, UART or SPI bus, and
//! its payload encoding (SPEC.md §6.11).
//!
//! The codec carries every field as it is; [`BusRequest::check`] says whether a request is
//! within the protocol's limits (a station answers one that is not with ERROR `bad value`).

use bytes::{BufMut, Bytes, BytesMut};

use crate::wire::{PayloadError, Reader, Writer};

/// The most bytes one transaction sends.
pub const MAX_BUS_SEND: usize = 4096;
/// The most bytes one transaction asks to receive.
pub const MAX_BUS_RECEIVE: u16 = 4096;
/// The highest 7-bit I2C address.
pub const MAX_I2C_ADDRESS: u8 = 0x7F;
/// The longest UART receive timeout, in milliseconds.
pub const MAX_BUS_TIMEOUT_MS: u32 = 60_000;
/// The retry byte that asks for the station's own retry limit.
pub const DEFAULT_RETRIES: u8 = 0xFF;

/// Defines a `u8`-tagged enum with its wire tag, its name as the REST contract spells it, and
/// a case-insensitive parse of that name.
macro_rules! tagged {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $tag:literal, $text:literal;)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $($variant = $tag,)+
        }

        impl $name {
            /// Every variant in tag order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub fn from_u8(tag: u8) -> Option<$name> {
                match tag {
                    $($tag => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// As the REST contract spells it.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The variant named `text` (ASCII case-insensitive).
            pub fn parse(text: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| v.name().eq_ignore_ascii_case(text))
            }
        }
    };
}

tagged!(
    /// What a bus transaction does.
    BusAction {
        Send = 1, "Send";
        Receive = 2, "Receive";
        SendReceive = 3, "SendReceive";
        Scan = 4, "Scan";
        ClearBuffers = 5, "ClearBuffers";
    }
);

tagged!(
    /// A UART's electrical standard.
    UartBusType {
        Rs232 = 1, "RS232";
        Rs422 = 2, "RS422";
        Rs485 = 3, "RS485";
    }
);

tagged!(
    /// A UART's flow control.
    FlowControl {
        None = 1, "None";
        XonXoff = 2, "XON_XOFF";
        RtsCts = 3, "RTS_CTS";
        RtsCtsAndXonXoff = 4, "RTS_CTS_AND_XON_XOFF";
        DtrDsr = 5, "DTR_DSR";
        DtrDsrAndXonXoff = 6, "DTR_DSR_AND_XON_XOFF";
    }
);

tagged!(
    /// A UART's parity.
    Parity {
        None = 1, "None";
        Even = 2, "Even";
        Odd = 3, "Odd";
        Mark = 4, "Mark";
        Space = 5, "Space";
    }
);

/// A UART's line settings for one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UartLine {
    pub baud: u32,
    pub bus_type: UartBusType,
    pub flow_control: FlowControl,
    pub parity: Parity,
    /// Whether a receive ends at `termination_byte` (inclusive).
    pub use_termination: bool,
    pub termination_byte: u8,
    /// How long a receive waits for the bytes asked for.
    pub timeout_ms: u32,
}

/// One bus transaction, client to station.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusRequest {
    /// The bus channel, e.g. `0.ESH10000023.I2C09`.
    pub channel: String,
    pub action: BusAction,
    /// The 7-bit I2C address; 0 on other buses.
    pub address: u8,
    /// Attempts after a NAK before giving up; [`DEFAULT_RETRIES`] for the station's own limit.
    pub retries: u8,
    /// Bytes asked for (Receive, SendReceive).
    pub receive: u16,
    /// Bytes sent (Send, SendReceive).
    pub data: Bytes,
    /// A UART's line settings; `None` on other buses.
    pub line: Option<UartLine>,
}

impl BusRequest {
    /// Whether the request is within the protocol's limits; why not, for a person.
    pub fn check(&self) -> Result<(), String> {
        if self.address > MAX_I2C_ADDRESS {
            return Err(format!(
                "address 0x{:02X} is above the highest 7-bit address 0x7F",
                self.address
            ));
        }
        if self.data.len() > MAX_BUS_SEND {
            return Err(format!(
                "{} bytes to send is more than the {MAX_BUS_SEND} one transaction carries",
                self.data.len()
            ));
        }
        if self.receive > MAX_BUS_RECEIVE {
            return Err(format!(
                "{} bytes to receive is more than the {MAX_BUS_RECEIVE} one transaction carries",
                self.receive
            ));
        }
        if let Some(line) = &self.line
            && line.timeout_ms > MAX_BUS_TIMEOUT_MS
        {
            return Err(format!(
                "a timeout of {} ms is longer than the {MAX_BUS_TIMEOUT_MS} ms limit",
                line.timeout_ms
            ));
        }
        Ok(())
    }
}

pub(crate) fn put_bus_request(out: &mut BytesMut, request: &BusRequest) {
    out.put_string(&request.channel);
    out.put_u8(request.action as u8);
    out.put_u8(request.address);
    out.put_u8(request.retries);
    out.put_u16(request.receive);
    out.put_blob(&request.data);
    match &request.line {
        None => out.put_u8(0),
        Some(line) => {
            out.put_u8(1);
            out.put_u32(line.baud);
            out.put_u8(line.bus_type as u8);
            out.put_u8(line.flow_control as u8);
            out.put_u8(line.parity as u8);
            out.put_u8(u8::from(line.use_termination));
            out.put_u8(line.termination_byte);
            out.put_u32(line.timeout_ms);
        }
    }
}

fn tag<T>(
    r: &mut Reader,
    field: &'static str,
    from: fn(u8) -> Option<T>,
) -> Result<T, PayloadError> {
    let byte = r.at(field).u8()?;
    from(byte).ok_or(PayloadError::BadTag(field, byte))
}

pub(crate) fn get_bus_request(r: &mut Reader) -> Result<BusRequest, PayloadError> {
    let channel = r.at("bus channel").string()?;
    let action = tag(r, "bus action", BusAction::from_u8)?;
    let address = r.at("bus address").u8()?;
    let retries = r.at("bus retries").u8()?;
    let receive = r.at("bus receive count").u16()?;
    let data = r.at("bus data").bytes()?;
    let line = match r.at("bus line tag").u8()? {
        0 => None,
        1 => Some(UartLine {
            baud: r.at("uart baud rate").u32()?,
            bus_type: tag(r, "uart bus type", UartBusType::from_u8)?,
            flow_control: tag(r, "uart flow control", FlowControl::from_u8)?,
            parity: tag(r, "uart parity", Parity::from_u8)?,
            use_termination: r.at("uart termination flag").bool()?,
            termination_byte: r.at("uart termination byte").u8()?,
            timeout_ms: r.at("uart timeout").u32()?,
        }),
        other => return Err(PayloadError::BadTag("bus line tag", other)),
    };
    Ok(BusRequest {
        channel,
        action,
        address,
        retries,
        receive,
        data,
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Opcode, RawFrame};
    use crate::message::{Request, Response};

    fn uart() -> BusRequest {
        BusRequest {
            channel: "U".into(),
            action: BusAction::SendReceive,
            address: 0,
            retries: DEFAULT_RETRIES,
            receive: 64,
            data: Bytes::from_static(b"*IDN?\n"),
            line: Some(UartLine {
                baud: 9600,
                bus_type: UartBusType::Rs232,
                flow_control: FlowControl::None,
                parity: Parity::None,
                use_termination: true,
                termination_byte: b'\n',
                timeout_ms: 1000,
            }),
        }
    }

    fn i2c() -> BusRequest {
        BusRequest {
            channel: "I".into(),
            action: BusAction::Scan,
            address: 0x50,
            retries: 3,
            receive: 0,
            data: Bytes::new(),
            line: None,
        }
    }

    #[test]
    fn the_payload_is_laid_out_as_the_spec_says() {
        let frame = Request::Bus(i2c()).to_frame(1).unwrap();
        assert_eq!(frame.opcode, 0x0A);
        assert_eq!(&frame.payload[..], &[0, 1, b'I', 4, 0x50, 3, 0, 0, 0, 0, 0]);
        let frame = Request::Bus(uart()).to_frame(1).unwrap();
        let mut want = vec![0, 1, b'U', 3, 0, 0xFF, 0, 64, 0, 6];
        want.extend_from_slice(b"*IDN?\n");
        want.extend_from_slice(&[1, 0, 0, 0x25, 0x80, 1, 1, 1, 1, 0x0A, 0, 0, 0x03, 0xE8]);
        assert_eq!(&frame.payload[..], &want[..]);
        let reply = Response::Bus(Bytes::from_static(&[0x48, 0x50]))
            .to_frame(1)
            .unwrap();
        assert_eq!(reply.opcode, 0x8A);
        assert_eq!(&reply.payload[..], &[0, 2, 0x48, 0x50]);
    }

    #[test]
    fn every_cut_of_a_bus_request_is_truncated_and_every_bad_tag_named() {
        for request in [uart(), i2c()] {
            let whole = Request::Bus(request).to_frame(1).unwrap();
            for cut in 0..whole.payload.len() {
                let short = RawFrame {
                    payload: whole.payload.slice(..cut),
                    ..whole.clone()
                };
                assert!(
                    matches!(Request::from_frame(&short), Err(PayloadError::Truncated(_))),
                    "cut at {cut}"
                );
            }
        }
        let payload = |action: u8, line: &[u8]| {
            let mut p = vec![0, 1, b'U', action, 0, 0xFF, 0, 0, 0, 0];
            p.extend_from_slice(line);
            Request::from_frame(&RawFrame::new(Opcode::Bus, 1, p))
        };
        assert_eq!(payload(0, &[0]), Err(PayloadError::BadTag("bus action", 0)));
        assert_eq!(payload(6, &[0]), Err(PayloadError::BadTag("bus action", 6)));
        assert_eq!(
            payload(1, &[2]),
            Err(PayloadError::BadTag("bus line tag", 2))
        );
        let line = |bus: u8, flow: u8, parity: u8, flag: u8| {
            payload(
                1,
                &[
                    1, 0, 0, 0x25, 0x80, bus, flow, parity, flag, 0x0A, 0, 0, 0, 1,
                ],
            )
        };
        assert!(line(1, 1, 1, 0).is_ok());
        assert_eq!(
            line(4, 1, 1, 0),
            Err(PayloadError::BadTag("uart bus type", 4))
        );
        assert_eq!(
            line(1, 7, 1, 0),
            Err(PayloadError::BadTag("uart flow control", 7))
        );
        assert_eq!(
            line(1, 1, 6, 0),
            Err(PayloadError::BadTag("uart parity", 6))
        );
        assert_eq!(
            line(1, 1, 1, 2),
            Err(PayloadError::BadTag("uart termination flag", 2))
        );
        assert_eq!(payload(1, &[0, 9]), Err(PayloadError::TrailingBytes(1)));
    }

    #[test]
    fn limits_are_checked_at_their_boundaries() {
        let mut request = i2c();
        request.address = MAX_I2C_ADDRESS;
        request.receive = MAX_BUS_RECEIVE;
        request.data = Bytes::from(vec![0; MAX_BUS_SEND]);
        assert_eq!(request.check(), Ok(()));
        // The codec carries out-of-limit values as they are; check() refuses them.
        for change in 0..3 {
            let mut over = request.clone();
            match change {
                0 => over.address = MAX_I2C_ADDRESS + 1,
                1 => over.receive = MAX_BUS_RECEIVE + 1,
                _ => over.data = Bytes::from(vec![0; MAX_BUS_SEND + 1]),
            }
            let error = over.check().unwrap_err();
            assert!(!error.is_empty());
            let frame = Request::Bus(over.clone()).to_frame(1).unwrap();
            assert_eq!(Request::from_frame(&frame), Ok(Request::Bus(over)));
        }
        let mut line = uart();
        line.line.as_mut().unwrap().timeout_ms = MAX_BUS_TIMEOUT_MS;
        assert_eq!(line.check(), Ok(()));
        line.line.as_mut().unwrap().timeout_ms = MAX_BUS_TIMEOUT_MS + 1;
        assert!(line.check().unwrap_err().contains("60000"));
    }

    #[test]
    fn names_parse_case_insensitively_and_round_trip() {
        for action in BusAction::ALL {
            assert_eq!(BusAction::from_u8(*action as u8), Some(*action));
            assert_eq!(
                BusAction::parse(&action.name().to_lowercase()),
                Some(*action)
            );
        }
        assert_eq!(
            BusAction::parse("sendreceive"),
            Some(BusAction::SendReceive)
        );
        assert_eq!(BusAction::parse("Break"), None);
        assert_eq!(FlowControl::parse("rts_cts"), Some(FlowControl::RtsCts));
        assert_eq!(Parity::parse("EVEN"), Some(Parity::Even));
        assert_eq!(UartBusType::parse("rs485"), Some(UartBusType::Rs485));
    }
}
