//! `api/comm/i2c|uart|spi` bodies: the clients' `BusTransactionRequestBase` (`DeviceName`,
//! `Action`, `DataToSend`, `NumberOfBytesToReceive`) with `I2cTransactionRequest`'s `Address`
//! and `MaxRetries` and `UartTransactionRequest`'s line settings (`WebApiClient/Models/
//! CommModels.cs`), turned into the station's [`BusRequest`]: bytes as hex in either case,
//! `Address` and `TerminationByte` as two hex digits (or a number), the enums by name in any
//! case or by the clients' number for them. Every field but the device is checked after the
//! device is found, in the order the request is built.

use std::time::Duration;

use serde::Deserialize;
use serde::de;
use serde_json::Value as Json;
use station_protocol::bus::{
    DEFAULT_RETRIES, MAX_BUS_RECEIVE, MAX_BUS_SEND, MAX_BUS_TIMEOUT_MS, MAX_I2C_ADDRESS,
};
use station_protocol::{BusAction, BusRequest, FlowControl, Parity, UartBusType, UartLine};

use super::{RequestBody, asked_text};
use crate::body::{Deferred, Sent, said};
use crate::error::ApiError;
use crate::link::ChannelTable;
use crate::metrics::BusKind;

/// `POST api/comm/i2c`, `api/comm/uart` and `api/comm/spi`: the fields of all three; a bus
/// reads only its own. The device is checked first (`api/comm.rs` asks whether the station has
/// buses at all before), the rest after the device is found; the fields a change's audit line
/// names are kept as sent.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct BusTransactionRequest {
    pub device_name: Sent<Deferred<String>>,
    pub action: Sent<Deferred<Option<ClientEnum>>>,
    pub data_to_send: Sent<Deferred<Option<HexBytes>>>,
    pub number_of_bytes_to_receive: Sent<Deferred<Option<BusWhole>>>,
    pub address: Sent<Deferred<Option<BusByte>>>,
    pub max_retries: Deferred<Option<BusWhole>>,
    pub baud_rate: Deferred<Option<BusWhole>>,
    pub bus_type: Deferred<Option<ClientEnum>>,
    pub flow_control: Deferred<Option<ClientEnum>>,
    pub parity: Deferred<Option<ClientEnum>>,
    pub use_termination_byte: Deferred<Option<BusFlag>>,
    pub termination_byte: Deferred<Option<BusByte>>,
    pub timeout_ms: Deferred<Option<BusWhole>>,
}

impl RequestBody for BusTransactionRequest {
    /// `device=…I2C09,action=Send,address=50,data=6401,receive=8`, as sent.
    fn asked(&self) -> Option<String> {
        let parts: Vec<String> = [
            ("device", &self.device_name.text),
            ("action", &self.action.text),
            ("address", &self.address.text),
            ("data", &self.data_to_send.text),
            ("receive", &self.number_of_bytes_to_receive.text),
        ]
        .into_iter()
        .filter_map(|(key, text)| Some(format!("{key}={}", text.as_deref()?)))
        .collect();
        asked_text(&parts)
    }
}

/// The link's times a UART transaction's `TimeoutMs` must fit in.
#[derive(Debug, Clone, Copy)]
pub struct LinkTimes {
    /// `station.max_operation_ms`: the longest an operation the station times itself may take.
    pub max_operation: Duration,
}

impl LinkTimes {
    /// The longest `TimeoutMs` a UART receive may ask for, and what it is bounded by:
    /// `station.max_operation_ms`. A receive the station did not answer in time stays in doubt
    /// for its own time and `max_processing_ms` more (the link's `Session::expired`), so a lease's
    /// end waits for it however long it asked to wait.
    pub fn uart_timeout_limit(self) -> (u64, &'static str) {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        (
            ms(self.max_operation).min(u64::from(MAX_BUS_TIMEOUT_MS)),
            "the longest operation of the station (station.max_operation_ms)",
        )
    }
}

/// A UART's line settings as sent.
struct UartFields {
    baud_rate: Deferred<Option<BusWhole>>,
    bus_type: Deferred<Option<ClientEnum>>,
    flow_control: Deferred<Option<ClientEnum>>,
    parity: Deferred<Option<ClientEnum>>,
    use_termination_byte: Deferred<Option<BusFlag>>,
    termination_byte: Deferred<Option<BusByte>>,
    timeout_ms: Deferred<Option<BusWhole>>,
}

impl BusTransactionRequest {
    /// The bus request the body asks of `kind`, or a 400 naming the field at fault (404 for a
    /// device no channel is).
    pub fn into_bus_request(
        self,
        channels: &ChannelTable,
        kind: BusKind,
        times: LinkTimes,
    ) -> Result<BusRequest, ApiError> {
        let BusTransactionRequest {
            device_name: Sent { value: device, .. },
            action: Sent { value: action, .. },
            data_to_send:
                Sent {
                    value: data_to_send,
                    ..
                },
            number_of_bytes_to_receive:
                Sent {
                    value: number_of_bytes_to_receive,
                    ..
                },
            address: Sent { value: address, .. },
            max_retries,
            baud_rate,
            bus_type,
            flow_control,
            parity,
            use_termination_byte,
            termination_byte,
            timeout_ms,
        } = self;
        let device = device.checked()?;
        // A device no channel is is 404, as the clients' docs answer a channel that does not
        // exist (`docs/error-handling.md` of the .NET client: "404 Not Found: Channel, resource,
        // or config file does not exist"); one that is not this kind of bus is a bad field.
        let channel = channels.get(&device).ok_or_else(|| {
            ApiError::not_found(format!("DeviceName: no such device: {device:?}"))
        })?;
        if channel.type_flags & kind.type_flag() == 0 {
            return Err(ApiError::bad_request(format!(
                "DeviceName: {device} is not an {} bus",
                kind.label()
            )));
        }
        let action = bus_action(action.checked()?, kind)?;
        let data = data_to_send
            .checked()?
            .map_or_else(Vec::new, |HexBytes(data)| data);
        if data.len() > MAX_BUS_SEND {
            return Err(ApiError::bad_request(format!(
                "DataToSend: {} bytes is more than the {MAX_BUS_SEND} one transaction sends",
                data.len()
            )));
        }
        let sends = matches!(action, BusAction::Send | BusAction::SendReceive);
        if sends && data.is_empty() {
            return Err(ApiError::bad_request(format!(
                "DataToSend is required for {}: the hex bytes to send, e.g. \"0010\"",
                action.name()
            )));
        }
        let receive = whole_or(number_of_bytes_to_receive, 0)?;
        if receive > i64::from(MAX_BUS_RECEIVE) {
            return Err(ApiError::bad_request(format!(
                "NumberOfBytesToReceive: {receive} is more than the {MAX_BUS_RECEIVE} one \
                 transaction receives"
            )));
        }
        let receive = u16::try_from(receive).map_err(|_| {
            ApiError::bad_request(format!(
                "NumberOfBytesToReceive must be 0 or more, not {receive}"
            ))
        })?;
        let mut request = BusRequest {
            channel: device,
            action,
            address: 0,
            retries: DEFAULT_RETRIES,
            receive,
            data: data.into(),
            line: None,
        };
        match kind {
            BusKind::I2c => {
                request.address = match address.checked()? {
                    None => 0,
                    Some(BusByte(address)) => i2c_address(address)?,
                };
                let retries = whole_or(max_retries, -1)?;
                request.retries = match retries {
                    -1 => DEFAULT_RETRIES,
                    0..=254 => retries as u8,
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "MaxRetries must be -1 (the station's default) or 0 to 254, not {retries}"
                        )));
                    }
                };
            }
            BusKind::Uart => {
                let fields = UartFields {
                    baud_rate,
                    bus_type,
                    flow_control,
                    parity,
                    use_termination_byte,
                    termination_byte,
                    timeout_ms,
                };
                request.line = Some(uart_line(fields, times)?);
            }
            BusKind::Spi => {}
        }
        Ok(request)
    }
}

fn uart_line(fields: UartFields, times: LinkTimes) -> Result<UartLine, ApiError> {
    let baud = whole_or(fields.baud_rate, 9600)?;
    let baud = u32::try_from(baud).ok().filter(|b| *b > 0).ok_or_else(|| {
        ApiError::bad_request(format!("BaudRate must be above 0, e.g. 9600, not {baud}"))
    })?;
    let bus_names: Vec<&str> = UartBusType::ALL.iter().map(|b| b.name()).collect();
    let bus_type = setting(
        fields.bus_type.checked()?,
        "BusType",
        UartBusType::Rs232,
        UartBusType::parse,
        (UART_BUS_TYPES, &bus_names),
    )?;
    let flow_names: Vec<&str> = FlowControl::ALL.iter().map(|f| f.name()).collect();
    let flow_control = setting(
        fields.flow_control.checked()?,
        "FlowControl",
        FlowControl::None,
        FlowControl::parse,
        (FLOW_CONTROLS, &flow_names),
    )?;
    let parity_names: Vec<&str> = Parity::ALL.iter().map(|p| p.name()).collect();
    let parity = setting(
        fields.parity.checked()?,
        "Parity",
        Parity::None,
        Parity::parse,
        (PARITIES, &parity_names),
    )?;
    let use_termination = fields
        .use_termination_byte
        .checked()?
        .is_some_and(|BusFlag(used)| used);
    let termination_byte = fields
        .termination_byte
        .checked()?
        .map_or(b'\n', |BusByte(byte)| byte);
    let timeout = whole_or(fields.timeout_ms, 1000)?;
    // The link waits for the receive's own time on top of a request's (its allowance).
    let (most, bound) = times.uart_timeout_limit();
    let timeout_ms = u64::try_from(timeout)
        .ok()
        .filter(|t| *t <= most)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "TimeoutMs must be 0 to {most}, not {timeout}: the most is {bound}"
            ))
        })?;
    Ok(UartLine {
        baud,
        bus_type,
        flow_control,
        parity,
        use_termination,
        termination_byte,
        timeout_ms: timeout_ms as u32,
    })
}

/// A whole-number field, `default` when absent.
fn whole_or(field: Deferred<Option<BusWhole>>, default: i64) -> Result<i64, ApiError> {
    Ok(field.checked()?.map_or(default, |BusWhole(n)| n))
}

/// The action of `kind` the body asks for; `Send` (the .NET client's default) when it says
/// none (both clients always send one).
pub fn bus_action(given: Option<ClientEnum>, kind: BusKind) -> Result<BusAction, ApiError> {
    let allowed: &[BusAction] = match kind {
        BusKind::I2c => &[
            BusAction::Send,
            BusAction::Receive,
            BusAction::SendReceive,
            BusAction::Scan,
        ],
        BusKind::Uart => &[
            BusAction::Send,
            BusAction::Receive,
            BusAction::SendReceive,
            BusAction::ClearBuffers,
        ],
        BusKind::Spi => &[BusAction::Send, BusAction::Receive, BusAction::SendReceive],
    };
    let names = || {
        allowed
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(given) = given else {
        return Ok(BusAction::Send);
    };
    let given = given.name("Action", BUS_ACTIONS, &names())?;
    BusAction::parse(&given)
        .filter(|action| allowed.contains(action))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "Action: {given:?} is not among the {} actions; use one of {}",
                kind.label(),
                names()
            ))
        })
}

/// The highest 7-bit I2C address, or 400.
pub fn i2c_address(address: u8) -> Result<u8, ApiError> {
    if address > MAX_I2C_ADDRESS {
        return Err(ApiError::bad_request(format!(
            "Address {address:02X} is above 7F, the highest 7-bit I2C address"
        )));
    }
    Ok(address)
}

/// The clients' enums by number (`WebApiClient/Models/Enums.cs`, whose numbers JSON carries
/// when a caller sends the enum's value; the Python client's `enums.py` lists the same names in
/// the same order), each from 0; `Undefined` is -1 in every one of them.
pub const BUS_ACTIONS: &[&str] = &[
    "Send",
    "Receive",
    "SendReceive",
    "Scan",
    "Break",
    "ClearBuffers",
    "Reconfigure",
];
pub const UART_BUS_TYPES: &[&str] = &["RS232", "RS422", "RS485"];
pub const FLOW_CONTROLS: &[&str] = &[
    "None",
    "XON_XOFF",
    "RTS_CTS",
    "RTS_CTS_AND_XON_XOFF",
    "DTR_DSR",
    "DTR_DSR_AND_XON_XOFF",
];
pub const PARITIES: &[&str] = &["Even", "Mark", "None", "Odd", "Space"];

/// A line-setting enum field: its name in any case or the clients' number for it, `default`
/// when absent.
pub fn setting<T: Copy>(
    given: Option<ClientEnum>,
    field: &str,
    default: T,
    parse: fn(&str) -> Option<T>,
    (numbers, all): (&[&str], &[&str]),
) -> Result<T, ApiError> {
    let Some(given) = given else {
        return Ok(default);
    };
    let served = all.join(", ");
    let given = given.name(field, numbers, &served)?;
    parse(&given)
        .ok_or_else(|| ApiError::bad_request(format!("{field}: {given:?} is not one of {served}")))
}

/// An enum field as the clients send it: its name as text, or the clients' number for it
/// (what JSON carries of a .NET enum); anything else is kept to be refused with the list of
/// what is served.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientEnum {
    Name(String),
    Number(serde_json::Number),
    Neither,
}

impl ClientEnum {
    /// The name given, or the one of the clients' `numbers` for the number given; `served`
    /// lists what the gateway takes, for the error.
    pub fn name(self, field: &str, numbers: &[&str], served: &str) -> Result<String, ApiError> {
        match self {
            ClientEnum::Name(text) => Ok(text),
            ClientEnum::Number(n) => match n.as_i64() {
                Some(-1) => Ok("Undefined".to_owned()),
                Some(i) => usize::try_from(i)
                    .ok()
                    .and_then(|i| numbers.get(i))
                    .map(|name| (*name).to_owned())
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "{field}: {n} is not a number of the clients' enum (-1 to {}); use one of {served}",
                            numbers.len() - 1
                        ))
                    }),
                None => Err(ApiError::bad_request(format!(
                    "{field}: {n} is not a whole number; use one of {served}"
                ))),
            },
            ClientEnum::Neither => Err(ApiError::bad_request(format!(
                "{field} must be a name or the clients' number for it: one of {served}"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for ClientEnum {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match Json::deserialize(deserializer)? {
            Json::String(text) => ClientEnum::Name(text),
            Json::Number(n) => ClientEnum::Number(n),
            _ => ClientEnum::Neither,
        })
    }
}

/// A whole number of a bus field (may be negative, to be refused with its range): an integer,
/// or a float with no fraction below 9e15 in size; `X must be a whole number, not <value>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusWhole(pub i64);

impl<'de> Deserialize<'de> for BusWhole {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Json::deserialize(deserializer)?;
        value
            .as_i64()
            .or_else(|| {
                value
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            })
            .map(BusWhole)
            .ok_or_else(|| said("", format_args!(" must be a whole number, not {value}")))
    }
}

/// Bytes from a hex string: digits in either case, two a byte, nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HexBytes(pub Vec<u8>);

impl<'de> Deserialize<'de> for HexBytes {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Json::String(text) = Json::deserialize(deserializer)? else {
            return Err(said("", " must be a string of hex digits, e.g. \"AABB\""));
        };
        if let Some(bad) = text.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(said(
                "",
                format_args!(
                    " is not hex: {bad:?} is not a hex digit (give two digits a byte, e.g. \"AABB\")"
                ),
            ));
        }
        if text.len() % 2 != 0 {
            return Err(said(
                "",
                format_args!(
                    " has an odd number of hex digits ({}): give two digits a byte",
                    text.len()
                ),
            ));
        }
        Ok(HexBytes(
            (0..text.len())
                .step_by(2)
                .filter_map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
                .collect(),
        ))
    }
}

/// One byte given as two hex digits (`"50"`, `"0x50"`), or as a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusByte(pub u8);

impl<'de> Deserialize<'de> for BusByte {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Json::deserialize(deserializer)?;
        if let Some(n) = value.as_u64() {
            return u8::try_from(n)
                .map(BusByte)
                .map_err(|_| said("", format_args!(" must be one byte (00 to FF), not {n}")));
        }
        let text = value.as_str().unwrap_or_default();
        let digits = text
            .strip_prefix("0x")
            .or_else(|| text.strip_prefix("0X"))
            .unwrap_or(text);
        if digits.is_empty() || digits.len() > 2 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(said(
                "",
                format_args!(" must be two hex digits, e.g. \"50\", not {value}"),
            ));
        }
        u8::from_str_radix(digits, 16)
            .map(BusByte)
            .map_err(|_| said("", format_args!(" must be two hex digits, not {value}")))
    }
}

/// `true` or `false`: `X must be true or false, not <value>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusFlag(pub bool);

impl<'de> Deserialize<'de> for BusFlag {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Json::deserialize(deserializer)?;
        value
            .as_bool()
            .map(BusFlag)
            .ok_or_else(|| said("", format_args!(" must be true or false, not {value}")))
    }
}

#[cfg(test)]
mod tests;
